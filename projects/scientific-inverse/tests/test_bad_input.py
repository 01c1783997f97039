"""Bad input: every `scientific-inverse` command and the entry points a learner
calls with a file, an array or a config refuse a damaged input cleanly.

- CLI (in-process `CliRunner`): exit code 2, one `Error:` line naming the file,
  field or value, no traceback, and nothing written (the workspace's file
  names and bytes are equal before and after). The fit's study and the bench
  run are replaced by tripwires, so an input that is silently accepted fails
  the case instead of starting the work.
- Library: a `ValueError` subclass of the project (`ConfigError`,
  `ParameterError`, `CheckpointError`, `DataError`) whose message names the
  input; never a NaN result.

Cases are drawn by hypothesis (the damage, the field, the value) with a fixed
derandomized seed, plus enumerations where a list is clearer. The count goes to
`evidence/bad_input.json` when the module ends.
"""

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from scientific_inverse import bench as bench_module
from scientific_inverse import checkpoint, identifiability, sensitivity, solver, train
from scientific_inverse.checkpoint import CheckpointError
from scientific_inverse.cli import main
from scientific_inverse.config import Config, ConfigError, load_config
from scientific_inverse.data import DataError, fit_weights, synthesize
from scientific_inverse.model import OSCILLATOR, PENDULUM, ParameterError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FEW = settings(max_examples=30, derandomize=True, deadline=None, database=None)
TALLY: dict[str, Any] = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}
REAL_FIT = train.fit_and_evaluate
REAL_BENCH_RUN = bench_module.run
FIELDS = sorted(Config.model_fields)
# Invalid for every field of `Config` (strict: no string or null for a number, no
# number for a bool or a pair, every numeric field bounded well inside +-1e9).
GENERIC_BAD = [float("nan"), float("inf"), float("-inf"), "0.1", None, [], {}, -1e9, 1e9]


class Tripwire(AssertionError):
    """Raised when the work behind a command starts although its input was damaged."""


def _tripwire(name: str):
    def fire(*args: object, **kwargs: object) -> None:
        raise Tripwire(f"{name} started on a damaged input")

    return fire


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace every case runs in (cwd too, so default outputs land here)."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "a_file").write_text("not a folder\n")
    (root / "a_folder").mkdir()
    previous = os.getcwd()
    os.chdir(root)
    patch = pytest.MonkeyPatch()
    patch.setattr(train, "fit_and_evaluate", _tripwire("the fit study"))
    patch.setattr(bench_module, "run", _tripwire("the bench"))
    yield root
    patch.undo()
    os.chdir(previous)


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "cases": TALLY["cases"],
        "tracebacks": TALLY["tracebacks"],
        "commands": sorted(TALLY["commands"]),
        "entry_points": sorted(TALLY["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(payload, indent=1) + "\n")


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def cli(ws: Path, args: list[str], *needles: str) -> str:
    """Runs one damaged command; checks the refusal; returns its error line."""
    before = snapshot(ws)
    result = CliRunner().invoke(main, args)
    after = snapshot(ws)
    TALLY["cases"] += 1
    TALLY["commands"].add(args[0])
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    if crashed or "Traceback" in result.output:
        TALLY["tracebacks"] += 1
    assert not crashed, f"{args}: {result.exception!r}"
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], (args, result.output)
    for needle in needles:
        assert needle in errors[0], (args, needle, errors[0])
    assert after == before, f"{args} wrote {set(after) ^ set(before) or 'changed bytes'}"
    return errors[0]


def refused(entry_point: str, error: type[ValueError], needle: str, call, *args, **kwargs):
    """Calls a library entry point on a damaged input; it must raise `error` naming it."""
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry_point)
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    assert issubclass(error, ValueError)
    assert needle in str(info.value), (entry_point, needle, str(info.value))
    return str(info.value)


# --- damaged config files --------------------------------------------------------------

FILE_DAMAGE = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "not-json",
    "json-list",
    "json-string",
    "json-null",
    "folder",
]


def damaged_file(ws: Path, kind: str, name: str, good: str) -> Path:
    """`ws/<kind>-<name>`: a file with the damage `kind` (made from the good text), a
    folder, or nothing."""
    path = ws / f"{kind}-{name}"
    if kind == "folder":
        path.mkdir(exist_ok=True)
        return path
    if kind == "missing":
        return path
    content = {
        "empty": b"",
        "truncated": good.encode()[: len(good) // 2],
        "non-utf8": b"\xff\xfe{\x00\x93",
        "not-json": b"seed = 0\nmass = 1.0\n",
        "json-list": b"[1, 2, 3]",
        "json-string": b'"configs/tiny.json"',
        "json-null": b"null",
    }[kind]
    path.write_bytes(content)
    return path


config_damage = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(FILE_DAMAGE), st.none()),
    st.tuples(st.just("field"), st.sampled_from(FIELDS), st.sampled_from(GENERIC_BAD)),
    st.tuples(st.just("unknown"), st.sampled_from(["colour", "Seed", "mass_kg", ""]), st.none()),
)


def config_file(ws: Path, damage: tuple[str, str, Any]) -> tuple[Path, str]:
    """The damaged config file and what its error message must name."""
    kind, what, value = damage
    good = Config.tiny().model_dump(mode="json")
    if kind == "file":
        return damaged_file(ws, what, "config.json", json.dumps(good)), "config.json"
    if kind == "field":
        good[what] = value
    else:
        good[what] = 1
    path = ws / "config.json"
    path.write_text(json.dumps(good))
    return path, f"`{what}`"


@FEW
@given(damage=config_damage)
def test_fit_refuses_a_damaged_config(ws, damage):
    path, needle = config_file(ws, damage)
    cli(ws, ["fit", "--config", str(path), "--workdir", str(ws / "run")], needle)


@FEW
@given(damage=config_damage)
def test_load_config_refuses_a_damaged_config(ws, damage):
    path, needle = config_file(ws, damage)
    refused("load_config", ConfigError, needle, load_config, path)


# Values inside the generic types but outside a field's range, and inconsistent grids.
OUT_OF_RANGE = [
    ({"mass": 0.0}, "`mass`"),
    ({"stiffness": -4.0}, "`stiffness`"),
    ({"damping": -0.1}, "`damping`"),
    ({"seed": -1}, "`seed`"),
    ({"seed": 2**32}, "`seed`"),
    ({"seed": 1.5}, "`seed`"),
    ({"noise_std": 0.0}, "`noise_std`"),
    ({"heldout_fraction": 0.5}, "`heldout_fraction`"),
    ({"refinement_levels": 2}, "`refinement_levels`"),
    ({"coverage_seeds": 7}, "`coverage_seeds`"),
    ({"confidence": 1.0}, "`confidence`"),
    ({"profile_points": 4}, "`profile_points`"),
    ({"check_sensitivities": "yes"}, "`check_sensitivities`"),
    ({"initial_guess": [0.6]}, "`initial_guess"),
    ({"initial_guess": [0.6, 3.0, 1.0]}, "`initial_guess"),
    ({"initial_guess": [-0.6, 3.0]}, "`initial_guess`"),
    ({"damping": 5.0}, "underdamped"),
    ({"solver_dt": 0.03}, "`solver_dt = 0.03`"),
    ({"coarse_dt": 0.07}, "`coarse_dt = 0.07`"),
    ({"t_end": 10.05}, "`t_end = 10.05`"),
    ({"short_window": 10.0}, "`short_window = 10.0`"),
    ({"short_window": 0.3}, "fewer than 5 observations"),
]


@pytest.mark.parametrize(("change", "needle"), OUT_OF_RANGE)
def test_fit_refuses_out_of_range_fields(ws, change, needle):
    (ws / "range.json").write_text(json.dumps({**Config.tiny().model_dump(mode="json"), **change}))
    cli(ws, ["fit", "--config", "range.json", "--workdir", "run"], needle)
    refused("Config.from_json", ConfigError, needle, Config.from_json, json.dumps(change))


@pytest.mark.parametrize(
    ("workdir", "needle"),
    [("a_file/run", "`a_file` is a file"), ("a_file", "a_file"), ("a_file/x/y", "a_file")],
)
def test_fit_refuses_a_report_folder_it_cannot_create(ws, workdir, needle):
    cli(ws, ["fit", "--config", str(PROJECT_ROOT / "configs/tiny.json"), "--workdir", workdir])
    assert needle in cli(ws, ["fit", "--workdir", workdir])


def test_fit_and_evaluate_refuses_a_bad_config_or_folder_before_fitting(ws, monkeypatch):
    # The study's first step is a tripwire: each refusal must come before it.
    monkeypatch.setattr(train, "synthesize", _tripwire("the study"))
    refused("fit_and_evaluate", ConfigError, "`Config`", REAL_FIT, {"seed": 0})
    refused("fit_and_evaluate", ConfigError, "`Config`", REAL_FIT, "configs/tiny.json")
    refused("fit_and_evaluate", ConfigError, "a_file", REAL_FIT, Config.tiny(), ws / "a_file/run")


# --- simulate -------------------------------------------------------------------------

SIMULATE_DAMAGE = [
    (["--param", "a,b,c"], "`--param a,b,c`"),
    (["--param", ""], "`--param `"),
    (["--param", "1,0.3"], "`--param 1,0.3` has 2 values"),
    (["--param", "1,0.3,4", "--param", "1,0.3,4,5"], "`--param 1,0.3,4,5` has 4 values"),
    (["--system", "pendulum", "--param", "1,0.2,3"], "`--param 1,0.2,3` has 3 values"),
    (["--param", "nan,0.3,4"], "`theta` row 0 is not finite"),
    (["--param", "1,inf,4"], "`theta` row 0 is not finite"),
    (["--param", "-1,0.3,4"], "`m = -1`"),
    (["--param", "1,-0.3,4"], "`c = -0.3`"),
    (["--param", "1,0.3,0"], "`k = 0`"),
    (["--system", "pendulum", "--param", "0,0.2"], "`L = 0`"),
    (["--system", "double"], "'--system'"),
    (["--y0", "1,2,3"], "`--y0 1,2,3` has 3 values"),
    (["--y0", "1"], "`--y0 1` has 1 values"),
    (["--y0", "x,0"], "`--y0 x,0`"),
    (["--y0", "nan,0"], "`y0` row 0 is not finite"),
    (["--dt", "0"], "`dt = 0.0`"),
    (["--dt", "-0.01"], "`dt = -0.01`"),
    (["--dt", "nan"], "`dt = nan`"),
    (["--dt", "inf"], "`dt = inf`"),
    (["--dt", "abc"], "'--dt'"),
    (["--dt", "0.3", "--t-end", "1"], "`dt = 0.3`"),
    (["--t-end", "0"], "`t_end = 0.0`"),
    (["--t-end", "-inf"], "`t_end = -inf`"),
    (["--dt", "1e-6", "--t-end", "100"], "`dt = 1e-06`"),
    (["--param", "1,0.3,1e300", "--dt", "1"], "left the finite range"),
    (["--plot", "a_file/p.png"], "`a_file` is a file"),
    (["--plot", "a_folder"], "a_folder"),
]


@pytest.mark.parametrize(("args", "needle"), SIMULATE_DAMAGE)
def test_simulate_refuses_damaged_options(ws, args, needle):
    plot = [] if "--plot" in args else ["--plot", "out/p.png"]
    cli(ws, ["simulate", *args, *plot], needle)


# --- bench ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--size", "huge"], "'--size'"),
        (["--size", ""], "'--size'"),
        (["--out", "a_folder"], "a_folder"),
        (["--out", "a_file/bench.json"], "`a_file` is a file"),
        (["--out", "a_folder/x/.././../a_file/b.json"], "a_file"),
    ],
)
def test_bench_refuses_damaged_options_before_running(ws, args, needle):
    cli(ws, ["bench", *args], needle)


def test_bench_refuses_a_plot_path_taken_by_a_folder(ws):
    (ws / "report.png").mkdir(exist_ok=True)
    try:
        cli(ws, ["bench", "--out", "report.json"], "report.png")
    finally:
        (ws / "report.png").rmdir()


def test_bench_run_refuses_an_unknown_size():
    refused("bench.run", ValueError, "`huge`", REAL_BENCH_RUN, "huge")


# --- arrays: simulate, sensitivities, Fisher information ------------------------------

GOOD_THETA = np.array([[1.0, 0.3, 4.0], [2.0, 0.1, 3.0]])
GOOD_Y0 = np.array([[1.0, 0.0], [0.5, 0.2]])

ARRAY_DAMAGE = {
    "theta": [
        (np.array([1.0, 0.3, 4.0]), "`theta` must have shape"),
        (np.zeros((0, 3)), "batch size 0"),
        (np.array([[1.0, 0.3]] * 2), "`theta` must have shape"),
        (np.array([[1.0, np.nan, 4.0]] * 2), "`theta` row 0 is not finite"),
        (np.array([[1.0, 0.3, -np.inf]] * 2), "`theta` row 0 is not finite"),
        (np.array([["1", "0.3", "4"]] * 2), "`theta` must hold real numbers"),
        (np.array([[1 + 1j, 0.3, 4.0]] * 2), "`theta` must hold real numbers"),
        (np.array([[True, False, True]] * 2), "`theta` must hold real numbers"),
        ([[1.0, 0.3, 4.0], [1.0, 0.3]], "`theta` is ragged"),
        (np.array([[0.0, 0.3, 4.0]] * 2), "`m = 0`"),
    ],
    "y0": [
        (np.array([1.0, 0.0]), "`y0` must have shape"),
        (np.zeros((2, 3)), "`y0` must have shape"),
        (np.zeros((3, 2)), "`y0` must have shape"),
        (np.array([[np.nan, 0.0]] * 2), "`y0` row 0 is not finite"),
        (np.array([["a", "b"]] * 2), "`y0` must hold real numbers"),
    ],
    "t_end": [(0.0, "`t_end = 0.0`"), (float("nan"), "`t_end = nan`"), (-1.0, "`t_end = -1.0`")],
    "dt": [(0.0, "`dt = 0.0`"), (float("inf"), "`dt = inf`"), (0.3, "`dt = 0.3`")],
}


@FEW
@given(
    damage=st.sampled_from(sorted(ARRAY_DAMAGE)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(ARRAY_DAMAGE[name]))
    )
)
def test_simulate_refuses_damaged_arrays(damage):
    name, (value, needle) = damage
    args = {"theta": GOOD_THETA, "y0": GOOD_Y0, "t_end": 1.0, "dt": 0.1, name: value}
    refused(
        "solver.simulate",
        ParameterError,
        needle,
        solver.simulate,
        OSCILLATOR,
        args["theta"],
        args["y0"],
        args["t_end"],
        args["dt"],
    )


def test_simulate_refuses_more_states_than_it_keeps():
    theta = np.repeat(GOOD_THETA, 100, axis=0)
    refused("solver.simulate", ParameterError, "states", solver.simulate, OSCILLATOR, theta,
            np.repeat(GOOD_Y0, 100, axis=0), 1000.0, 0.001)  # fmt: skip


@pytest.fixture(scope="module")
def problem():
    return sensitivity.oscillator_problem()


GRADIENTS = {
    "discrete_grad": lambda p, **a: sensitivity.discrete_grad(
        p["system"], a["theta"], a["y0"], a["ts"], a["data"], 0.1
    ),
    "discrete_loss": lambda p, **a: sensitivity.discrete_loss(
        p["system"], a["theta"], a["y0"], a["ts"], a["data"], 0.1
    ),
    "finite_difference_grad": lambda p, **a: sensitivity.finite_difference_grad(
        p["system"], a["theta"], a["y0"], a["ts"], a["data"], 0.1
    ),
    "exact_grad": lambda p, **a: sensitivity.exact_grad(a["theta"], a["y0"], a["ts"], a["data"]),
    "forward_sensitivity_grad": lambda p, **a: sensitivity.forward_sensitivity_grad(
        p["system"], a["theta"], a["y0"], a["ts"], a["data"]
    ),
    "diffrax_grad": lambda p, **a: sensitivity.diffrax_grad(
        p["system"], a["theta"], a["y0"], a["ts"], a["data"], adjoint="recursive", rtol=1e-6
    ),
}
PROBLEM_DAMAGE = {
    "theta": [
        (np.array([1.0, 0.3]), "`theta` must have shape (3,)"),
        (np.array([[1.0, 0.3, 4.0]]), "`theta` must have shape (3,)"),
        (np.array([1.0, 0.3, np.nan]), "`theta` row 0 is not finite"),
        (np.array([-1.0, 0.3, 4.0]), "`m = -1`"),
        (np.array(["1", "0.3", "4"]), "`theta` must hold real numbers"),
    ],
    "y0": [
        (np.array([1.0, 0.0, 0.0]), "`y0` shape (2,)"),
        (np.array([np.inf, 0.0]), "`y0` row 0 is not finite"),
    ],
    "ts": [
        (np.array([]), "`ts` must be a non-empty"),
        (np.array([[0.2, 0.4]]), "`ts` must be a non-empty"),
        (np.array([0.0, 0.2, 0.4]), "`ts` must be finite, positive and increasing"),
        (np.array([0.4, 0.2]), "`ts` must be finite, positive and increasing"),
        (np.array([0.2, np.nan]), "`ts` must be finite, positive and increasing"),
    ],
    "data": [
        ("short", "`data` must have the shape of `ts`"),
        ("nan", "is not finite"),
        ("inf", "is not finite"),
        ("empty", "`data` must have the shape of `ts`"),
    ],
}


def _damaged_problem(problem: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    args = {k: problem[k] for k in ("theta", "y0", "ts", "data")}
    if name == "data":
        data = np.array(problem["data"])
        if value == "short":
            data = data[:-1]
        elif value == "empty":
            data = data[:0]
        else:
            data[3] = float(value)
        value = data
    elif name == "ts" and value.ndim == 1 and value.shape[0] > 0:
        args["data"] = problem["data"][: value.shape[0]]
    args[name] = value
    return args


@FEW
@given(
    entry=st.sampled_from(sorted(GRADIENTS)),
    damage=st.sampled_from(sorted(PROBLEM_DAMAGE)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(PROBLEM_DAMAGE[name]))
    ),
)
def test_gradients_refuse_damaged_problems(problem, entry, damage):
    name, (value, needle) = damage
    args = _damaged_problem(problem, name, value)
    refused(entry, ParameterError, needle, GRADIENTS[entry], problem, **args)


def test_diffrax_grad_refuses_an_unknown_adjoint_or_tolerance(problem):
    args = [problem[k] for k in ("system", "theta", "y0", "ts", "data")]
    grad = sensitivity.diffrax_grad
    refused("diffrax_grad", ParameterError, "`adjoint_x`", grad, *args, adjoint="adjoint_x",
            rtol=1e-6)  # fmt: skip
    for rtol in (0.0, -1e-6, float("nan"), 2.0):
        refused("diffrax_grad", ParameterError, "rtol", grad, *args, adjoint="recursive", rtol=rtol)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"free": ()}, "`free`"),
        ({"free": ("c", "x")}, "`free`"),
        ({"free": ("c", "c")}, "`free`"),
        ({"noise_std": 0.0}, "`noise_std`"),
        ({"noise_std": float("nan")}, "`noise_std`"),
        ({"noise_std": -0.05}, "`noise_std`"),
        ({"theta": np.array([1.0, 0.3])}, "`theta` must have shape (3,)"),
        ({"theta": np.array([1.0, 0.3, np.nan])}, "`theta` row 0 is not finite"),
        ({"theta": np.array([1.0, 0.3, -4.0])}, "`k = -4`"),
        ({"ts": np.array([])}, "`ts`"),
        ({"ts": np.array([0.1, np.inf])}, "`ts`"),
        ({"y0": np.array([1.0])}, "`y0` shape (2,)"),
    ],
)
def test_fisher_refuses_damaged_designs(change, needle):
    args = {
        "theta": np.array([1.0, 0.3, 4.0]),
        "ts": np.linspace(0.1, 1.0, 10),
        "y0": np.array([1.0, 0.0]),
        "noise_std": 0.05,
        "free": ("c", "k"),
        **change,
    }
    free = args.pop("free")
    refused("fisher", ParameterError, needle, identifiability.fisher, **args, free=free)


def test_pendulum_simulate_refuses_a_wrong_parameter_count():
    refused("solver.simulate", ParameterError, "(batch, 2)", solver.simulate, PENDULUM,
            GOOD_THETA, GOOD_Y0, 1.0, 0.1)  # fmt: skip


def test_fit_weights_refuses_observations_without_usable_values():
    import jax

    obs = synthesize(Config.tiny(), jax.random.key(0), t_end=1.0)
    empty = obs._replace(x=np.full_like(obs.x, np.nan))
    refused("fit_weights", DataError, "`0`", fit_weights, empty, False)


# --- the result file ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [*FILE_DAMAGE, "json-number"])
def test_restore_refuses_a_damaged_result_file(ws, kind):
    if kind == "json-number":
        path = ws / "result.json"
        path.write_text("3.5")
    else:
        path = damaged_file(ws, kind, "result.json", json.dumps({"fit": {"theta": [0.3, 4.0]}}))
    refused("checkpoint.restore", CheckpointError, "result.json", checkpoint.restore, path)


# --- every command has its cases -------------------------------------------------------

CASES_OF_COMMAND = {
    "fit": (
        test_fit_refuses_a_damaged_config,
        test_fit_refuses_out_of_range_fields,
        test_fit_refuses_a_report_folder_it_cannot_create,
    ),
    "simulate": (test_simulate_refuses_damaged_options,),
    "bench": (test_bench_refuses_damaged_options_before_running,),
}


def test_every_command_of_the_group_has_bad_input_cases():
    assert set(main.commands) == set(CASES_OF_COMMAND), (
        f"commands without bad-input cases: {set(main.commands) - set(CASES_OF_COMMAND)}"
    )
    assert all(CASES_OF_COMMAND.values())
