"""Stage 3: programs inspected through their jaxprs.

Independent checks: primitive counts of a program built by hand against the
enumeration of what it contains, and of every suite function against a count
of the equations in JAX's own printed jaxpr; each rejection's source location
against the line of the offending call found with `inspect`. Changed
conditions: the complementary policy accepts what one policy rejects, and the
same functions audited under `jit`, `vmap` and `grad` agree.
"""

import collections
import inspect as pyinspect
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from jax.extend import core as jex_core

from derivative_audit import data, functions, jaxpr_audit, model, primitives, rules
from derivative_audit.cli import main
from derivative_audit.config import Config

F32 = jaxpr_audit.Policy(float_dtype="float32")
X4 = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)


@jax.custom_jvp
def _cube(x):
    return x * x * x


@_cube.defjvp
def _cube_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _cube(x), 3 * x * x * t


def nested_program(x):
    def body(carry, _):
        return jnp.tanh(carry) * 2.0, None

    y, _ = jax.lax.scan(body, x, None, length=3)
    y = jax.lax.cond(y[0] > 0, jnp.sin, jnp.cos, y)
    y = jax.jit(jnp.exp)(y)
    y = _cube(y)
    y = rules.clip_gradient(y, -1.0, 1.0)
    return jax.lax.while_loop(lambda c: c[0] < 5.0, lambda c: c + 1.0, y)


# What `nested_program` contains, enumerated by reading it: the cond's predicate
# y[0] > 0 is slice, squeeze, gt and a convert to the branch index; the while's
# condition c[0] < 5 is slice, squeeze, lt.
NESTED_COUNTS = {
    "scan": 1,
    "tanh": 1,
    "mul": 1 + 2,
    "slice": 1 + 1,
    "squeeze": 1 + 1,
    "gt": 1,
    "convert_element_type": 1,
    "cond": 1,
    "sin": 1,
    "cos": 1,
    "jit": 1,
    "exp": 1,
    "custom_jvp_call": 1,
    "custom_vjp_call": 1,
    "while": 1,
    "lt": 1,
    "add": 1,
}


def _leaf_primitives(fn, *args) -> set[str]:
    """Every primitive in `make_jaxpr(fn)(*args)` at any depth, wrappers left out,
    collected by a plain recursion over the equations' params."""

    def names(jaxpr) -> set[str]:
        found = set()
        for eqn in jaxpr.eqns:
            found.add(eqn.primitive.name)
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(item, jex_core.ClosedJaxpr):
                        found |= names(item.jaxpr)
                    elif isinstance(item, jex_core.Jaxpr):
                        found |= names(item)
        return found

    wrappers = {"jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call"}
    return names(jax.make_jaxpr(fn)(*args).jaxpr) - wrappers


def wide_and_random(x):
    y = (x.astype(jnp.float64) * 2.0).astype(jnp.float32)
    return y + jax.random.uniform(jax.random.key(0), x.shape, jnp.float32)


@pytest.mark.claims("audit-consistent-under-transforms")
def test_consistency_figures_match_an_independent_walk(evidence):
    """consistency's added and dropped primitives per variant equal a separate make_jaxpr walk's.

    Every variant's primitives added and dropped against a separate recursion
    over `make_jaxpr`; grad keeps the plain findings and adds its own (the
    backward pass of the cast is float64 too), which is still consistent."""
    result = jaxpr_audit.consistency(wide_and_random, X4, F32)
    plain = _leaf_primitives(wide_and_random, X4)
    variants = {
        "jit": _leaf_primitives(jax.jit(wide_and_random), X4),
        "vmap": _leaf_primitives(jax.vmap(wide_and_random), jnp.stack([X4] * 3)),
        "grad": _leaf_primitives(jax.grad(lambda y: jnp.sum(wide_and_random(y))), X4),
    }
    plain_findings = {
        (f.rule, f.source) for f in jaxpr_audit.audit(wide_and_random, (X4,), F32).findings
    }
    ok = [result["plain"] == {"verdict": "rejected", "findings": sorted(plain_findings)}]
    for name, leaves in variants.items():
        r = result[name]
        ok.append(r["primitives_added"] == sorted(leaves - plain))
        ok.append(r["primitives_dropped"] == sorted(plain - leaves))
        ok.append(r["verdict"] == "rejected" and r["consistent"] is True)
        ok.append(plain_findings <= set(map(tuple, r["findings"])))
    grad_extra = set(map(tuple, result["grad"]["findings"])) - plain_findings
    ok.append(bool(grad_extra) and all(rule == "dtype-policy" for rule, _ in grad_extra))
    ok.append(result["consistent"] is True)
    assert evidence.record(
        "consistency figures", "float64 cast and random bits", result, None, all(ok)
    )


def branch_on_data(x):
    return jax.lax.cond(x[0] > 0, jnp.sin, jnp.cos, x)


@pytest.mark.claims("audit-consistent-under-transforms")
def test_consistency_flags_a_primitive_vmap_drops(evidence):
    """consistency flags vmap of a cond on data as inconsistent: cond dropped, select_n added.

    vmap of a cond on a batched predicate computes both branches (`select_n`):
    the `cond` is gone, so the vmapped program is not the plain one."""
    result = jaxpr_audit.consistency(branch_on_data, X4)
    vmapped = _leaf_primitives(jax.vmap(branch_on_data), jnp.stack([X4] * 3))
    ok = (
        result["plain"]["verdict"] == "accepted"
        and "cond" not in vmapped
        and result["vmap"]["primitives_dropped"] == ["cond"]
        and "select_n" in result["vmap"]["primitives_added"]
        and result["vmap"]["verdict"] == "accepted"
        and result["vmap"]["consistent"] is False
        and result["jit"]["consistent"] is True
        and result["consistent"] is False
    )
    assert evidence.record("vmap drops a primitive", "cond on data", result, None, ok)


def refuses_under_vmap(x):
    if "Batch" in type(x).__name__:
        raise RuntimeError("no batching here\nsecond line of the message")
    return jnp.sin(x)


def unbatchable_callback(x):
    return jax.pure_callback(_host_double, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.claims("audit-consistent-under-transforms")
@pytest.mark.parametrize(
    ("fn", "plain_verdict", "error"),
    [
        (refuses_under_vmap, "accepted", "no batching here"),
        (unbatchable_callback, "rejected", "vmap is only supported for the pure_callback"),
    ],
    ids=["accepted-plain", "rejected-plain"],
)
def test_consistency_records_a_refusal_and_goes_on(evidence, fn, plain_verdict, error):
    """A variant that refuses to trace is recorded by its first error line; later variants run.

    A variant that refuses to trace is recorded with the first line of its
    error; it agrees with a rejection only, and the variants after it still run."""
    result = jaxpr_audit.consistency(fn, X4)
    vmap = result["vmap"]
    ok = (
        result["plain"]["verdict"] == plain_verdict
        and vmap["verdict"] == "refused to trace"
        and error in vmap["error"]
        and "\n" not in vmap["error"]
        and "second line" not in vmap["error"]
        and vmap["consistent"] is (plain_verdict == "rejected")
        and "grad" in result
        and result["consistent"] is (plain_verdict == "rejected")
    )
    assert evidence.record("refusal recorded", fn.__name__, result, None, ok)


@pytest.mark.parametrize(
    "thing",
    [SimpleNamespace(shape=(2, 3)), SimpleNamespace(dtype=np.dtype("float32")), 2.5],
    ids=["shape-only", "dtype-only", "python-float"],
)
def test_describe_aval_needs_both_shape_and_dtype(thing):
    """describe_aval gives float32[2,3] for an array spec and plain str() for anything lacking shape
    or dtype."""
    assert jaxpr_audit.describe_aval(thing) == str(thing)
    assert jaxpr_audit.describe_aval(jax.ShapeDtypeStruct((2, 3), jnp.float32)) == "float32[2,3]"


@jax.custom_jvp
def tanh_by_rule(x):
    return jnp.tanh(x)


@tanh_by_rule.defjvp
def _tanh_by_rule_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y = 2.0 * jax.nn.sigmoid(2.0 * x) - 1.0
    return y, (1.0 - y * y) * t


@pytest.mark.claims("audit-consistent-under-transforms")
def test_consistency_lets_grad_drop_what_the_rule_replaces(evidence):
    """consistency reports a custom_jvp body's tanh as dropped under grad, and still consistent.

    Under grad JAX runs the JVP rule in place of the body, so the body's `tanh`
    goes: reported as dropped, and not held against grad (only vmap must keep
    every primitive)."""
    result = jaxpr_audit.consistency(tanh_by_rule, X4)
    grad = _leaf_primitives(jax.grad(lambda y: jnp.sum(tanh_by_rule(y))), X4)
    ok = (
        "tanh" not in grad
        and result["grad"]["primitives_dropped"] == ["tanh"]
        and result["grad"]["consistent"] is True
        and result["vmap"]["consistent"] is True
        and result["consistent"] is True
    )
    assert evidence.record("grad drops the body", "custom_jvp tanh", result, None, ok)


@jax.custom_vjp
def two_residuals(x):
    return jnp.sin(x)


two_residuals.defvjp(
    lambda x: (jnp.sin(x), (jnp.cos(x), 2.0 * x)), lambda r, g: (r[0] * g + 0.0 * r[1],)
)


@pytest.mark.claims("custom-rules-audited")
def test_backward_rule_is_traced_on_every_computed_residual(evidence):
    """Both rules of a custom_vjp with two computed residuals are traced, counts as read off.

    A forward rule with two computed residuals (none of them an input): both
    rules traced, with what they contain enumerated by reading them."""
    a = jaxpr_audit.audit(two_residuals, (X4,), jaxpr_audit.Policy(modes=("vjp",)))
    fwd = collections.Counter(
        e.primitive for e in a.rule_equations if e.path == "custom_vjp_call.fwd_rule"
    )
    bwd = collections.Counter(
        e.primitive for e in a.rule_equations if e.path == "custom_vjp_call.bwd_rule"
    )
    ok = fwd == {"sin": 1, "cos": 1, "mul": 1} and bwd == {"mul": 2, "add": 1} and a.accepted
    assert evidence.record(
        "two residuals", "custom_vjp", {"fwd": dict(fwd), "bwd": dict(bwd)}, None, ok
    )


def calls_relu(x):
    return jax.nn.relu(x) * 2.0


@pytest.mark.claims("custom-rules-audited", "walk-library-source")
def test_rule_equations_inside_a_library_take_the_callers_line(evidence):
    """The equations of relu's JVP rule carry the line of the user's call, found with inspect.

    relu's JVP rule is JAX's own code: its equations have no user frame, so
    each takes the line of the user's call (the `return` of `calls_relu`)."""
    a = jaxpr_audit.audit(calls_relu, (X4,))
    where = f"test_stage_3_jaxpr.py:{_call_line(calls_relu)}:"
    sources = [e.source for e in a.rule_equations]
    ok = bool(sources) and all(where in s and "(calls_relu)" in s for s in sources)
    assert evidence.record("rule sources", "jax.nn.relu", {"sources": sources}, None, ok)


@pytest.mark.claims("jaxpr-walk-and-reject", "walk-nesting-paths", "sub-jaxprs-closed")
@pytest.mark.claims("sub-jaxprs-indexed", "sub-jaxprs-nothing-else")
def test_walker_counts_every_nested_equation(evidence):
    """The walker's primitive counts and nesting paths equal an enumeration of a nested program,
    also under jit."""
    audit = jaxpr_audit.audit(nested_program, (X4,), jaxpr_audit.Policy(modes=("vjp",)))
    paths = {e.primitive: e.path for e in audit.equations}
    expected_paths = {
        "tanh": "scan.jaxpr",
        "sin": "cond.branches[1]",
        "cos": "cond.branches[0]",
        "exp": "jit.jaxpr",
        "lt": "while.cond_jaxpr",
        "add": "while.body_jaxpr",
    }
    ok = [
        evidence.record(
            "counts vs enumeration",
            "nested program",
            {"counts": audit.counts},
            {"expected": NESTED_COUNTS},
            audit.counts == NESTED_COUNTS,
        ),
        evidence.record(
            "nesting paths",
            "nested program",
            {k: paths.get(k) for k in expected_paths},
            {"expected": expected_paths},
            all(paths.get(k) == v for k, v in expected_paths.items()),
        ),
    ]
    # Under jit the whole program is one more `jit` around the same equations.
    jitted = jaxpr_audit.audit(jax.jit(nested_program), (X4,), jaxpr_audit.Policy(modes=("vjp",)))
    expected_jit = dict(NESTED_COUNTS, jit=2)
    ok.append(
        evidence.record(
            "counts under jit",
            "nested program",
            {"counts": jitted.counts},
            {"expected": expected_jit},
            jitted.counts == expected_jit,
        )
    )
    assert all(ok)


def _ordered_program(x):
    a = jnp.sin(x)

    def body(c, _):
        return jax.jit(lambda y: jnp.exp(jnp.tanh(y)))(c) * 2.0, None

    b, _ = jax.lax.scan(body, a, None, length=2)
    c = jax.lax.cond(b[0] > 0, jnp.cos, jnp.negative, b)
    return jnp.log(c)


# `_ordered_program` read top to bottom, each equation followed at once by its
# sub-programs' equations (depth first), before the next equation of its own level.
# `cond` holds its branches as (false, true): branches[0] is `negative`.
ORDERED_WALK = [
    ("sin", ""),
    ("scan", ""),
    ("jit", "scan.jaxpr"),
    ("tanh", "scan.jaxpr/jit.jaxpr"),
    ("exp", "scan.jaxpr/jit.jaxpr"),
    ("mul", "scan.jaxpr"),
    ("slice", ""),
    ("squeeze", ""),
    ("gt", ""),
    ("convert_element_type", ""),
    ("cond", ""),
    ("neg", "cond.branches[0]"),
    ("cos", "cond.branches[1]"),
    ("log", ""),
]


@pytest.mark.claims("walk-depth-first-order")
def test_walk_is_depth_first_in_program_order(evidence):
    """walk lists each equation, then its sub-programs' equations, before the next one: the order of
    a program read by hand and of JAX's printed jaxpr.

    A scan holding a jit, a cond of two branches, equations before, between and
    after them: breadth first (all top-level equations first), an equation after
    its sub-programs, or any reordering of a level gives another sequence. JAX's
    printed jaxpr names each equation's primitive before its nested programs, so
    the names in printed order are a second reference."""
    closed = jax.make_jaxpr(_ordered_program)(X4)
    walked = [(e.primitive, e.path) for e in jaxpr_audit.walk(closed.jaxpr)]
    printed = re.findall(r" = ([a-z_][a-z0-9_-]*)", str(closed))
    assert evidence.record(
        "depth-first walk in program order",
        "scan(jit), cond(2 branches) between plain equations",
        {"walked": walked, "printed": printed},
        {"expected": ORDERED_WALK},
        walked == ORDERED_WALK and [p for p, _ in walked] == printed,
    ), walked


@pytest.mark.claims("sub-jaxprs-open")
def test_an_open_jaxpr_param_is_a_sub_program(evidence):
    """sub_jaxprs returns an open Jaxpr param as (its key, that very Jaxpr), in params order among
    closed ones and other values; the walk enters the open jaxpr jax.checkpoint holds.

    Params built by hand: open jaxprs first, between and last, a `ClosedJaxpr`
    (given as its `.jaxpr`) and plain values that give nothing. Then a real open
    jaxpr: JAX 0.10 keeps `jax.checkpoint`'s body as a `Jaxpr`, not a `ClosedJaxpr`
    (checked first, so the test says if JAX changes that)."""
    body = jax.make_jaxpr(lambda y: jnp.sin(y) * 2.0)(X4).jaxpr
    tail = jax.make_jaxpr(jnp.exp)(X4).jaxpr
    closed = jax.make_jaxpr(jnp.cos)(X4)
    params = {"body": body, "n": 3, "closed": closed, "name": "f", "tail": tail, "flag": True}
    found = jaxpr_audit.sub_jaxprs(params)
    expected = [("body", body), ("closed", closed.jaxpr), ("tail", tail)]
    by_hand = [k for k, _ in found] == [k for k, _ in expected] and all(
        got is want for (_, got), (_, want) in zip(found, expected, strict=True)
    )

    checkpointed = jax.checkpoint(lambda y: jnp.sin(y) * 2.0)
    program = jax.make_jaxpr(lambda y: jnp.cos(checkpointed(y)))(X4).jaxpr
    remat = program.eqns[0]
    held = remat.params["jaxpr"]
    is_open = isinstance(held, jex_core.Jaxpr) and not isinstance(held, jex_core.ClosedJaxpr)
    name = remat.primitive.name  # JAX's name for it (`remat2` in JAX 0.10)
    inner = f"{name}.jaxpr"
    walked = [(e.primitive, e.path) for e in jaxpr_audit.walk(program)]
    want_walk = [(name, ""), ("sin", inner), ("mul", inner), ("cos", "")]
    assert evidence.record(
        "open Jaxpr params are sub-programs",
        "hand-built params; jax.checkpoint's body",
        {"found": [k for k, _ in found], "checkpoint_param_open": is_open, "walked": walked},
        {"expected": [k for k, _ in expected], "walked": want_walk},
        by_hand and is_open and walked == want_walk,
    ), (found, walked)


def _printed_counts(fn, x) -> dict[str, int]:
    """Counts of `name` in every `outputs = name[...] inputs` line of JAX's printed jaxpr."""
    text = str(jax.make_jaxpr(fn)(x))
    return dict(collections.Counter(re.findall(r" = ([a-z_][a-z0-9_-]*)", text)))


@pytest.mark.claims("jaxpr-walk-and-reject")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_suite_counts_match_the_printed_jaxpr_and_are_documented(evidence, dtype):
    """Each suite function's primitive counts equal those of JAX's printed jaxpr, all documented, in
    2 dtypes."""
    config = Config.tiny()
    ok = []
    for name in functions.SUITE:
        p = data.make_problem(name, config, dtype)
        audit = jaxpr_audit.audit(p.fn, (p.x,), jaxpr_audit.Policy(float_dtype=dtype))
        printed = _printed_counts(p.fn, p.x)
        documented = all(
            primitives.TABLE[k].summary and primitives.TABLE[k].modes for k in audit.counts
        )
        shapes = audit.inputs == (f"{dtype}[{config.n}]",)
        ok.append(
            evidence.record(
                "counts vs printed jaxpr",
                f"{name} {dtype}",
                {"walker": audit.counts, "printed": printed, "findings": len(audit.findings)},
                None,
                audit.counts == printed and audit.accepted and documented and shapes,
            )
        )
    assert all(ok)


@pytest.mark.claims("walk-output-avals")
def test_shapes_and_dtypes_follow_vmap(evidence):
    """The recorded tanh output avals are float32[5] plain and float32[5,3] under vmap of 3."""
    p = data.make_problem("matmul_chain", Config.tiny(), "float32")
    plain = jaxpr_audit.audit(p.fn, (p.x,))
    batched = jaxpr_audit.audit(jax.vmap(p.fn), (jnp.stack([p.x] * 3),))
    tanh_plain = [e.outputs for e in plain.equations if e.primitive == "tanh"]
    tanh_batched = [e.outputs for e in batched.equations if e.primitive == "tanh"]
    # vmap turns the matvec W @ x into the matmul W @ X with the batch last, so the
    # batched values are (5, 3): the jaxpr shows where the batch axis went.
    ok = evidence.record(
        "tanh output avals",
        "plain vs vmap(3)",
        {"plain": tanh_plain, "vmap": tanh_batched},
        None,
        tanh_plain == [("float32[5]",)] * 2 and tanh_batched == [("float32[5,3]",)] * 2,
    )
    assert ok


def _host_double(a):
    return np.asarray(a) * 2


def with_callback(x):
    return jax.pure_callback(_host_double, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def with_while(x):
    return jax.lax.while_loop(lambda c: c[0] < 10.0, lambda c: c * 1.5 + 1.0, x)


def with_float64(x):
    return (x.astype(jnp.float64) * 2).astype(jnp.float32)


def with_random(x):
    return x + jax.random.normal(jax.random.key(0), x.shape, x.dtype)


_mystery_p = jex_core.Primitive("mystery_op")
_mystery_p.def_impl(lambda x: x)
_mystery_p.def_abstract_eval(lambda x: x)


def with_unknown(x):
    return _mystery_p.bind(x)


def _call_line(fn) -> int:
    """The line of the offending call: the function's `return` line."""
    lines, start = pyinspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if "return" in line)


# (function, rule, policy that rejects it, the complementary policy that accepts it)
REJECTIONS = [
    (with_callback, "host-callback", F32, None),
    (
        with_while,
        "mode-unsupported",
        F32,
        jaxpr_audit.Policy(modes=("jvp",), float_dtype="float32"),
    ),
    (with_float64, "dtype-policy", F32, jaxpr_audit.Policy(float_dtype=None)),
    (
        with_random,
        "random-in-deterministic",
        F32,
        jaxpr_audit.Policy(float_dtype="float32", deterministic=False),
    ),
    (with_unknown, "unknown-primitive", F32, None),
]


@pytest.mark.claims("jaxpr-walk-and-reject", "check-unknown-primitive", "check-host-callback")
@pytest.mark.claims("check-mode-unsupported", "check-dtype-policy", "check-random-in-deterministic")
@pytest.mark.parametrize(
    ("fn", "rule", "policy", "complement"), REJECTIONS, ids=[r[1] for r in REJECTIONS]
)
def test_unsupported_programs_are_rejected_with_reason_and_location(
    evidence, fn, rule, policy, complement
):
    """Each of 5 unsupported programs is rejected by its rule at its offending line; complementary
    policies accept 3."""
    audit = jaxpr_audit.audit(fn, (X4,), policy)
    line = _call_line(fn)
    located = [
        f
        for f in audit.findings
        if f.rule == rule
        and f"test_stage_3_jaxpr.py:{line}:" in f.source
        and f"({fn.__name__})" in f.source
    ]
    ok = [
        evidence.record(
            "rejected with location",
            fn.__name__,
            {"findings": [(f.rule, f.source, f.reason) for f in audit.findings]},
            {"rule": rule, "line": line},
            not audit.accepted and bool(located) and all(f.reason for f in audit.findings),
        )
    ]
    if complement is not None:
        other = jaxpr_audit.audit(fn, (X4,), complement)
        ok.append(
            evidence.record(
                "complementary policy accepts",
                fn.__name__,
                {"findings": [f.rule for f in other.findings]},
                None,
                other.accepted,
            )
        )
    assert all(ok)


@pytest.mark.claims("check-callback-no-mode-check")
@pytest.mark.parametrize("name", sorted(primitives.CALLBACK_PRIMITIVES))
def test_a_callback_is_refused_as_a_callback_only_not_for_its_modes(evidence, name):
    """A differentiated callback under a jvp+vjp policy raises one finding, host-callback, though
    the table lists neither mode for it; a while loop under the same policy gets its mode check.

    The equation is built by hand (differentiated, float32 output, at top level),
    so every other rule is off: the only findings possible are host-callback and
    one mode-unsupported per missing mode. The table's modes are read first: a
    callback with both modes would make the test prove nothing. The control, a
    `while` (no reverse mode), shows the mode check is live under this policy.
    A real `pure_callback` program is audited too."""
    policy = jaxpr_audit.Policy(modes=("jvp", "vjp"))
    missing = [m for m in policy.modes if m not in primitives.TABLE[name].modes]

    def equation(primitive):
        return jaxpr_audit.Equation(primitive, "", ("float32[4]",), "here.py:1:0 (f)", True)

    callback = [(f.rule, f.primitive) for f in jaxpr_audit.check(equation(name), policy)]
    loop = [(f.rule, f.primitive) for f in jaxpr_audit.check(equation("while"), policy)]
    program = [
        (f.rule, f.primitive) for f in jaxpr_audit.audit(with_callback, (X4,), policy).findings
    ]
    assert evidence.record(
        "callback: host-callback only, no mode check",
        f"{name}, differentiated, modes jvp+vjp",
        {"callback": callback, "while": loop, "pure_callback program": program, "missing": missing},
        {"callback": [("host-callback", name)], "while": [("mode-unsupported", "while")]},
        missing == ["jvp", "vjp"]
        and callback == [("host-callback", name)]
        and loop == [("mode-unsupported", "while")]
        and program == [("host-callback", "pure_callback")],
    ), (callback, loop, program)


@pytest.mark.claims("walk-differentiated-inherited", "check-mode-unsupported")
def test_implicit_solver_hides_its_while_loop_from_reverse_mode(evidence):
    """The implicit solver's hidden while loop passes reverse mode; forward mode is refused once.

    The while loop inside the custom_vjp is not differentiated by JAX: accepted
    for reverse mode; forward mode is refused at the custom_vjp itself."""
    params = model.init(jax.random.key(0), 4, 4, 0.6, jnp.float32)

    def implicit(x):
        return rules.fixed_point_implicit(params, x, 100)

    reverse = jaxpr_audit.audit(
        implicit, (X4,), jaxpr_audit.Policy(modes=("vjp",), float_dtype="float32")
    )
    both = jaxpr_audit.audit(implicit, (X4,), F32)
    whiles = [e for e in reverse.equations if e.primitive == "while"]
    ok = evidence.record(
        "implicit solver audit",
        "vjp only vs jvp+vjp",
        {
            "vjp_findings": [f.rule for f in reverse.findings],
            "both_findings": [(f.rule, f.primitive) for f in both.findings],
            "while_differentiated": [e.differentiated for e in whiles],
        },
        None,
        reverse.accepted
        and whiles
        and not any(e.differentiated for e in whiles)
        and [(f.rule, f.primitive) for f in both.findings]
        == [("mode-unsupported", "custom_vjp_call")],
    )
    assert ok


@pytest.mark.claims("audit-consistent-under-transforms")
@pytest.mark.parametrize(
    "name", ["matmul_chain", "softmax", "scan_recurrence", "fixed_point_solver"]
)
def test_suite_audit_is_consistent_under_jit_vmap_grad(evidence, name):
    """Four suite functions are accepted, with the same verdict, under jit, vmap and grad."""
    p = data.make_problem(name, Config.tiny(), "float32")
    result = jaxpr_audit.consistency(p.fn, p.x, F32)
    assert evidence.record(
        "consistent under jit/vmap/grad",
        name,
        result,
        None,
        result["consistent"] and result["plain"]["verdict"] == "accepted",
    )


@pytest.mark.claims("audit-consistent-under-transforms")
@pytest.mark.parametrize(
    "fn", [with_callback, with_while, with_float64, with_random], ids=lambda f: f.__name__
)
def test_rejections_are_consistent_under_jit_vmap_grad(evidence, fn):
    """Four rejected programs stay rejected, consistently, under jit, vmap and grad."""
    result = jaxpr_audit.consistency(fn, X4, F32)
    assert evidence.record(
        "consistent under jit/vmap/grad",
        fn.__name__,
        result,
        None,
        result["consistent"] and result["plain"]["verdict"] == "rejected",
    )


def test_an_untraceable_function_is_a_clear_error():
    """A function that needs a concrete number is refused as not JAX-traceable, naming it."""

    def needs_a_number(x):
        return x * float(x[0])

    with pytest.raises(
        jaxpr_audit.AuditInputError, match="`.*needs_a_number` is not JAX-traceable"
    ):
        jaxpr_audit.audit(needs_a_number, (X4,))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["inspect", "jax.numpy:tanh", "--shape", "4"], 0, "verdict: accepted"),
        (
            ["inspect", "derivative_audit.rules:straight_through_round"],
            1,
            "REJECT mode-unsupported",
        ),
        (["inspect", "numpy:asarray", "--shape", "3"], 2, "is not JAX-traceable"),
        (["inspect", "no_such_module:f"], 2, "Cannot import module `no_such_module`"),
        (["inspect", "jax.numpy:no_such_function"], 2, "has no function `no_such_function`"),
        (["inspect", "jax.numpy:tanh", "--modes", "sideways"], 2, "Unknown differentiation mode"),
    ],
)
def test_inspect_command(tmp_path, args, code, message):
    """The inspect command exits 0, 1 or 2 with its message for accepted, rejected and bad targets,
    never a traceback."""
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a.json")])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


# Custom derivative rules are programs too: JAX runs them in place of the primal body
# when it differentiates, so the audit traces them (the JVP rule of a custom_jvp, the
# forward and backward rules of a custom_vjp) and judges their equations. Each rule kind
# is written twice, identical but for one call (marked RULE-LINE): a documented primitive
# (accepted) and one the audit must refuse. The line is found by reading the source.


@jax.custom_jvp
def jvp_rule_sorts(x):
    return jnp.max(x, keepdims=True)


@jvp_rule_sorts.defjvp
def _jvp_rule_sorts_jvp(primals, tangents):
    # The largest entry moves with the tangent of the entry that is largest.
    (x,), (t,) = primals, tangents
    values, index = jax.lax.sort((x, jnp.arange(x.shape[0])), num_keys=1)  # RULE-LINE
    return values[-1:], t[index[-1:]]


@jax.custom_jvp
def jvp_rule_uses_top_k(x):
    return jnp.max(x, keepdims=True)


@jvp_rule_uses_top_k.defjvp
def _jvp_rule_uses_top_k_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    values, index = jax.lax.top_k(x, 1)  # RULE-LINE
    return values, t[index]


def _host_cos(a):
    return np.cos(np.asarray(a))


@jax.custom_vjp
def vjp_rule_in_jax(x):
    return jnp.sin(x)


def _vjp_rule_in_jax_fwd(x):
    return jnp.sin(x), x


def _vjp_rule_in_jax_bwd(x, g):
    return (jnp.cos(x) * g,)  # RULE-LINE


vjp_rule_in_jax.defvjp(_vjp_rule_in_jax_fwd, _vjp_rule_in_jax_bwd)


@jax.custom_vjp
def vjp_rule_calls_back(x):
    return jnp.sin(x)


def _vjp_rule_calls_back_fwd(x):
    return jnp.sin(x), x


def _vjp_rule_calls_back_bwd(x, g):
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return (jax.pure_callback(_host_cos, spec, x, vmap_method="sequential") * g,)  # RULE-LINE


vjp_rule_calls_back.defvjp(_vjp_rule_calls_back_fwd, _vjp_rule_calls_back_bwd)


@jax.custom_vjp
def fwd_rule_calls_back(x):
    return jnp.sin(x)


def _fwd_rule_calls_back_fwd(x):
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    cos = jax.pure_callback(_host_cos, spec, x, vmap_method="sequential")  # RULE-LINE
    return jnp.sin(x), cos


def _fwd_rule_calls_back_bwd(cos, g):
    return (cos * g,)


fwd_rule_calls_back.defvjp(_fwd_rule_calls_back_fwd, _fwd_rule_calls_back_bwd)


@jax.custom_jvp
def jvp_rule_calls_a_bad_vjp(x):
    return jnp.sin(x)


@jvp_rule_calls_a_bad_vjp.defjvp
def _jvp_rule_calls_a_bad_vjp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    # A rule within a rule: the backward rule of `vjp_rule_calls_back` is two levels down.
    return jnp.sin(x), vjp_rule_calls_back(x + jnp.pi / 2) * t  # sin(x + pi/2) = cos(x)


def _offending_line(fn) -> int:
    lines, start = pyinspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if "RULE-LINE" in line)


def _in_jit(x):
    return jax.jit(jvp_rule_uses_top_k)(x)


def _in_scan(x):
    def body(carry, _):
        return vjp_rule_calls_back(carry), None

    return jax.lax.scan(body, x, None, length=2)[0]


def _in_jit_ok(x):
    return jax.jit(jvp_rule_sorts)(x)


def _in_scan_ok(x):
    def body(carry, _):
        return vjp_rule_in_jax(carry), None

    return jax.lax.scan(body, x, None, length=2)[0]


# (program, the rule function holding the offending line, the primitive found there, its
# rule path in the audit, the finding's rule code; None for an accepted program)
RULE_CASES = {
    "jvp-rule-supported": (
        jvp_rule_sorts,
        _jvp_rule_sorts_jvp,
        "sort",
        "custom_jvp_call.jvp_rule",
        None,
    ),
    "jvp-rule-top-k": (
        jvp_rule_uses_top_k,
        _jvp_rule_uses_top_k_jvp,
        "top_k",
        "custom_jvp_call.jvp_rule",
        "unknown-primitive",
    ),
    "bwd-rule-supported": (
        vjp_rule_in_jax,
        _vjp_rule_in_jax_bwd,
        "cos",
        "custom_vjp_call.bwd_rule",
        None,
    ),
    "bwd-rule-callback": (
        vjp_rule_calls_back,
        _vjp_rule_calls_back_bwd,
        "pure_callback",
        "custom_vjp_call.bwd_rule",
        "host-callback",
    ),
    "fwd-rule-callback": (
        fwd_rule_calls_back,
        _fwd_rule_calls_back_fwd,
        "pure_callback",
        "custom_vjp_call.fwd_rule",
        "host-callback",
    ),
    "jvp-rule-in-jit-supported": (
        _in_jit_ok,
        _jvp_rule_sorts_jvp,
        "sort",
        "jit.jaxpr/custom_jvp_call.jvp_rule",
        None,
    ),
    "jvp-rule-in-jit-top-k": (
        _in_jit,
        _jvp_rule_uses_top_k_jvp,
        "top_k",
        "jit.jaxpr/custom_jvp_call.jvp_rule",
        "unknown-primitive",
    ),
    "bwd-rule-in-scan-supported": (
        _in_scan_ok,
        _vjp_rule_in_jax_bwd,
        "cos",
        "scan.jaxpr/custom_vjp_call.bwd_rule",
        None,
    ),
    "bwd-rule-in-scan-callback": (
        _in_scan,
        _vjp_rule_calls_back_bwd,
        "pure_callback",
        "scan.jaxpr/custom_vjp_call.bwd_rule",
        "host-callback",
    ),
    "bwd-rule-in-jvp-rule-callback": (
        jvp_rule_calls_a_bad_vjp,
        _vjp_rule_calls_back_bwd,
        "pure_callback",
        "custom_jvp_call.jvp_rule/custom_vjp_call.bwd_rule",
        "host-callback",
    ),
}


@pytest.mark.claims("custom-rules-audited", "check-unknown-primitive", "check-host-callback")
@pytest.mark.parametrize("case", list(RULE_CASES))
def test_custom_rules_are_audited_on_both_sides_of_the_table(evidence, case):
    """Custom JVP, forward and backward rules are traced at any depth and judged at their offending
    line, 10 cases."""
    fn, rule_fn, primitive, path, rule = RULE_CASES[case]
    audit = jaxpr_audit.audit(fn, (X4,), jaxpr_audit.Policy(modes=("vjp",), float_dtype="float32"))
    line = _offending_line(rule_fn)
    where = f"test_stage_3_jaxpr.py:{line}:"
    # The rule was traced: the primitive of its offending line is among its equations,
    # at the rule's path, located on that line.
    traced = [
        e
        for e in audit.rule_equations
        if e.primitive == primitive and e.path == path and where in e.source
    ]
    # The primal program alone holds no such primitive: only the rule can explain it.
    in_primal = [e for e in audit.equations if e.primitive == primitive]
    if rule is None:
        verdict_ok = audit.accepted
    else:
        verdict_ok = not audit.accepted and any(
            f.rule == rule and f.primitive == primitive and f.path == path and where in f.source
            for f in audit.findings
        )
    assert evidence.record(
        "custom rule audited",
        case,
        {
            "verdict": "accepted" if audit.accepted else "rejected",
            "findings": [(f.rule, f.primitive, f.path, f.source) for f in audit.findings],
            "rule_counts": audit.rule_counts,
        },
        {"rule": rule, "primitive": primitive, "path": path, "line": line},
        bool(traced) and not in_primal and verdict_ok,
    )


@pytest.mark.claims("custom-rules-audited")
def test_inspect_rejects_a_custom_rule_the_primal_program_hides(tmp_path):
    """inspect rejects top_k and callback rules hidden in custom rules (exit 1) and accepts a sort
    rule (exit 0)."""
    out = tmp_path / "a.json"
    for target, code, text in [
        ("test_stage_3_jaxpr:jvp_rule_uses_top_k", 1, "REJECT unknown-primitive: `top_k`"),
        ("test_stage_3_jaxpr:vjp_rule_calls_back", 1, "REJECT host-callback: `pure_callback`"),
        ("test_stage_3_jaxpr:jvp_rule_sorts", 0, "verdict: accepted"),
    ]:
        result = CliRunner().invoke(
            main, ["inspect", target, "--shape", "4", "--modes", "vjp", "--out", str(out)]
        )
        assert result.exit_code == code, result.output
        assert text in result.output
        assert "Traceback" not in result.output


# Whether an equation is differentiated is inherited down every level of nesting: below a
# `custom_jvp_call` or `custom_vjp_call` nothing is differentiated by JAX (its rules stand
# in for it), however deep (inside `jit`, `scan`, a branch, or two of them), and a custom
# rule's own equations are evaluated, not differentiated. Without a custom rule the same
# `while` is differentiated wherever it sits, and a reverse-mode policy must refuse it.
# Each nesting is written out below; the verdict and the path of the `while` are written
# by hand from that rule (the walker's docstring, the README), and the verdict is checked
# against JAX itself: `grad` of every program the audit refuses raises, of every program
# it accepts traces. (`jax.jit` is the `jit` primitive, once named `pjit`.)


def _counts_up(c):
    return jax.lax.while_loop(lambda c: c[0] < 10.0, lambda c: c * 1.5 + 1.0, c)


def _unchanged(c):
    return c * 1.0


def _loop_in_jit(x):
    return jax.jit(_counts_up)(x)


def _loop_in_scan(x):
    def body(carry, _):
        return _counts_up(carry), None

    return jax.lax.scan(body, x, None, length=2)[0]


def _loop_in_cond(x):
    # The loop is the branch taken when the predicate holds: `cond.branches[1]`.
    return jax.lax.cond(x[0] > 0.0, _counts_up, _unchanged, x)


def _loop_in_scan_in_jit(x):
    return jax.jit(_loop_in_scan)(x)


def _loop_in_cond_in_scan(x):
    def body(carry, _):
        return _loop_in_cond(carry), None

    return jax.lax.scan(body, x, None, length=2)[0]


def _loop_in_jit_in_cond(x):
    return jax.lax.cond(x[0] > 0.0, _loop_in_jit, _unchanged, x)


def _behind_custom_vjp(body):
    """`body` as the primal of a custom_vjp: JAX differentiates the rules, never `body`."""
    f = jax.custom_vjp(body)
    f.defvjp(lambda x: (f(x), None), lambda _, g: (g,))
    return f


def _behind_custom_jvp(body):
    """`body` as the primal of a custom_jvp: JAX differentiates the rule, never `body`."""
    f = jax.custom_jvp(body)
    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0]))
    return f


def _in_backward_rule(body):
    """A custom_vjp whose backward rule runs `body` on the cotangent."""
    f = jax.custom_vjp(_unchanged)
    f.defvjp(lambda x: (f(x), None), lambda _, g: (body(g),))
    return f


def _in_jvp_rule(body):
    """A custom_jvp whose JVP rule computes its primal output with `body`."""
    f = jax.custom_jvp(_unchanged)
    f.defjvp(lambda primals, tangents: (body(primals[0]), tangents[0]))
    return f


_VJP_OF_SCAN = _behind_custom_vjp(_loop_in_scan)
_JVP_OF_COND = _behind_custom_jvp(_loop_in_cond)


def _custom_vjp_in_jit(x):
    return jax.jit(_VJP_OF_SCAN)(x)


def _custom_jvp_in_scan(x):
    def body(carry, _):
        return _JVP_OF_COND(carry), None

    return jax.lax.scan(body, x, None, length=2)[0]


_V = "custom_vjp_call.call_jaxpr"
_J = "custom_jvp_call.call_jaxpr"
# case -> (program, where its `while` is listed: "program" for `Audit.equations`, "rule"
# for `Audit.rule_equations`; the path of the `while`; whether reverse mode refuses it)
NESTED_LOOP_CASES = {
    # No custom rule: JAX differentiates the loop, at every depth.
    "plain-direct": (_counts_up, "program", "", True),
    "plain-jit": (_loop_in_jit, "program", "jit.jaxpr", True),
    "plain-scan": (_loop_in_scan, "program", "scan.jaxpr", True),
    "plain-cond": (_loop_in_cond, "program", "cond.branches[1]", True),
    "plain-jit-scan": (_loop_in_scan_in_jit, "program", "jit.jaxpr/scan.jaxpr", True),
    "plain-scan-cond": (_loop_in_cond_in_scan, "program", "scan.jaxpr/cond.branches[1]", True),
    "plain-cond-jit": (_loop_in_jit_in_cond, "program", "cond.branches[1]/jit.jaxpr", True),
    # The same loops as a custom_vjp's primal body: never differentiated.
    "vjp-direct": (_behind_custom_vjp(_counts_up), "program", _V, False),
    "vjp-jit": (_behind_custom_vjp(_loop_in_jit), "program", f"{_V}/jit.jaxpr", False),
    "vjp-scan": (_VJP_OF_SCAN, "program", f"{_V}/scan.jaxpr", False),
    "vjp-cond": (_behind_custom_vjp(_loop_in_cond), "program", f"{_V}/cond.branches[1]", False),
    "vjp-jit-scan": (
        _behind_custom_vjp(_loop_in_scan_in_jit),
        "program",
        f"{_V}/jit.jaxpr/scan.jaxpr",
        False,
    ),
    "vjp-scan-cond": (
        _behind_custom_vjp(_loop_in_cond_in_scan),
        "program",
        f"{_V}/scan.jaxpr/cond.branches[1]",
        False,
    ),
    "vjp-cond-jit": (
        _behind_custom_vjp(_loop_in_jit_in_cond),
        "program",
        f"{_V}/cond.branches[1]/jit.jaxpr",
        False,
    ),
    # The same loops as a custom_jvp's primal body.
    "jvp-direct": (_behind_custom_jvp(_counts_up), "program", _J, False),
    "jvp-jit": (_behind_custom_jvp(_loop_in_jit), "program", f"{_J}/jit.jaxpr", False),
    "jvp-scan": (_behind_custom_jvp(_loop_in_scan), "program", f"{_J}/scan.jaxpr", False),
    "jvp-cond": (_JVP_OF_COND, "program", f"{_J}/cond.branches[1]", False),
    "jvp-jit-scan": (
        _behind_custom_jvp(_loop_in_scan_in_jit),
        "program",
        f"{_J}/jit.jaxpr/scan.jaxpr",
        False,
    ),
    "jvp-scan-cond": (
        _behind_custom_jvp(_loop_in_cond_in_scan),
        "program",
        f"{_J}/scan.jaxpr/cond.branches[1]",
        False,
    ),
    "jvp-cond-jit": (
        _behind_custom_jvp(_loop_in_jit_in_cond),
        "program",
        f"{_J}/cond.branches[1]/jit.jaxpr",
        False,
    ),
    # The custom call itself nested: what is above it does not matter.
    "jit-vjp-scan": (_custom_vjp_in_jit, "program", f"jit.jaxpr/{_V}/scan.jaxpr", False),
    "scan-jvp-cond": (
        _custom_jvp_in_scan,
        "program",
        f"scan.jaxpr/{_J}/cond.branches[1]",
        False,
    ),
    # The loop nested inside a rule: a rule is evaluated, not differentiated.
    "bwd-rule-jit": (
        _in_backward_rule(_loop_in_jit),
        "rule",
        "custom_vjp_call.bwd_rule/jit.jaxpr",
        False,
    ),
    "bwd-rule-cond-jit": (
        _in_backward_rule(_loop_in_jit_in_cond),
        "rule",
        "custom_vjp_call.bwd_rule/cond.branches[1]/jit.jaxpr",
        False,
    ),
    "jvp-rule-scan": (
        _in_jvp_rule(_loop_in_scan),
        "rule",
        "custom_jvp_call.jvp_rule/scan.jaxpr",
        False,
    ),
    "jvp-rule-jit-scan": (
        _in_jvp_rule(_loop_in_scan_in_jit),
        "rule",
        "custom_jvp_call.jvp_rule/jit.jaxpr/scan.jaxpr",
        False,
    ),
}


def _grad_refusal(fn) -> str | None:
    """JAX's own answer: the error that tracing `grad` of `fn` raises, None if it traces."""
    try:
        jax.make_jaxpr(jax.grad(lambda y: jnp.sum(fn(y))))(X4)
    except ValueError as err:
        return str(err).strip().splitlines()[0]
    return None


@pytest.mark.claims("walk-differentiated-inherited", "walk-nesting-paths", "check-mode-unsupported")
@pytest.mark.parametrize("case", list(NESTED_LOOP_CASES))
def test_while_loop_exemption_is_inherited_at_every_depth(evidence, case):
    """A while below a custom call or in a rule passes reverse mode at any depth; without one it is
    refused at every depth.

    Below a custom call every equation is undifferentiated, above it every one
    differentiated, and a rule's are never; a refused loop is the only finding,
    at its path and line, it passes a forward-mode policy, and `grad` refuses
    it too."""
    fn, where, path, refused = NESTED_LOOP_CASES[case]
    reverse = jaxpr_audit.audit(fn, (X4,), jaxpr_audit.Policy(modes=("vjp",)))
    listed = reverse.equations if where == "program" else reverse.rule_equations
    line = _call_line(_counts_up)
    at = f"test_stage_3_jaxpr.py:{line}:"
    loops = [e for e in listed if e.primitive == "while" and e.path == path and at in e.source]
    findings = [(f.rule, f.primitive, f.path) for f in reverse.findings]
    expected = [("mode-unsupported", "while", path)] if refused else []
    located = all(at in f.source and "(_counts_up)" in f.source for f in reverse.findings)
    flags = [(e.primitive, e.path, e.differentiated) for e in reverse.equations]
    flags_ok = all(e.differentiated == ("custom_" not in e.path) for e in reverse.equations)
    rule_flags_ok = not any(e.differentiated for e in reverse.rule_equations)
    grad_error = _grad_refusal(fn)
    jax_agrees = (grad_error is not None) == refused and (
        not refused or "Reverse-mode differentiation does not work" in grad_error
    )
    forward_ok = True
    if refused:  # the refusal is reverse mode's alone: forward mode passes, in JAX too
        forward_ok = jaxpr_audit.audit(fn, (X4,), jaxpr_audit.Policy(modes=("jvp",))).accepted
        jax.make_jaxpr(lambda y: jax.jvp(fn, (y,), (y,)))(X4)
    assert evidence.record(
        "while exemption inherited",
        case,
        {
            "findings": findings,
            "loops_found": len(loops),
            "differentiated": flags,
            "rule_differentiated": [e.differentiated for e in reverse.rule_equations],
            "grad_error": grad_error,
        },
        {"expected_findings": expected, "while_path": path, "line": line},
        len(loops) == 1
        and findings == expected
        and located
        and flags_ok
        and rule_flags_ok
        and jax_agrees
        and forward_ok,
    )


def _normal_from(x, key):
    return x + jax.random.normal(key, x.shape, x.dtype)


def _split_from(x, key):
    return x + jax.random.key_data(jax.random.split(key)).sum().astype(x.dtype)


def _fold_in_from(x, key):
    return x + jax.random.key_data(jax.random.fold_in(key, 3)).sum().astype(x.dtype)


def _normal_from_own_key(x, key):
    return x + jax.random.normal(jax.random.key(0), x.shape, x.dtype)


# (function, the key it is given, the random primitives its program holds, by name).
# A key passed in (typed or raw) shows no `random_seed`: only the draw itself does.
RANDOM_SOURCES = [
    ("typed-key-passed-in", _normal_from, jax.random.key(1), {"random_bits"}),
    ("raw-key-passed-in", _normal_from, jax.random.PRNGKey(1), {"random_bits"}),
    ("split-of-key-passed-in", _split_from, jax.random.key(1), {"random_split"}),
    ("fold-in-of-key-passed-in", _fold_in_from, jax.random.key(1), {"random_fold_in"}),
    ("key-made-inside", _normal_from_own_key, jax.random.key(1), {"random_seed", "random_bits"}),
]


@pytest.mark.claims("check-random-in-deterministic")
@pytest.mark.parametrize(
    ("fn", "key", "drawn"), [r[1:] for r in RANDOM_SOURCES], ids=[r[0] for r in RANDOM_SOURCES]
)
def test_every_random_primitive_is_refused_whoever_made_the_key(evidence, fn, key, drawn):
    """A deterministic policy refuses each random primitive by name, whether the key is
    made inside the function or passed in; a non-deterministic policy refuses none."""
    named = {
        f.reason.split("`")[1]
        for f in jaxpr_audit.audit(fn, (X4, key), F32).findings
        if f.rule == "random-in-deterministic"
    }
    relaxed = jaxpr_audit.audit(
        fn, (X4, key), jaxpr_audit.Policy(float_dtype="float32", deterministic=False)
    )
    assert evidence.record(
        "random primitives refused by name",
        fn.__name__,
        {"named": sorted(named), "relaxed_accepted": relaxed.accepted},
        {"drawn": sorted(drawn)},
        named == drawn and relaxed.accepted,
    ), (named, drawn)


def _through_complex128(x):
    return (x.astype(jnp.complex128) * 2).real.astype(jnp.float32)


@pytest.mark.claims("check-dtype-policy")
def test_complex128_is_refused_under_a_float32_policy_like_float64(evidence):
    """A complex128 value (64-bit float parts) is wide under a float32 policy: the cast into it
    and the product are each refused by name; with no float policy neither is."""
    wide = {
        f.reason.split("`")[1]
        for f in jaxpr_audit.audit(_through_complex128, (X4,), F32).findings
        if f.rule == "dtype-policy" and "`complex128" in f.reason
    }
    relaxed = jaxpr_audit.audit(
        _through_complex128, (X4,), jaxpr_audit.Policy(float_dtype=None)
    ).findings
    assert evidence.record(
        "complex128 refused under a float32 policy",
        "float32 -> complex128 -> real -> float32",
        {"refused": sorted(wide), "relaxed_rules": sorted({f.rule for f in relaxed})},
        {"refused": ["convert_element_type", "mul"]},
        wide == {"convert_element_type", "mul"}
        and not any(f.rule == "dtype-policy" for f in relaxed),
    ), (wide, relaxed)


def _sort_by(keys_dtype, payload_dtype):
    """A two-operand sort whose keys and payload are cast in: its equation has two outputs."""

    def fn(x):
        keys, payload = jax.lax.sort((x.astype(keys_dtype), x.astype(payload_dtype)), num_keys=1)
        return keys.astype(jnp.float32) + payload.astype(jnp.float32)

    return fn


@pytest.mark.claims("check-dtype-policy")
@pytest.mark.parametrize(
    ("keys_dtype", "payload_dtype", "sort_refused"),
    [
        (jnp.float32, jnp.float32, False),
        (jnp.float64, jnp.float32, True),
        (jnp.float32, jnp.float64, True),
    ],
    ids=["both-float32", "wide-first-output", "wide-second-output"],
)
def test_a_wide_dtype_in_any_output_of_an_equation_is_refused(
    evidence, keys_dtype, payload_dtype, sort_refused
):
    """Under a float32 policy `sort` is refused whichever of its two outputs is float64, and
    accepted when both are float32 (the control)."""
    findings = jaxpr_audit.audit(_sort_by(keys_dtype, payload_dtype), (X4,), F32).findings
    refused = sorted({f.primitive for f in findings if f.rule == "dtype-policy"})
    observed = {"refused": refused}
    ok = ("sort" in refused) is sort_refused
    assert evidence.record(
        "a float64 output refused wherever it sits among an equation's outputs",
        f"sort keys {jnp.dtype(keys_dtype).name}, payload {jnp.dtype(payload_dtype).name}",
        observed,
        {"sort_refused": sort_refused},
        ok,
    ), observed


@pytest.mark.claims("jaxpr-walk-and-reject")
@pytest.mark.parametrize("transform", ["plain", "grad"])
def test_a_checkpointed_program_is_walked_not_flagged_unknown(evidence, transform):
    """`jax.checkpoint` (the `remat2` primitive in this JAX) is a documented call: the
    audit walks into its body and reports nothing for a clean float32 program, plain and
    under `grad` (whose backward pass rematerialises the body).

    Changed condition: the same body without `jax.checkpoint` gives the same leaf
    primitives and no findings either, so the wrapper alone is what is judged."""
    body = lambda y: jnp.sin(y) * 2.0  # noqa: E731
    wrapped = jax.checkpoint(body)

    def program(fn):
        plain = lambda y: jnp.cos(fn(y))  # noqa: E731
        return plain if transform == "plain" else jax.grad(lambda y: jnp.sum(plain(y)))

    result = jaxpr_audit.audit(program(wrapped), (X4,), F32)
    bare = jaxpr_audit.audit(program(body), (X4,), F32)
    names = [e.primitive for e in result.equations]
    leaves = {n for n in names if n not in {"remat2", "remat", "checkpoint", "pjit", "jit"}}
    bare_leaves = {e.primitive for e in bare.equations} - {"pjit", "jit"}
    observed = {
        "findings": [f.rule for f in result.findings],
        "wrapper_seen": any(n in {"remat2", "remat", "checkpoint"} for n in names),
        "body_walked": "sin" in leaves,
        "same_leaves_as_unwrapped": leaves == bare_leaves,
    }
    assert evidence.record(
        "jax.checkpoint program: walked into, no findings",
        f"cos(checkpoint(sin(y) * 2)), {transform}",
        observed,
        None,
        observed
        == {
            "findings": [],
            "wrapper_seen": True,
            "body_walked": True,
            "same_leaves_as_unwrapped": True,
        }
        and not bare.findings,
    ), observed
