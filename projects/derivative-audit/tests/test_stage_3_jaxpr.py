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


def test_walker_counts_every_nested_equation(evidence):
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


def _printed_counts(fn, x) -> dict[str, int]:
    """Counts of `name` in every `outputs = name[...] inputs` line of JAX's printed jaxpr."""
    text = str(jax.make_jaxpr(fn)(x))
    return dict(collections.Counter(re.findall(r" = ([a-z_][a-z0-9_-]*)", text)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_suite_counts_match_the_printed_jaxpr_and_are_documented(evidence, dtype):
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


def test_shapes_and_dtypes_follow_vmap(evidence):
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


@pytest.mark.parametrize(
    ("fn", "rule", "policy", "complement"), REJECTIONS, ids=[r[1] for r in REJECTIONS]
)
def test_unsupported_programs_are_rejected_with_reason_and_location(
    evidence, fn, rule, policy, complement
):
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


def test_implicit_solver_hides_its_while_loop_from_reverse_mode(evidence):
    """The while loop inside the custom_vjp is not differentiated by JAX: accepted
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


@pytest.mark.parametrize(
    "name", ["matmul_chain", "softmax", "scan_recurrence", "fixed_point_solver"]
)
def test_suite_audit_is_consistent_under_jit_vmap_grad(evidence, name):
    p = data.make_problem(name, Config.tiny(), "float32")
    result = jaxpr_audit.consistency(p.fn, p.x, F32)
    assert evidence.record(
        "consistent under jit/vmap/grad",
        name,
        result,
        None,
        result["consistent"] and result["plain"]["verdict"] == "accepted",
    )


@pytest.mark.parametrize(
    "fn", [with_callback, with_while, with_float64, with_random], ids=lambda f: f.__name__
)
def test_rejections_are_consistent_under_jit_vmap_grad(evidence, fn):
    result = jaxpr_audit.consistency(fn, X4, F32)
    assert evidence.record(
        "consistent under jit/vmap/grad",
        fn.__name__,
        result,
        None,
        result["consistent"] and result["plain"]["verdict"] == "rejected",
    )


def test_an_untraceable_function_is_a_clear_error():
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
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a.json")])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
