"""Bad input: every `derivative-audit` command, and every library entry point a learner
calls with a file, an array or a config, refuses damaged input with one precise message.

CLI promise: exit code 2 (the project's `BadInput`, or click's own usage error), one
line naming the file, field or value, no traceback (`result.exception` is None or
`SystemExit`), and nothing written (the watched folder, which is also the working
directory, has the same file names and bytes before and after). Library promise: a
`ValueError` (the project's errors subclass it) whose message names the field or value.

The damage is drawn by hypothesis (kind, field, value) or enumerated where a table is
clearer. Nothing here audits, trains or benchmarks a valid input: every case fails at
the input it damages, before any work. Positive controls (the same calls with the damage
removed succeed) live in the stage tests. The case count goes to
`evidence/bad_input.json` at module end.
"""

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from derivative_audit import (
    audit,
    bench,
    checkpoint,
    checks,
    data,
    jaxpr_audit,
    model,
    report,
    rules,
)
from derivative_audit.cli import main
from derivative_audit.config import Config, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
FEW = settings(max_examples=6, derandomize=True, deadline=None, database=None)
SOME = settings(max_examples=25, derandomize=True, deadline=None, database=None)

LEDGER: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}

# Every command of the group. The final test compares this table, and what ran, with
# the commands the click group itself holds, so a new command without cases fails.
COVERED_COMMANDS = {"audit", "inspect", "report", "bench"}


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "cases": LEDGER["cases"],
        "tracebacks": LEDGER["tracebacks"],
        "commands": sorted(LEDGER["commands"]),
        "entry_points": sorted(LEDGER["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(record, indent=1) + "\n")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a directory)."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def check_cli(args: list[str], watch: Path, token: str) -> None:
    """`derivative-audit ARGS`, run inside `watch`, must refuse with exit 2 and one line
    naming `token`, and write nothing there (default outputs go under `./runs`)."""
    before = _snapshot(watch)
    cwd = os.getcwd()
    os.chdir(watch)
    try:
        result = CliRunner().invoke(main, args)
    finally:
        os.chdir(cwd)
    LEDGER["cases"] += 1
    LEDGER["commands"].add(args[0])
    crashed = not (result.exception is None or isinstance(result.exception, SystemExit))
    LEDGER["tracebacks"] += int(crashed or "Traceback" in result.output)
    assert not crashed, f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert "Traceback" not in result.output
    assert result.exit_code == 2, (args, result.output)
    lines = [
        line
        for line in result.output.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try "))
    ]
    assert len(lines) == 1, (args, result.output)
    assert token in lines[0], (args, token, result.output)
    assert _snapshot(watch) == before, (args, "the command wrote files")


def check_api(name: str, call, token: str) -> None:
    """`call()` must raise a ValueError whose message names `token`."""
    LEDGER["cases"] += 1
    LEDGER["entry_points"].add(name)
    with pytest.raises(ValueError, match=re.escape(token)):
        call()


# --- configs: `audit --config`, `report --config`, `load_config`, `Config` ------------

BAD_FIELD_VALUES: dict[str, list[Any]] = {
    "seed": [-1, 2**32, 1.5, "0", True, None, NAN],
    "n": [0, 1, 257, -3, 2.5, "8", INF],
    "scan_length": [0, 1001, -1],
    "solver_iterations": [0, 1001],
    "directions": [0, 65, 1.0],
    "sweep_min_exponent": [-17, -1, 0.5],
    "sweep_max_exponent": [1, -11, None],
    "sweep_points_per_decade": [0, 11],
    "train_steps": [0, 10_001, NAN],
}
TINY = json.loads(Config.tiny().to_json())


@st.composite
def damaged_config(draw) -> tuple[str, bytes | None, str]:
    """(kind, file bytes or None for no file, the token the message must name)."""
    kind = draw(
        st.sampled_from(
            [
                "missing",
                "directory",
                "empty",
                "truncated",
                "non_utf8",
                "not_json",
                "wrong_type",
                "unknown_field",
                "bad_value",
                "narrow_sweep",
            ]
        )
    )
    text = json.dumps(TINY)
    if kind in ("missing", "directory"):
        return kind, None, "config.json"
    if kind == "empty":
        return kind, b"", "config.json"
    if kind == "truncated":
        cut = draw(st.integers(1, len(text) - 2))
        return kind, text[:cut].encode(), "config.json"
    if kind == "non_utf8":
        return kind, b"\xff\xfe" + text.encode("utf-16-le"), "config.json"
    if kind == "not_json":
        return kind, b"seed = 0\nn = 5\n", "config.json"
    if kind == "wrong_type":
        value = draw(st.sampled_from([[1, 2], "tiny", 3, None, True]))
        return kind, json.dumps(value).encode(), "config.json"
    if kind == "unknown_field":
        name = draw(st.sampled_from(["width", "steps", "Seed", "dtype"]))
        return kind, json.dumps({**TINY, name: 1}).encode(), name
    if kind == "narrow_sweep":
        low = draw(st.integers(-10, -5))
        high = draw(st.integers(low + 1, min(low + 3, -2)))
        config = {**TINY, "sweep_min_exponent": low, "sweep_max_exponent": high}
        return kind, json.dumps(config).encode(), "sweep_min_exponent"
    field = draw(st.sampled_from(sorted(BAD_FIELD_VALUES)))
    value = draw(st.sampled_from(BAD_FIELD_VALUES[field]))
    return kind, json.dumps({**TINY, field: value}).encode(), field


@SOME
@given(damage=damaged_config())
def test_damaged_config_is_refused_by_every_reader(damage):
    kind, content, token = damage
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "config.json"
        if kind == "directory":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        check_api("load_config", lambda: load_config(path), token)
        if content is not None:
            text = content.decode("utf-8", errors="replace")
            check_api("Config.from_json", lambda: Config.from_json(text, str(path)), token)
        check_cli(["audit", "elementwise", "--config", str(path)], root, token)
        check_cli(["report", "--config", str(path), "--workdir", str(root / "r")], root, token)


@pytest.mark.parametrize("field", sorted(BAD_FIELD_VALUES))
def test_bad_field_is_refused_by_the_config_constructor(field):
    for value in BAD_FIELD_VALUES[field]:
        check_api("Config", lambda v=value: Config(**{**TINY, field: v}), field)


# --- output paths: `audit --workdir`, `report --workdir`, `inspect --out`, `bench --out` --

OUTPUT_CASES = [
    (["audit", "elementwise", "--workdir"], "directory"),
    (["report", "--config", "CONFIG", "--workdir"], "directory"),
    (["inspect", "jax.numpy:tanh", "--shape", "3", "--out"], "file"),
    (["bench", "--size", "tiny", "--out"], "file"),
]


@pytest.mark.parametrize("damage", ["wrong kind", "parent is a file"])
@pytest.mark.parametrize(("args", "kind"), OUTPUT_CASES, ids=lambda a: str(a)[:20])
def test_unusable_output_path_is_refused_before_any_work(tmp_path, args, kind, damage):
    config = tmp_path / "tiny.json"
    config.write_text(Config.tiny().to_json())
    blocker = tmp_path / "blocker"
    if damage == "wrong kind" and kind == "file":
        blocker.mkdir()  # a directory where the file goes
        target = blocker
    else:
        blocker.write_text("not a directory\n")
        target = blocker if damage == "wrong kind" else blocker / "out.json"
    argv = [str(config) if a == "CONFIG" else a for a in args] + [str(target)]
    check_cli(argv, tmp_path, "blocker")


def test_unusable_output_path_is_refused_by_the_writers(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    check_api(
        "checkpoint.save_record", lambda: checkpoint.save_record(blocker / "r.json", {}), "blocker"
    )
    check_api("report.build", lambda: report.build(Config.tiny(), blocker / "run"), "blocker")
    check_api("bench.write", lambda: bench.write({}, blocker / "b.json"), "blocker")
    check_cli(["bench", "--size", "tiny", "--out", ""], tmp_path, "--out")


# --- dtypes: `audit --dtype` (float64 or float32), `inspect --dtype` (any JAX dtype) ------

NOT_JAX_DTYPES = ["float128", "complex256", "str", "object", "U5", "S3", "V8", "M8", "m8"]
NOT_DTYPES = ["bogus", "", "(", "i4,", "float64[", "a\x00b"]


def _token(value: str) -> str:
    return value if value.isprintable() and value else "dtype"


@pytest.mark.parametrize(
    "name", NOT_JAX_DTYPES + NOT_DTYPES + ["int32", "bool", "complex64", "float16", "bfloat16"]
)
def test_audit_refuses_every_dtype_but_float64_and_float32(tmp_path, name):
    check_cli(["audit", "elementwise", "--dtype", name], tmp_path, _token(name))


@pytest.mark.parametrize("name", NOT_JAX_DTYPES + NOT_DTYPES)
def test_inspect_refuses_a_dtype_jax_has_no_arrays_of(tmp_path, name):
    check_cli(["inspect", "jax.numpy:tanh", "--dtype", name], tmp_path, _token(name))


def _numpy_knows(name: str) -> bool:
    try:
        np.dtype(name)
    except (TypeError, ValueError):
        return False
    return True


@FEW
@given(name=st.text(max_size=6).filter(lambda t: not _numpy_knows(t)))
def test_a_name_numpy_does_not_know_is_refused_by_both(name):
    with tempfile.TemporaryDirectory() as tmp:
        for command in (["audit", "elementwise"], ["inspect", "jax.numpy:tanh"]):
            check_cli([*command, "--dtype", name], Path(tmp), "dtype")


# --- functions: `audit FUNCTION`, `inspect TARGET` --------------------------------------


@jax.custom_vjp
def bad_bwd_structure(x):
    return jnp.sin(x)


def _bad_bwd_structure_fwd(x):
    return jnp.sin(x), x


def _bad_bwd_structure_bwd(x, g):
    return (g, g)  # two cotangents for one input: JAX cannot trace this rule


bad_bwd_structure.defvjp(_bad_bwd_structure_fwd, _bad_bwd_structure_bwd)

# (spec, token); every one of them is refused by both commands.
BAD_TARGETS = [
    ("a:", "a:"),
    (":f", ":f"),
    ("no_such_module_xyz:f", "no_such_module_xyz"),
    (".relative:f", ".relative"),
    ("jax.numpy:no_such_function", "no_such_function"),
    ("jax.numpy:pi", "pi"),
    ("numpy:asarray", "not JAX-traceable"),
    ("json:dumps", "dumps"),
    ("jax.numpy:matmul", "matmul"),
    ("jax.numpy:trace", "trace"),
]
# Refused by `audit` only: `inspect` audits a program whatever it returns.
BAD_DERIVATIVE_TARGETS = [
    ("jax.numpy:argsort", "int64"),
    ("jax.numpy:isfinite", "bool"),
    ("jax.numpy:diag", "diag"),
    ("jax.numpy:log", "NaN"),
    ("jax.numpy:arccosh", "NaN"),
    ("no_such_suite_function", "no_such_suite_function"),
]


@pytest.mark.parametrize(("spec", "token"), BAD_TARGETS + BAD_DERIVATIVE_TARGETS)
def test_audit_refuses_a_function_it_cannot_differentiate(tmp_path, spec, token):
    check_cli(["audit", spec, "--shape", "4"], tmp_path, token)


@pytest.mark.parametrize(
    ("spec", "token"),
    [*BAD_TARGETS, ("test_bad_input:bad_bwd_structure", "custom derivative rule")],
)
def test_inspect_refuses_a_program_it_cannot_trace(tmp_path, spec, token):
    check_cli(["inspect", spec, "--shape", "4"], tmp_path, token)


@FEW
@given(name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
def test_an_unknown_suite_name_is_refused(name):
    with tempfile.TemporaryDirectory() as tmp:
        check_cli(["audit", f"zz_{name}"], Path(tmp), f"zz_{name}")


# --- shapes and modes ------------------------------------------------------------------

BAD_SHAPES = ["0", "-1", "a", "", "3,,4", "1e3", "4,0", "99999999999"]


@pytest.mark.parametrize("text", [*BAD_SHAPES, "3,4", "4097"])
def test_audit_refuses_a_shape_that_is_not_a_small_vector(tmp_path, text):
    check_cli(["audit", "jax.numpy:sin", "--shape", text], tmp_path, text or "--shape")


@pytest.mark.parametrize("text", BAD_SHAPES)
def test_inspect_refuses_a_shape_that_is_not_positive_sizes(tmp_path, text):
    check_cli(["inspect", "jax.numpy:tanh", "--shape", text], tmp_path, text or "--shape")


@FEW
@given(sizes=st.lists(st.integers(-3, 4), min_size=1, max_size=4).filter(lambda s: min(s) < 1))
def test_a_shape_with_a_size_below_one_is_refused(sizes):
    text = ",".join(map(str, sizes))
    with tempfile.TemporaryDirectory() as tmp:
        check_cli(["inspect", "jax.numpy:tanh", "--shape", text], Path(tmp), text)


@pytest.mark.parametrize(
    ("modes", "token"),
    [("sideways", "sideways"), ("", "--modes"), (",", "--modes"), ("jvp;vjp", "jvp;vjp")],
)
def test_inspect_refuses_unknown_modes(tmp_path, modes, token):
    check_cli(["inspect", "jax.numpy:tanh", "--modes", modes], tmp_path, token)


# --- click's own usage errors, one per command ------------------------------------------


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["audit"], "FUNCTION"),
        (["audit", "elementwise", "--bogus"], "--bogus"),
        (["inspect"], "TARGET"),
        (["inspect", "jax.numpy:tanh", "--float-policy", "float16"], "float16"),
        (["report", "--bogus"], "--bogus"),
        (["report", "--config"], "--config"),
        (["bench", "--size", "huge"], "huge"),
        (["bench", "--rounds", "0"], "--rounds"),
        (["bench", "--rounds", "201"], "--rounds"),
        (["bench", "--rounds", "x"], "--rounds"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, args, token):
    check_cli(args, tmp_path, token)


# --- arrays: the stage-1 checks and the audit of one problem ----------------------------

X = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float64)
U = jnp.full((4,), 0.5, jnp.float64)


def _damage(array: jax.Array, kind: str) -> jax.Array:
    return {
        "nan": array.at[1].set(jnp.nan),
        "inf": array.at[0].set(-jnp.inf),
        "int": jnp.arange(array.shape[0], dtype=jnp.int32),
        "empty": jnp.zeros((0,), array.dtype),
        "shape": jnp.zeros((array.shape[0] + 1,), array.dtype),
        "float32": array.astype(jnp.float32),
    }[kind]


# Which checks take which argument, as `name(x, u, w)` calls on `jnp.sin`.
CHECK_CALLS = {
    "checks.jvp_linearity": lambda x, u, w: checks.jvp_linearity(jnp.sin, x, u, U, 0.7, -1.3),
    "checks.dot_product_test": lambda x, u, w: checks.dot_product_test(jnp.sin, x, u, w),
    "checks.central_difference": lambda x, u, w: checks.central_difference(jnp.sin, x, u, 1e-5),
    "checks.fd_check": lambda x, u, w: checks.fd_check(jnp.sin, x, u),
    "checks.jacobian_agreement": lambda x, u, w: checks.jacobian_agreement(jnp.sin, x),
    "checks.second_opinion": lambda x, u, w: checks.second_opinion(jnp.sin, x),
    "checks.theory_step": lambda x, u, w: checks.theory_step(jnp.float64, x),
}
USES = {
    "checks.jvp_linearity": "xu",
    "checks.dot_product_test": "xuw",
    "checks.central_difference": "xu",
    "checks.fd_check": "xu",
    "checks.jacobian_agreement": "x",
    "checks.second_opinion": "x",
    "checks.theory_step": "x",
}


@st.composite
def damaged_check_call(draw) -> tuple[str, str, str]:
    name = draw(st.sampled_from(sorted(CHECK_CALLS)))
    argument = draw(st.sampled_from(USES[name]))
    kinds = ["nan", "inf", "int", "empty"] if argument == "x" else ["nan", "inf", "shape"]
    kinds += ["float32"] if argument != "x" else []
    return name, argument, draw(st.sampled_from(kinds))


@SOME
@given(case=damaged_check_call())
def test_every_check_refuses_a_damaged_point_or_direction(case):
    name, argument, kind = case
    args = {"x": X, "u": U, "w": U}
    args[argument] = _damage(args[argument], kind)
    if kind in ("int", "empty") and argument == "x":
        token = "`x`"
    else:
        token = f"`{argument}`"
    check_api(name, lambda: CHECK_CALLS[name](args["x"], args["u"], args["w"]), token)


@pytest.mark.parametrize("h", [0.0, -1e-3, NAN, INF, 1e-60])
def test_central_difference_refuses_a_step_it_cannot_take(h):
    x32, u32 = X.astype(jnp.float32), U.astype(jnp.float32)
    check_api(
        "checks.central_difference",
        lambda: checks.central_difference(jnp.sin, x32, u32, h),
        "`h`",
    )


def test_the_sweep_refuses_bad_steps_and_mismatched_errors():
    reference = np.cos(np.asarray(X)) * 0.5
    for steps, token in [
        (np.array([]), "steps"),
        (np.ones((2, 2)), "steps"),
        (np.array([1e-3, 0.0]), "`h`"),
    ]:
        check_api(
            "checks.fd_sweep", lambda s=steps: checks.fd_sweep(jnp.sin, X, U, s, reference), token
        )
    check_api(
        "checks.fd_sweep",
        lambda: checks.fd_sweep(jnp.sin, X, U, np.array([1e-3]), reference * NAN),
        "reference",
    )
    for steps, errors in [
        (np.ones(3), np.ones(2)),
        (np.array([]), np.array([])),
        (np.ones(2), np.array([1.0, NAN])),
    ]:
        check_api(
            "checks.analyse_sweep",
            lambda s=steps, e=errors: checks.analyse_sweep(s, e, jnp.float64, X),
            "errors" if len(steps) == 2 else "steps",
        )


def _problem(fn, x) -> data.Problem:
    return data.Problem("probe", fn, x, str(x.dtype))


@pytest.mark.parametrize(
    ("fn", "x", "token"),
    [
        (jnp.sin, jnp.arange(4, dtype=jnp.int32), "int32"),
        (jnp.sin, X.at[2].set(jnp.nan), "NaN"),
        (jnp.sin, jnp.zeros((0,), jnp.float64), "empty"),
        (jnp.sin, jnp.zeros((2, 2), jnp.float64), "vector"),
        (jnp.argsort, X, "int"),
        (jnp.outer, X, "probe"),
        (lambda y: jnp.outer(y, y), X, "vector"),
        (jnp.log, X, "NaN"),
    ],
)
def test_audit_problem_refuses_a_point_or_function_it_cannot_check(fn, x, token):
    check_api(
        "audit.audit_problem", lambda: audit.audit_problem(_problem(fn, x), Config.tiny()), token
    )


@pytest.mark.parametrize(
    ("call", "token"),
    [
        (lambda: data.make_problem("nope", Config.tiny()), "nope"),
        (lambda: data.make_problem("elementwise", Config.tiny(), "float16"), "float16"),
        (lambda: data.problem_from_callable("f", jnp.argsort, (4,), "float64", 0), "int64"),
        (lambda: data.problem_from_callable("f", jnp.diag, (4,), "float64", 0), "`f`"),
        (lambda: data.problem_from_callable("f", np.asarray, (4,), "float64", 0), "`f`"),
        (lambda: data.problem_from_callable("f", jnp.sin, (0,), "float64", 0), "(0,)"),
        (lambda: data.problem_from_callable("f", jnp.sin, (4,), "int32", 0), "int32"),
    ],
    ids=["unknown", "float16", "int-output", "matrix", "untraceable", "empty", "int-input"],
)
def test_problem_builders_refuse_what_the_checks_cannot_use(call, token):
    name = (
        "data.make_problem"
        if "make_problem" in call.__code__.co_names
        else "data.problem_from_callable"
    )
    check_api(name, call, token)


# --- the jaxpr audit --------------------------------------------------------------------


def _needs_a_number(x):
    return x * float(x[0])


@pytest.mark.parametrize(
    ("call", "token"),
    [
        (lambda: jaxpr_audit.audit(_needs_a_number, (X,)), "_needs_a_number"),
        (lambda: jaxpr_audit.audit(jnp.sin, X), "args"),
        (lambda: jaxpr_audit.audit(jnp.sin, (X,), "vjp"), "policy"),
        (lambda: jaxpr_audit.audit(jnp.matmul, (X,)), "matmul"),
        (lambda: jaxpr_audit.audit(jnp.trace, (X,)), "trace"),
        (lambda: jaxpr_audit.audit(bad_bwd_structure, (X,)), "_bad_bwd_structure_bwd"),
        (lambda: jaxpr_audit.Policy(modes=("sideways",)), "sideways"),
        (lambda: jaxpr_audit.Policy(modes="jvp"), "`j`"),
        (lambda: jaxpr_audit.Policy(float_dtype="float16"), "float16"),
    ],
)
def test_jaxpr_audit_refuses_what_it_cannot_trace(call, token):
    name = "jaxpr_audit.Policy" if "Policy" in call.__code__.co_names else "jaxpr_audit.audit"
    check_api(name, call, token)


# --- records (`checkpoint.load_record`) ------------------------------------------------


def _write_record(path: Path, content: bytes, digest: str | None) -> None:
    path.write_bytes(content)
    if digest is not None:
        (path.parent / (path.name + ".sha256")).write_text(digest + "\n")


def _sha(content: bytes) -> str:
    import hashlib

    return hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    "damage", ["missing", "no digest", "empty", "edited", "non-utf8", "not json", "a list"]
)
def test_damaged_record_is_refused(tmp_path, damage):
    path = tmp_path / "record.json"
    good = json.dumps({"a": 1}, indent=1).encode() + b"\n"
    content = {
        "no digest": good,
        "empty": b"",
        "edited": good.replace(b"1", b"2"),
        "non-utf8": b"\xff\xfe{}",
        "not json": b"{'a': 1}\n",
        "a list": b"[1, 2]\n",
    }.get(damage)
    if content is not None:
        digest = {
            "no digest": None,
            "empty": _sha(good),
            "edited": _sha(good),
            "non-utf8": _sha(good),
        }.get(damage, _sha(content))
        _write_record(path, content, digest)
    check_api("checkpoint.load_record", lambda: checkpoint.load_record(path), "record.json")


# --- the model, the rules and the bench -------------------------------------------------


@pytest.mark.parametrize(
    ("call", "token"),
    [
        (lambda: model.init(jax.random.key(0), 0, 4, 0.6), "`n`"),
        (lambda: model.init(jax.random.key(0), 4, -1, 0.6), "`d_in`"),
        (lambda: model.init(jax.random.key(0), 2.5, 4, 0.6), "`n`"),
        (lambda: model.init(jax.random.key(0), 4, 4, 1.0), "contraction"),
        (lambda: model.init(jax.random.key(0), 4, 4, NAN), "contraction"),
        (
            lambda: rules.fixed_point_implicit(model.init(jax.random.key(0), 4, 4, 0.6), X, 0),
            "max_iterations",
        ),
        (lambda: rules.hvp(lambda y: jnp.sum(y**2), X, U[:3]), "`v`"),
        (lambda: bench.run("huge"), "huge"),
        (lambda: bench.run("tiny", rounds=0), "rounds"),
    ],
    ids=[
        "n0",
        "d_in-1",
        "n2.5",
        "contraction1",
        "contraction-nan",
        "iters0",
        "hvp-v",
        "size",
        "rounds",
    ],
)
def test_model_rules_and_bench_refuse_bad_sizes(call, token):
    names = call.__code__.co_names
    name = next(n for n in ("fixed_point_implicit", "hvp", "run", "init") if n in names)
    check_api({"init": "model.init", "run": "bench.run"}.get(name, f"rules.{name}"), call, token)


# --- coverage: every command of the group has cases ------------------------------------


def test_every_command_of_the_group_is_covered():
    commands = set(main.commands)
    assert commands == COVERED_COMMANDS, sorted(commands ^ COVERED_COMMANDS)
    assert LEDGER["commands"] == commands, sorted(commands - LEDGER["commands"])
    assert LEDGER["tracebacks"] == 0
    assert LEDGER["cases"] >= 200, LEDGER["cases"]
