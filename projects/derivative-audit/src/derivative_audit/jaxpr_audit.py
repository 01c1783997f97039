"""Stage 3: walk a program's jaxpr, recursively, and audit what it contains.

`audit(fn, args, policy)` traces `fn` with `jax.make_jaxpr`, walks every
equation, including those inside `jit`, `scan`, `cond` (every branch),
`while` (condition and body), `custom_jvp_call` and `custom_vjp_call`, and
returns an `Audit`: every equation with its nesting path, output shapes and
dtypes and source location; primitive counts; and the `Finding`s that reject
the program under the `Policy`.

A custom rule is a program too: when JAX differentiates a `custom_jvp` it runs
the JVP rule instead of the body, for a `custom_vjp` the forward and backward
rules. None of them is in the traced jaxpr (the equation holds only the
functions that trace them), so `walk_rules` traces each one on the equation's
own shapes and walks it like the program: the rules of every custom call at
any depth (inside `jit`, `scan`, a branch, another rule). Their equations are
`Audit.rule_equations` (paths like `jit.jaxpr/custom_vjp_call.bwd_rule`) and
are judged by the same rules below, except `mode-unsupported`: JAX evaluates
a rule, it does not differentiate it, for a first derivative. The rules:

- `unknown-primitive`: not in the documented table (`primitives.TABLE`);
- `host-callback`: Python called back on the host (not differentiable);
- `mode-unsupported`: a mode the policy requires that the primitive lacks,
  e.g. reverse mode through an unbounded `while` loop. Equations inside a
  custom rule's call are not differentiated by JAX (the rule is), so there a
  `while` is fine: that is how implicit differentiation escapes the limit;
- `dtype-policy`: a float64 (or complex128) value under a float32 policy;
- `random-in-deterministic`: random bits drawn in a function declared deterministic.
"""

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core
from jax.extend import source_info_util

from derivative_audit import primitives


class AuditInputError(ValueError):
    """A function the audit cannot trace; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the audited program must satisfy."""

    modes: tuple[str, ...] = ("jvp", "vjp")  # differentiation modes it must support
    float_dtype: str | None = None  # "float32": no float64 value anywhere; None: no rule
    deterministic: bool = True  # no random bits may be drawn

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in ("jvp", "vjp")]
        if bad:
            raise ValueError(f"Unknown differentiation mode `{bad[0]}`; use `jvp` and/or `vjp`.")
        if self.float_dtype not in (None, "float32", "float64"):
            raise ValueError(
                f"Unknown float policy `{self.float_dtype}`; use `float32`, `float64` or none."
            )


@dataclasses.dataclass(frozen=True)
class Equation:
    """One equation of the program, wherever it is nested."""

    primitive: str
    path: str  # the enclosing primitives and sub-program names, "" at top level
    outputs: tuple[str, ...]  # shape and dtype of each output, e.g. "float32[8]"
    source: str  # "file:line:column (function)" of the user code that emitted it
    differentiated: bool  # False inside a custom rule's call: JAX does not differentiate it


@dataclasses.dataclass(frozen=True)
class Finding:
    """One reason to reject the program."""

    rule: str
    primitive: str
    path: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Audit:
    """The result of `audit`."""

    policy: Policy
    equations: tuple[Equation, ...]
    findings: tuple[Finding, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rule_equations: tuple[Equation, ...] = ()  # inside the custom rules (`walk_rules`)

    @property
    def accepted(self) -> bool:
        return not self.findings

    @property
    def counts(self) -> dict[str, int]:
        """Primitive counts of the program itself (what `make_jaxpr` prints)."""
        return dict(sorted(collections.Counter(e.primitive for e in self.equations).items()))

    @property
    def rule_counts(self) -> dict[str, int]:
        """Primitive counts inside the custom derivative rules."""
        return dict(sorted(collections.Counter(e.primitive for e in self.rule_equations).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "accepted" if self.accepted else "rejected",
            "policy": dataclasses.asdict(self.policy),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "counts": self.counts,
            "rule_counts": self.rule_counts,
            "primitives": {
                name: {
                    "summary": primitives.TABLE[name].summary,
                    "modes": sorted(primitives.TABLE[name].modes),
                    "note": primitives.TABLE[name].note,
                }
                for name in {**self.counts, **self.rule_counts}
                if name in primitives.TABLE
            },
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "equations": [dataclasses.asdict(e) for e in self.equations],
            "rule_equations": [dataclasses.asdict(e) for e in self.rule_equations],
        }


def describe_aval(aval: Any) -> str:
    """`float32[3,4]` for an array, the aval's own text otherwise."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return str(aval)
    name = str(dtype) if str(dtype).startswith("key") else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


def sub_jaxprs(params: dict[str, Any]) -> list[tuple[str, jex_core.Jaxpr]]:
    """The sub-programs held in an equation's params, named by param (and index).

    Cases, in params order:
        a `ClosedJaxpr` under key `k` -> `(k, its .jaxpr)` [claim:sub-jaxprs-closed]
        a `Jaxpr` under key `k` -> `(k, it)` [claim:sub-jaxprs-open]
        a tuple or list under key `k` -> one entry per jaxpr item, named `k[i]`
            by its index in the sequence (`cond`'s `branches[0]`, `branches[1]`)
            [claim:sub-jaxprs-indexed]
        anything else -> nothing [claim:sub-jaxprs-nothing-else]
    """
    found: list[tuple[str, jex_core.Jaxpr]] = []
    # --- exercise stage 3: Collect (param name, Jaxpr) for every jaxpr held in params. ---
    for key, value in params.items():
        items = list(enumerate(value)) if isinstance(value, tuple | list) else [(None, value)]
        for index, item in items:
            name = key if index is None else f"{key}[{index}]"
            if isinstance(item, jex_core.ClosedJaxpr):
                found.append((name, item.jaxpr))
            elif isinstance(item, jex_core.Jaxpr):
                found.append((name, item))
    # --- end exercise ---
    return found


def walk(
    jaxpr: jex_core.Jaxpr, path: str = "", differentiated: bool = True, outer_source: str = ""
) -> list[Equation]:
    """Every equation of `jaxpr` and of its sub-programs, depth first, in program order.
    [claim:walk-depth-first-order]

    An equation emitted inside a library (no user frame in its traceback) takes
    the source of the user-code equation that encloses it. [claim:walk-library-source]

    Cases:
        path -> "" at the top; a sub-program of equation `name` under param `p` gets
            "<name>.<p>", nested ones "<outer path>/<name>.<p>" (`scan.jaxpr`,
            `jit.jaxpr/cond.branches[1]`) [claim:walk-nesting-paths]
        differentiated -> inherited, except that everything below a
            `custom_jvp_call` or `custom_vjp_call` (`primitives.CUSTOM_RULE_PRIMITIVES`)
            is not differentiated by JAX: its rules stand in for it
            [claim:walk-differentiated-inherited]
        outputs -> `describe_aval` of each output variable's aval [claim:walk-output-avals]
    """
    equations: list[Equation] = []
    # --- exercise stage 3: Record each equation, then recurse into its sub-jaxprs. ---
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        source = source_info_util.summarize(eqn.source_info) or outer_source
        equations.append(
            Equation(
                primitive=name,
                path=path,
                outputs=tuple(describe_aval(v.aval) for v in eqn.outvars),
                source=source,
                differentiated=differentiated,
            )
        )
        inner = differentiated and name not in primitives.CUSTOM_RULE_PRIMITIVES
        for param, sub in sub_jaxprs(eqn.params):
            where = f"{path}/{name}.{param}" if path else f"{name}.{param}"
            equations.extend(walk(sub, where, inner, source))
    # --- end exercise ---
    return equations


def _has_tangent(aval: Any) -> bool:
    """Whether a value of this aval carries a tangent (a float or complex array)."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)


def _rule_key(eqn: jex_core.JaxprEqn) -> tuple:
    """Which rule, on which shapes: a rule that calls its own function (softplus's
    JVP rule calls softplus) meets itself again, and is walked once."""
    params = eqn.params
    funs = [params[k] for k in ("jvp_jaxpr_fun", "fwd_jaxpr_thunk", "bwd") if k in params]
    where = tuple(getattr(f.debug_info, "func_src_info", None) or repr(f) for f in funs)
    return (eqn.primitive.name, where, tuple(describe_aval(v.aval) for v in eqn.invars))


def rule_jaxprs(eqn: jex_core.JaxprEqn) -> list[tuple[str, jex_core.Jaxpr]]:
    """The custom derivative rules of a `custom_jvp_call` or `custom_vjp_call`
    equation, traced on its shapes: `jvp_rule`, or `fwd_rule` and `bwd_rule`.

    The equation's params (jax 0.10) hold no rule jaxpr, only what traces one:
    `jvp_jaxpr_fun(*input_is_zero)` gives the JVP rule's jaxpr (inputs: primals,
    then the nonzero tangents); `fwd_jaxpr_thunk(*input_is_nonzero)` the forward
    rule's (outputs: residuals, then primal outputs); `bwd` is the backward rule,
    called on residuals and output cotangents, whose avals come from the forward
    rule's outputs and `out_trees()` (`input_fwds`: residuals that are inputs).
    Any other equation: `[]`."""
    name = eqn.primitive.name
    if name not in primitives.CUSTOM_RULE_PRIMITIVES:
        return []
    params = eqn.params
    inputs = [v.aval for v in eqn.invars[params["num_consts"] :]]
    nonzero = [_has_tangent(a) for a in inputs]
    if name == "custom_jvp_call":
        rule = params["jvp_jaxpr_fun"]
        jvp, _, _ = _trace_rule(lambda: rule.call_wrapped(*[not nz for nz in nonzero]), rule)
        return [("jvp_rule", jvp)]
    forward = params["fwd_jaxpr_thunk"]
    fwd, _ = _trace_rule(lambda: forward.call_wrapped(*nonzero), forward)
    _, res_tree, input_fwds = params["out_trees"]()
    computed = iter(fwd.outvars[: res_tree.num_leaves - sum(f is not None for f in input_fwds)])
    residuals = [next(computed).aval if f is None else eqn.invars[f].aval for f in input_fwds]
    cotangents = [v.aval.to_tangent_aval() for v in eqn.outvars]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (*residuals, *cotangents)]
    backward = params["bwd"]
    make_bwd = jax.make_jaxpr(lambda *a: backward.call_wrapped(*a))
    bwd = _trace_rule(lambda: make_bwd(*specs), backward)
    return [("fwd_rule", fwd), ("bwd_rule", bwd.jaxpr)]


def _trace_rule(make: Callable[[], Any], rule: Any) -> Any:
    """Runs a rule's tracing; a rule JAX cannot trace is an `AuditInputError`
    naming the rule (`name at file:line`, as JAX records it)."""
    try:
        return make()
    except (TypeError, ValueError, IndexError, NotImplementedError) as err:
        debug = getattr(rule, "debug_info", None)
        where = getattr(debug, "func_src_info", None) or repr(rule)
        raise AuditInputError(
            f"The custom derivative rule `{where}` could not be traced: {_first_line(err)}"
        ) from None


def walk_rules(
    jaxpr: jex_core.Jaxpr, path: str = "", outer_source: str = "", _open: frozenset = frozenset()
) -> list[Equation]:
    """Every equation of the custom derivative rules of every custom call in
    `jaxpr`, at any depth (sub-programs, the rules' own custom calls), depth
    first. Rule equations are not differentiated by JAX at first order."""
    found: list[Equation] = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        source = source_info_util.summarize(eqn.source_info) or outer_source
        here = f"{path}/{name}" if path else name
        for param, sub in sub_jaxprs(eqn.params):
            found.extend(walk_rules(sub, f"{here}.{param}", source, _open))
        if name not in primitives.CUSTOM_RULE_PRIMITIVES:
            continue
        key = _rule_key(eqn)
        if key in _open:  # a rule calling its own function: already being walked
            continue
        for rule, sub in rule_jaxprs(eqn):
            where = f"{here}.{rule}"
            found.extend(walk(sub, where, False, source))
            found.extend(walk_rules(sub, where, source, _open | {key}))
    return found


def check(equation: Equation, policy: Policy) -> list[Finding]:
    """The findings one equation raises under `policy`.

    Cases, in this order (rule codes as in `Finding.rule`):
        not in `primitives.TABLE` -> only "unknown-primitive" (nothing else checked)
            [claim:check-unknown-primitive]
        a callback primitive -> "host-callback" [claim:check-host-callback]
            (and no mode check) [claim:check-callback-no-mode-check]
        otherwise, when the equation is differentiated -> one "mode-unsupported"
            per mode of `policy.modes` the table does not list for it
            [claim:check-mode-unsupported]
        float32 policy and an output of float64 or complex128 -> "dtype-policy"
            [claim:check-dtype-policy]
        deterministic policy and a random primitive -> "random-in-deterministic"
            [claim:check-random-in-deterministic]
    """

    def finding(rule: str, reason: str) -> Finding:
        return Finding(rule, equation.primitive, equation.path, equation.source, reason)

    name = equation.primitive
    doc = primitives.TABLE.get(name)
    found: list[Finding] = []
    # --- exercise stage 3: Reject by the table, callbacks, modes, float64 and randomness. ---
    if doc is None:
        found.append(
            finding(
                "unknown-primitive",
                f"`{name}` is not in the documented table; its derivative rules are unaudited.",
            )
        )
        return found
    if name in primitives.CALLBACK_PRIMITIVES:
        found.append(finding("host-callback", f"`{name}` calls Python on the host. {doc.note}"))
    elif equation.differentiated:
        for mode in policy.modes:
            if mode not in doc.modes:
                found.append(
                    finding(
                        "mode-unsupported", f"`{name}` does not support `{mode}` mode. {doc.note}"
                    )
                )
    if policy.float_dtype == "float32":
        wide = [o for o in equation.outputs if o.startswith(("float64", "complex128"))]
        if wide:
            found.append(
                finding("dtype-policy", f"`{name}` produces `{wide[0]}` under a float32 policy.")
            )
    if policy.deterministic and name in primitives.RANDOM_PRIMITIVES:
        found.append(
            finding(
                "random-in-deterministic",
                f"`{name}` draws random bits in a function declared deterministic.",
            )
        )
    # --- end exercise ---
    return found


def trace(fn: Callable, args: Sequence[Any]) -> jex_core.ClosedJaxpr:
    """`jax.make_jaxpr(fn)(*args)`, with tracing failures turned into `AuditInputError`."""
    label = getattr(fn, "__qualname__", repr(fn))
    try:
        return jax.make_jaxpr(fn)(*args)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerBoolConversionError,
        jax.errors.TracerIntegerConversionError,
    ) as err:
        first = str(err).strip().splitlines()[0]
        raise AuditInputError(
            f"`{label}` is not JAX-traceable: it needs a concrete value where JAX has only "
            f"an abstract one ({first}). Write it with `jax.numpy` and `lax` control flow."
        ) from None
    except (TypeError, ValueError, IndexError, NotImplementedError) as err:
        raise AuditInputError(
            f"`{label}` could not be traced on inputs "
            f"{[describe_aval(getattr(a, 'aval', a)) for a in args]}: {_first_line(err)}"
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def audit(fn: Callable, args: Sequence[Any], policy: Policy = Policy()) -> Audit:
    """Traces `fn(*args)` and audits every equation under `policy`, the custom
    derivative rules' included. `args`: a tuple of arrays (or `jax.ShapeDtypeStruct`s)."""
    if not isinstance(args, tuple | list):
        raise AuditInputError(
            f"`args` must be a tuple of the function's arguments, got `{type(args).__name__}`."
        )
    if not isinstance(policy, Policy):
        raise AuditInputError(f"`policy` must be a `Policy`, got `{type(policy).__name__}`.")
    closed = trace(fn, args)
    equations = walk(closed.jaxpr)
    rule_equations = walk_rules(closed.jaxpr)
    findings = [f for e in (*equations, *rule_equations) for f in check(e, policy)]
    return Audit(
        policy=policy,
        equations=tuple(equations),
        findings=tuple(findings),
        inputs=tuple(describe_aval(v.aval) for v in closed.jaxpr.invars),
        outputs=tuple(describe_aval(v.aval) for v in closed.jaxpr.outvars),
        rule_equations=tuple(rule_equations),
    )


# Primitives that only wrap a sub-program; a transformation may add or remove them.
WRAPPERS = frozenset({"jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call"})


def consistency(fn: Callable, x: jax.Array, policy: Policy = Policy(), batch: int = 3) -> dict:
    """Audits `fn` plainly and under `jit`, `vmap` and `grad`, and says whether they agree.

    Agree means: the same verdict and the same (rule, source) findings, where a
    transformation that refuses to trace agrees with a rejection; under `jit`
    also the same primitive counts once the `jit` wrapper is set aside; under
    `vmap` every computing primitive of the plain program still present. Under
    `grad` primitives may go (dead code: a value the derivative does not use)
    and come (the backward pass); both lists are reported, not judged.
    """
    plain = audit(fn, (x,), policy)
    stacked = jax.numpy.stack([x] * batch)
    variants: dict[str, Callable[[], Audit]] = {
        "jit": lambda: audit(jax.jit(fn), (x,), policy),
        "vmap": lambda: audit(jax.vmap(fn), (stacked,), policy),
        "grad": lambda: audit(jax.grad(lambda y: jax.numpy.sum(fn(y))), (x,), policy),
    }
    leaves = {k for k in plain.counts if k not in WRAPPERS}
    key = sorted({(f.rule, f.source) for f in plain.findings})
    result: dict[str, Any] = {"plain": {"verdict": _verdict(plain), "findings": key}}
    for name, make in variants.items():
        try:
            other = make()
        except Exception as err:  # noqa: BLE001 - a refusal is an outcome, recorded
            refused = str(err).strip().splitlines()[0][:300]
            result[name] = {
                "verdict": "refused to trace",
                "error": refused,
                "consistent": not plain.accepted,
            }
            continue
        other_key = sorted({(f.rule, f.source) for f in other.findings})
        other_leaves = {k for k in other.counts if k not in WRAPPERS}
        if name == "jit":
            structure = _unwrapped(plain.counts) == _unwrapped(other.counts)
        elif name == "vmap":
            structure = leaves <= other_leaves
        else:
            structure = True
        result[name] = {
            "verdict": _verdict(other),
            "findings": other_key,
            "primitives_added": sorted(other_leaves - leaves),
            "primitives_dropped": sorted(leaves - other_leaves),
            "consistent": other.accepted == plain.accepted
            and set(key) <= set(other_key)
            and structure,
        }
    result["consistent"] = all(result[n]["consistent"] for n in variants)
    return result


def _verdict(a: Audit) -> str:
    return "accepted" if a.accepted else "rejected"


def _unwrapped(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if k not in ("jit", "pjit")}
