"""Bad input, wherever the project takes a file, an array or a setting.

The promise, for every command of the CLI and every public entry point a
learner calls:
  - CLI: a damaged input (missing, empty, truncated, non-UTF-8 or non-JSON
    file, JSON of the wrong type, a missing or unknown field, a value out of
    range, an output path that cannot be a directory) exits with code 2 and
    ONE line `Error: ...` naming the file, field or value; no traceback, and
    not a byte written (the folder is snapshotted before and after);
  - library: a `ValueError` (the project's `DataError`, `ModelError`,
    `DiagnosticError`, `ConfigError`) naming the argument, never a NaN result.

The cases are drawn by hypothesis (damage kind, field, value), with
enumerations where a list is clearer. Every case is refused before anything
compiles or samples, so each runs in milliseconds. The counts go to
`evidence/bad_input.json`; the last test checks that every command of the
click group has cases.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import click
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesian_regression import (
    calibration,
    checkpoint,
    data,
    diagnostics,
    hmc,
    model,
    nuts,
    train,
    vi,
)
from bayesian_regression.cli import main
from bayesian_regression.config import ConfigError, load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TINY = PROJECT_ROOT / "configs" / "tiny.json"
FEW = settings(max_examples=40, derandomize=True, deadline=None, database=None)

TALLY: dict = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}


@pytest.fixture(scope="module", autouse=True)
def bad_input_evidence():
    """Writes the case count at module end (`EVIDENCE_DIR` or `<project>/evidence`)."""
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


# --- the CLI ---------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root`: file bytes, or None for a directory."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def refused(args: list, root: Path, named: list[str]) -> str:
    """Runs the CLI on a damaged input; checks exit 2, one `Error:` line naming every
    string of `named`, no traceback, nothing written under `root`. Returns the line."""
    TALLY["cases"] += 1
    TALLY["commands"].add(str(args[0]))
    before = snapshot(root)
    result = CliRunner().invoke(main, [str(a) for a in args])
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    TALLY["tracebacks"] += int(crashed or "Traceback" in result.output)
    assert not crashed, repr(result.exception)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error")]
    # click's own usage errors add their `Usage:` and `Try ... --help` lines.
    others = [ln for ln in lines if not ln.startswith(("Error", "Usage:", "Try "))]
    assert len(errors) == 1 and not others, result.output
    for name in named:
        assert name in errors[0], (name, errors[0])
    assert snapshot(root) == before
    return errors[0]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    """The parent of the per-example directories (pytest removes old ones)."""
    return tmp_path_factory.mktemp("examples")


def scratch(parent: Path) -> Path:
    """A fresh directory per hypothesis example (function fixtures do not reset there)."""
    return Path(tempfile.mkdtemp(dir=parent))


GOOD_CONFIG = json.loads(TINY.read_text(encoding="utf-8"))
FIELDS = sorted(GOOD_CONFIG)
# Each is out of range or of the wrong type for every field of the tiny config
# (all of them are bounded numbers: seeds >= 0, sizes >= 1, scales > 0, ...).
BAD_FIELD_VALUES = [-1, -1.5, 10**12, "1", None, True, [], {}, float("nan"), float("inf")]
CONFIG_COMMANDS = ["fit", "sample", "report"]


def config_text(kind: str, field: str, value, cut: float) -> bytes | None:
    good = json.dumps(GOOD_CONFIG, indent=1)
    if kind == "missing":
        return None
    if kind == "empty":
        return b""
    if kind == "truncated":
        return good[: max(1, int(cut * (len(good) - 1)))].encode()
    if kind == "non-utf8":
        return b'{"seed": "\xff\xfe"}'
    if kind == "not-json":
        return b"seed = 0\nnum_chains = 4\n"
    if kind == "wrong-type":
        return json.dumps([[GOOD_CONFIG], 1, "x", None][int(cut * 3.99)]).encode()
    if kind == "unknown-field":
        return json.dumps({**GOOD_CONFIG, f"{field}_typo": 1}).encode()
    return json.dumps({**GOOD_CONFIG, field: value}).encode()  # bad-value


CONFIG_KINDS = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "not-json",
    "wrong-type",
    "unknown-field",
    "bad-value",
]


@FEW
@given(
    command=st.sampled_from(CONFIG_COMMANDS),
    kind=st.sampled_from(CONFIG_KINDS),
    field=st.sampled_from(FIELDS),
    value=st.sampled_from(BAD_FIELD_VALUES),
    cut=st.floats(0.0, 1.0),
)
def test_a_damaged_config_file_is_refused(examples, command, kind, field, value, cut):
    root = scratch(examples)
    path = root / "config.json"
    text = config_text(kind, field, value, cut)
    if text is not None:
        path.write_bytes(text)
    named = [str(path)]
    if kind == "bad-value":
        named.append(f"`{field}`")
    elif kind == "unknown-field":
        named.append(f"`{field}_typo`")
    refused([command, "--config", path, "--workdir", root / "out"], root, named)
    shutil.rmtree(root)


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
@pytest.mark.parametrize("where", ["config-is-a-directory", "workdir-is-a-file", "under-a-file"])
def test_unusable_paths_are_refused(tmp_path, command, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    if where == "config-is-a-directory":
        args, named = ["--config", tmp_path, "--workdir", tmp_path / "out"], [str(tmp_path)]
    elif where == "workdir-is-a-file":
        args, named = ["--config", TINY, "--workdir", blocker], [str(blocker)]
    else:
        args, named = ["--config", TINY, "--workdir", blocker / "out"], [str(blocker)]
    refused([command, *args], tmp_path, named)


STEP_FACTORS = st.one_of(
    st.sampled_from(["inf", "-inf", "nan", "0", "-0.0", "-1", "1e400"]),
    st.floats(-1e6, 0.000999, allow_nan=False).map(repr),
    st.floats(1000.001, 1e30).map(repr),
)


@settings(max_examples=15, derandomize=True, deadline=None, database=None)
@given(value=STEP_FACTORS)
def test_a_step_size_factor_out_of_range_is_refused(examples, value):
    root = scratch(examples)
    args = ["sample", "--config", TINY, "--workdir", root, "--step-size-factor", value]
    line = refused(args, root, ["`--step-size-factor`"])
    assert "[0.001, 1000.0]" in line
    shutil.rmtree(root)


@pytest.mark.parametrize(
    "args, named",
    [
        (["--target", "nope"], ["nope"]),
        (["--sampler", "gibbs"], ["gibbs"]),
        (["--sampler", "nuts", "--target", "funnel-centered"], ["funnel-centered"]),
        (["--step-size-factor", "big"], ["big"]),
        (["--bogus-option"], ["--bogus-option"]),
    ],
)
def test_bad_sample_options_are_refused(tmp_path, args, named):
    refused(["sample", "--config", TINY, "--workdir", tmp_path, *args], tmp_path, named)


def test_a_run_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "regression-hmc").write_text("not a run")
    args = ["sample", "--config", TINY, "--workdir", tmp_path]
    refused(args, tmp_path, [str(tmp_path / "regression-hmc")])


@pytest.mark.parametrize(
    "args, named",
    [
        (["--repeats", "0"], ["--repeats", "0"]),
        (["--repeats", "-1"], ["--repeats", "-1"]),
        (["--repeats", "2"], ["--repeats", "2"]),
        (["--repeats", "many"], ["--repeats", "many"]),
        (["--out", "{root}"], ["{root}"]),
        (["--out", "{root}/blocker/bench.json"], ["{root}/blocker"]),
        (["--out", "{root}/sub/bench.json", "--repeats", "1001"], ["1001"]),
    ],
)
def test_bad_bench_options_are_refused(tmp_path, args, named):
    (tmp_path / "blocker").write_text("a file")
    fill = lambda s: s.replace("{root}", str(tmp_path))  # noqa: E731
    if "--out" not in args:
        args = [*args, "--out", "{root}/bench.json"]
    refused(["bench", *map(fill, args)], tmp_path, list(map(fill, named)))


def test_a_bench_cache_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "jax-cache").write_text("a file")
    refused(["bench", "--out", tmp_path / "bench.json"], tmp_path, [str(tmp_path / "jax-cache")])


# --- diagnose: damaged checkpoints ----------------------------------------------------------

NAMES = ["w[0]", "log_sigma2"]


def _samples(positions) -> hmc.Samples:
    chains, draws, dim = np.shape(positions)
    return hmc.Samples(
        jnp.asarray(positions, jnp.float32),
        jnp.full((chains, draws), 0.9, jnp.float32),
        jnp.zeros((chains, draws), bool),
        jnp.full((chains,), 0.5, jnp.float32),
        jnp.ones((chains, dim), jnp.float32),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Checkpoints written by `checkpoint.save`, as `sample` writes them, without a
    sampler: good draws, and draws that are damaged inside (NaN, too few, constant,
    a shape that does not fit the names, a missing field)."""
    root = tmp_path_factory.mktemp("runs")
    good = np.asarray(jax.random.normal(jax.random.key(0), (4, 100, 2)), np.float64)
    nan = good.copy()
    nan[2, 40, 1] = np.nan
    meta = {"target": "regression", "sampler": "hmc", "names": NAMES}
    out = {}
    for name, positions in {
        "good": good,
        "nan": nan,
        "few": good[:, :3],
        "constant": np.ones_like(good),
        "three-columns": np.concatenate([good, good[:, :, :1]], axis=2),
    }.items():
        out[name] = checkpoint.save(root / name, _samples(positions), meta)
    tree = {k: np.asarray(v) for k, v in _samples(good)._asdict().items() if k != "inv_mass"}
    incomplete = (root / "no-inv-mass").absolute()
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as saver:
        saver.save(incomplete / "draws", tree)
        saver.wait_until_finished()
    (incomplete / "meta.json").write_text(json.dumps(meta))
    out["no-inv-mass"] = incomplete
    return out


META_KINDS = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "not-json",
    "wrong-type",
    "missing-field",
    "unknown-field",
    "bad-target",
    "bad-sampler",
    "names-not-a-list",
    "names-not-strings",
    "names-repeated",
    "names-wrong-length",
    "names-empty",
]


def meta_damage(kind: str, field: str, cut: float) -> tuple[bytes | None, list[str]]:
    """The damaged meta.json text, and what its error line must name besides the file."""
    good = {"target": "regression", "sampler": "hmc", "names": NAMES}
    text = json.dumps(good)
    damaged = {
        "missing": (None, []),
        "empty": (b"", []),
        "truncated": (text[: max(1, int(cut * (len(text) - 1)))].encode(), []),
        "non-utf8": (b'{"target": "\xff"}', ["UTF-8"]),
        "not-json": (b"target: regression\n", []),
        "wrong-type": (json.dumps([[good], "x", 3, None][int(cut * 3.99)]).encode(), []),
        "missing-field": (json.dumps({k: v for k, v in good.items() if k != field}), [field]),
        "unknown-field": (json.dumps({**good, "extra": 1}), ["`extra`"]),
        "bad-target": (json.dumps({**good, "target": "moon"}), ["`target`", "moon"]),
        "bad-sampler": (json.dumps({**good, "sampler": 7}), ["`sampler`", "7"]),
        "names-not-a-list": (json.dumps({**good, "names": "w[0]"}), ["`names`"]),
        "names-not-strings": (json.dumps({**good, "names": [1, 2]}), ["`names`"]),
        "names-repeated": (json.dumps({**good, "names": ["a", "a"]}), ["`names`"]),
        "names-wrong-length": (json.dumps({**good, "names": ["a", "b", "c"]}), ["`positions`"]),
        "names-empty": (json.dumps({**good, "names": []}), ["`names`"]),
    }[kind]
    text, named = damaged
    return (text.encode() if isinstance(text, str) else text), named


@FEW
@given(
    kind=st.sampled_from(META_KINDS),
    field=st.sampled_from(["target", "sampler", "names"]),
    cut=st.floats(0.0, 1.0),
)
def test_a_damaged_meta_json_is_refused(runs, examples, kind, field, cut):
    root = scratch(examples)
    run = root / "run"
    shutil.copytree(runs["good"], run)
    text, named = meta_damage(kind, field, cut)
    if text is None:
        (run / "meta.json").unlink()
    else:
        (run / "meta.json").write_bytes(text)
    refused(["diagnose", run], root, ["meta.json", *named])
    shutil.rmtree(root)


def _rm(rel):
    def damage(draws: Path) -> None:
        target = draws / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return damage


def _garbage(rel):
    return lambda draws: (draws / rel).write_bytes(b"garbage")


def _truncate_data(draws: Path) -> None:
    for f in (draws / "ocdbt.process_0" / "d").iterdir():
        f.write_bytes(f.read_bytes()[:10])


DRAWS_DAMAGE = {
    "no draws folder": (lambda d: shutil.rmtree(d), ["No complete sampler checkpoint"]),
    "no _METADATA": (_rm("_METADATA"), ["Cannot restore the draws", "draws"]),
    "garbage _METADATA": (_garbage("_METADATA"), ["Cannot restore the draws"]),
    "garbage manifest": (_garbage("manifest.ocdbt"), ["Cannot restore the draws"]),
    "no array data": (_rm("d"), ["Cannot restore the draws"]),
    "truncated array data": (_truncate_data, ["Cannot restore the draws"]),
}


@pytest.mark.parametrize("damage", sorted(DRAWS_DAMAGE))
def test_damaged_draws_are_refused(runs, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(runs["good"], run)
    spoil, named = DRAWS_DAMAGE[damage]
    spoil(run / "draws")
    refused(["diagnose", run], tmp_path, [str(run), *named])


@pytest.mark.parametrize(
    "name, named",
    [
        ("nan", ["`1` non-finite"]),
        ("few", ["at least `4` draws per chain", "`3`"]),
        ("constant", ["same value"]),
        ("three-columns", ["`positions`", "(4, 100, 3)"]),
        ("no-inv-mass", ["draws", "inv_mass"]),
    ],
)
def test_draws_a_diagnostic_cannot_judge_are_refused(runs, tmp_path, name, named):
    run = tmp_path / "run"
    shutil.copytree(runs[name], run)
    refused(["diagnose", run], tmp_path, named)


@pytest.mark.parametrize("where", ["missing", "empty", "a-file"])
def test_a_run_directory_that_is_not_a_checkpoint_is_refused(tmp_path, where):
    run = tmp_path / "run"
    if where == "empty":
        run.mkdir()
    elif where == "a-file":
        run.write_text("not a directory")
    refused(["diagnose", run], tmp_path, [str(run)])


def test_the_library_reads_checkpoints_and_configs_with_the_same_checks(runs, tmp_path):
    """`checkpoint.restore` and `load_config` are the entry points behind the commands."""
    run = tmp_path / "run"
    shutil.copytree(runs["good"], run)
    (run / "meta.json").write_text('{"target": "regression"}')
    TALLY["entry_points"].update(["checkpoint.restore", "config.load_config"])
    TALLY["cases"] += 2
    with pytest.raises(checkpoint.CheckpointError, match=r"meta\.json` lacks the field `sampler`"):
        checkpoint.restore(run)
    (tmp_path / "c.json").write_text('{"num_chains": 0}')
    with pytest.raises(ConfigError, match=r"c\.json`: `num_chains`"):
        load_config(tmp_path / "c.json")


# --- the library: arrays ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def good():
    """Small, valid inputs for every entry point, built in NumPy (no JAX program runs:
    every case below is refused before any computation)."""
    t = np.arange(12.0)
    x = np.stack([np.sin(t), np.cos(0.7 * t)], axis=1).astype(np.float32)
    y = (x @ np.array([1.0, -0.5]) + 0.1 * np.sin(3.0 * t)).astype(np.float32)
    f32 = lambda v: np.asarray(v, np.float32)  # noqa: E731
    return {
        "x": x,
        "y": y,
        "prior": model.make_prior(2, 1.5, 2.0, 1.0),
        "post": model.Posterior(f32([0.5, -0.5]), f32(3.0 * np.eye(2)), f32(8.0), f32(4.0)),
        "moments": model.Moments(f32(np.zeros(3)), f32(np.eye(3)), f32(0.5), f32(0.1)),
        "draws": np.sin(np.arange(4 * 20 * 3.0)).reshape(4, 20, 3),
        "ranks": np.arange(40) % 20,
        "mcmc": nuts.make_mcmc(2, 10, 10, 0.8),
    }


def _regression(g, a):
    return (a.get("x", g["x"]), a.get("y", g["y"]), g["prior"])


KEY = jax.random.key(3)
VI_PARAMS = vi.VIParams(np.zeros(3, np.float32), np.full(3, -1.0, np.float32))


def arg(good, tied: int | None = None, ndim: str | None = "any", named: str | None = None):
    """One array argument: its good value (a key of the `good` fixture, or an array);
    the axis whose length another argument fixes (damage `mismatch`); how a change
    of rank is refused (`any`, `drop` when extra leading axes are allowed, None when
    any rank is); what the message must name (default: the argument in backticks)."""
    return {"good": good, "tied": tied, "ndim": ndim, "named": named}


def _chains_on(g, a):
    return hmc.run_chains(KEY, model.regression_log_density, _regression(g, a), 3, 2, 20, 8, 4, 0.8)


def _vi_on(g, a):
    density = model.regression_log_density
    return vi.fit(KEY, density, _regression(g, a), 3, "fullrank", 5, 0.1, 4)


def _elbo_on(g, a):
    params = VI_PARAMS._replace(**a)
    return vi.elbo(params, KEY, model.regression_log_density, _regression(g, {}), 4)


XY = {"x": arg("x", tied=0), "y": arg("y", tied=0)}
DRAWS = {"draws": arg(np.zeros((4, 20)), named="draws")}
# entry point -> (a call on the good inputs `g` with the damaged arguments `a`, its arguments)
ARRAY_ENTRY_POINTS = {
    "model.exact_posterior": (lambda g, a: model.exact_posterior(*_regression(g, a)), XY),
    "model.log_marginal_likelihood": (
        lambda g, a: model.log_marginal_likelihood(*_regression(g, a)),
        XY,
    ),
    "model.log_joint": (
        lambda g, a: model.log_joint(a.get("theta", np.zeros(3, np.float32)), *_regression(g, a)),
        {"theta": arg(np.zeros(3, np.float32), tied=0), **XY},
    ),
    "model.predictive": (
        lambda g, a: model.predictive(g["post"], a["x_new"]),
        {"x_new": arg(np.ones((5, 2), np.float32), tied=1)},
    ),
    "model.make_prior": (
        lambda g, a: model.make_prior(2, 1.0, 2.0, 1.0, mean=a["mean"]),
        {"mean": arg(np.zeros(2, np.float32), tied=0)},
    ),
    "data.validate": (lambda g, a: data.validate(a.get("x", g["x"]), a.get("y", g["y"])), XY),
    "hmc.run_chains": (_chains_on, XY),
    "vi.fit": (_vi_on, XY),
    "vi.elbo": (
        _elbo_on,
        {
            "loc": arg(VI_PARAMS.loc, tied=0, named="`params.loc`"),
            "raw_scale": arg(VI_PARAMS.raw_scale, tied=0, named="`params.raw_scale`"),
        },
    ),
    "nuts.run_nuts": (lambda g, a: nuts.run_nuts(KEY, g["mcmc"], *_regression(g, a)), XY),
    "diagnostics.rhat": (lambda g, a: diagnostics.rhat(a["draws"]), DRAWS),
    "diagnostics.ess_bulk": (lambda g, a: diagnostics.ess_bulk(a["draws"]), DRAWS),
    "diagnostics.ess_tail": (lambda g, a: diagnostics.ess_tail(a["draws"]), DRAWS),
    "diagnostics.ess_mean": (lambda g, a: diagnostics.ess_mean(a["draws"]), DRAWS),
    "diagnostics.mcse_mean": (lambda g, a: diagnostics.mcse_mean(a["draws"]), DRAWS),
    "diagnostics.summarize": (
        lambda g, a: diagnostics.summarize(a["draws"], ["a", "b", "c"]),
        {"draws": arg("draws", tied=2, named="draws")},
    ),
    "train.moment_zscores": (
        lambda g, a: train.moment_zscores(a["positions"], g["moments"]),
        {"positions": arg("draws", tied=2)},
    ),
    "train.batch_means": (
        lambda g, a: train.batch_means(a["values"]),
        {"values": arg(np.zeros((4, 20)), ndim="drop")},
    ),
    "calibration.uniformity_test": (
        lambda g, a: calibration.uniformity_test(a["ranks"], 19, 10),
        {"ranks": arg("ranks", ndim=None)},
    ),
    "calibration.hmc_ranks": (
        lambda g, a: calibration.hmc_ranks(KEY, a["x"], g["prior"], 4, 20, 3, 2),
        {"x": arg("x", tied=1)},
    ),
    "calibration.exact_ranks": (
        lambda g, a: calibration.exact_ranks(KEY, a["x"], g["prior"], g["prior"], 4, 3),
        {"x": arg("x", tied=1)},
    ),
}
ARRAY_KINDS = ["nan", "inf", "-inf", "empty", "ndim", "dtype", "mismatch"]


def damaged(value: np.ndarray, kind: str, pick: int, spec: dict) -> object:
    """`value` with one damage of `kind`; `pick` chooses where."""
    if kind in ("nan", "inf", "-inf"):
        value = np.array(value, np.float64)
        value.flat[pick % value.size] = float(kind)
        return value
    if kind == "empty":
        shape = list(value.shape)
        shape[pick % len(shape)] = 0
        return np.zeros(shape, value.dtype)
    if kind == "ndim":
        drop = spec["ndim"] == "drop" or (value.ndim > 1 and pick % 2)
        return value.reshape(-1) if drop else value[None]
    if kind == "dtype":
        return [np.full(value.shape, "a"), value.astype(np.complex64), None][pick % 3]
    # mismatch: one entry more along the axis another argument fixes
    axis = spec["tied"]
    return np.concatenate([value, np.take(value, [0], axis=axis)], axis=axis)


@settings(max_examples=120, derandomize=True, deadline=None, database=None)
@given(
    entry=st.sampled_from(sorted(ARRAY_ENTRY_POINTS)),
    arg_pick=st.integers(0, 10),
    kind=st.sampled_from(ARRAY_KINDS),
    pick=st.integers(0, 10_000),
)
def test_a_damaged_array_is_refused(good, entry, arg_pick, kind, pick):
    call, args = ARRAY_ENTRY_POINTS[entry]
    name = sorted(args)[arg_pick % len(args)]
    spec = args[name]
    if (kind == "mismatch" and spec["tied"] is None) or (kind == "ndim" and spec["ndim"] is None):
        kind = "nan"  # not a damage for this argument; a NaN is
    base = spec["good"]
    value = np.asarray(good[base] if isinstance(base, str) else base)
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry)
    with pytest.raises(ValueError) as err:
        call(good, {name: damaged(value, kind, pick, spec)})
    message = str(err.value)
    wanted = spec["named"] or f"`{name}`"
    # A length that disagrees with another argument may be reported on that one.
    assert wanted in message or (kind == "mismatch" and "shape" in message), (entry, message)


def test_exact_posterior_of_nan_data_is_an_error_not_nan(good):
    """The probe's case: a NaN target used to give a NaN posterior, silently."""
    y = good["y"].copy()
    y[3] = np.nan
    TALLY["cases"] += 1
    with pytest.raises(data.DataError, match=r"`y` holds `1` non-finite .* index `\(3,\)`"):
        model.exact_posterior(good["x"], y, good["prior"])


@pytest.mark.parametrize(
    "entry, call, named",
    [
        (
            "model.exact_posterior",
            lambda g: model.exact_posterior(g["x"], g["y"], (0.0, 1.0, 2.0, 1.0)),
            "`prior`",
        ),
        (
            "model.exact_posterior",
            lambda g: model.exact_posterior(g["x"], g["y"], g["prior"]._replace(scale=-1.0)),
            "`prior.scale`",
        ),
        (
            "model.exact_posterior",
            lambda g: model.exact_posterior(
                g["x"], g["y"], g["prior"]._replace(mean=np.zeros(3, np.float32))
            ),
            "`prior.mean`",
        ),
        (
            "model.predictive",
            lambda g: model.predictive(g["post"]._replace(rate=np.nan), np.ones((2, 2))),
            "`post.rate`",
        ),
        (
            "model.sample_exact",
            lambda g: model.sample_exact(KEY, g["post"]._replace(chol=np.ones((3, 3))), 5),
            "`post.chol`",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(KEY, "not a function", None, 3, 2, 20, 8, 4, 0.8),
            "`logdensity_fn`",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(
                KEY, model.regression_log_density, (g["x"], g["y"]), 3, 2, 20, 8, 4, 0.8
            ),
            "`data`",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(
                KEY, model.regression_log_density, _regression(g, {}), 5, 2, 20, 8, 4, 0.8
            ),
            "`theta`",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(KEY, lambda q, d: q * d, np.ones(3), 3, 2, 20, 8, 4, 0.8),
            "scalar",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(
                KEY, lambda q, d: jnp.sum(q * d), np.ones(4), 3, 2, 20, 8, 4, 0.8
            ),
            "`logdensity_fn` fails on a position of shape `(3,)`",
        ),
        (
            "hmc.run_chains",
            lambda g: hmc.run_chains(
                KEY, lambda q, d: jnp.sum(q * d), np.array([1.0, np.inf, 1.0]), 3, 2, 20, 8, 4, 0.8
            ),
            "`data`",
        ),
        (
            "vi.fit",
            lambda g: vi.fit(KEY, model.regression_log_density, None, 3, "fullrank", 5, 0.1, 4),
            "`data`",
        ),
        (
            "nuts.run_nuts",
            lambda g: nuts.run_nuts(KEY, "mcmc", g["x"], g["y"], g["prior"]),
            "`mcmc`",
        ),
        (
            "diagnostics.summarize",
            lambda g: diagnostics.summarize(g["draws"], ["a", "a", "b"]),
            "`names`",
        ),
        (
            "diagnostics.summarize",
            lambda g: diagnostics.summarize(g["draws"], "abc"),
            "`names`",
        ),
        (
            "diagnostics.ess_bulk",
            lambda g: diagnostics.ess_bulk([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]]),
            "draws",
        ),
        (
            "calibration.uniformity_test",
            lambda g: calibration.uniformity_test(np.array([0, 5, 20]), 19, 10),
            "`20`",
        ),
        (
            "calibration.uniformity_test",
            lambda g: calibration.uniformity_test(np.array([0, -1, 3]), 19, 10),
            "`-1`",
        ),
        (
            "calibration.uniformity_test",
            lambda g: calibration.uniformity_test(np.array([0.5, 1.0]), 19, 10),
            "`0.5`",
        ),
        (
            "train.moment_zscores",
            lambda g: train.moment_zscores(g["draws"], g["moments"]._replace(theta_mean=None)),
            "`moments.theta_mean`",
        ),
    ],
)
def test_a_damaged_object_is_refused(good, entry, call, named):
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry)
    with pytest.raises(ValueError) as err:
        call(good)
    assert named in str(err.value), str(err.value)


# --- the library: sizes and settings ---------------------------------------------------------

COUNT = [0, -1, -(2**40), 2.5, 3.0, "3", None, True, float("nan")]
COUNT0 = [-1, -(2**40), 2.5, "3", None, True]
POSITIVE = [0.0, -1.0, -1e-12, float("nan"), float("inf"), float("-inf"), "1", None, True]
UNIT = [0.0, 1.0, -0.5, 1.5, float("nan"), float("inf"), None, "0.8"]
FACTOR = [0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-4, 1e4, None]
BAD_SETTINGS = {"count": COUNT, "count0": COUNT0, "positive": POSITIVE, "unit": UNIT}
BAD_SETTINGS.update(
    factor=FACTOR,
    rho=[1.0, 1.5, -0.5, -1.0, float("nan"), float("inf"), None],
    nonnegative=[-1.0, -1e-9, float("nan"), float("inf"), None, "1"],
    batches=[1, 0, -1, 2.0, None],
    bins=[0, -1, 2.5, "10", True, 3],  # None is the default: one bin per rank; 3 does not divide 20
    family=["bogus", None, 3, "MEANFIELD"],
)


def _chains(**kw):
    args = dict(dim=3, num_chains=2, num_warmup=20, num_samples=8, num_steps=4)
    args.update(target_accept=0.8, step_size_factor=1.0)
    args.update(kw)
    return lambda g: hmc.run_chains(KEY, model.regression_log_density, _regression(g, {}), **args)


def _vi(**kw):
    args = dict(dim=3, family="fullrank", num_steps=5, learning_rate=0.1, num_mc=4)
    args.update(kw)
    return lambda g: vi.fit(KEY, model.regression_log_density, _regression(g, {}), **args)


# entry point -> {setting: (its kind, a call with that setting set to `value`, name in message)}
SETTING_ENTRY_POINTS = {
    "hmc.run_chains": {
        "dim": "count",
        "num_chains": "count",
        "num_warmup": "count0",
        "num_samples": "count",
        "num_steps": "count",
        "target_accept": "unit",
        "step_size_factor": "factor",
    },
    "vi.fit": {
        "dim": "count",
        "family": "family",
        "num_steps": "count",
        "learning_rate": "positive",
        "num_mc": "count",
    },
    "nuts.make_mcmc": {
        "num_chains": "count",
        "num_warmup": "count0",
        "num_samples": "count",
        "target_accept": "unit",
    },
    "data.make_dataset": {
        "num_obs": "count",
        "num_features": "count",
        "rho": "rho",
        "noise_scale": "nonnegative",
    },
    "model.make_prior": {
        "num_features": "count",
        "scale": "positive",
        "shape": "positive",
        "rate": "positive",
    },
    "model.sample_exact": {"num": "count"},
    "calibration.uniformity_test": {"num_ranks": "count", "num_bins": "bins"},
    "calibration.hmc_ranks": {
        "num_sims": "count",
        "num_warmup": "count0",
        "num_ranks": "count",
        "thin": "count",
    },
    "calibration.exact_ranks": {"num_sims": "count", "num_ranks": "count"},
    "train.batch_means": {"num_batches": "batches"},
}
PRIOR_NAMES = {"scale": "prior scale", "shape": "prior shape a0", "rate": "prior rate b0"}


def setting_call(entry: str, setting: str, value):
    """The entry point with every argument good except `setting`, set to `value`."""
    if entry == "hmc.run_chains":
        return _chains(**{setting: value})
    if entry == "vi.fit":
        return _vi(**{setting: value})
    if entry == "nuts.make_mcmc":
        args = dict(num_chains=2, num_warmup=10, num_samples=10, target_accept=0.8)
        return lambda g: nuts.make_mcmc(**{**args, setting: value})
    if entry == "data.make_dataset":
        args = dict(num_obs=10, num_features=3, rho=0.5, noise_scale=1.0)
        return lambda g: data.make_dataset(jax.random.key(4), **{**args, setting: value})
    if entry == "model.make_prior":
        args = dict(num_features=2, scale=1.0, shape=2.0, rate=1.0)
        return lambda g: model.make_prior(**{**args, setting: value})
    if entry == "model.sample_exact":
        return lambda g: model.sample_exact(KEY, g["post"], value)
    if entry == "calibration.uniformity_test":
        args = dict(num_ranks=19, num_bins=10)
        return lambda g: calibration.uniformity_test(g["ranks"], **{**args, setting: value})
    if entry == "calibration.hmc_ranks":
        args = dict(num_sims=4, num_warmup=20, num_ranks=3, thin=2)
        return lambda g: calibration.hmc_ranks(KEY, g["x"], g["prior"], **{**args, setting: value})
    if entry == "calibration.exact_ranks":
        args = dict(num_sims=4, num_ranks=3)
        return lambda g: calibration.exact_ranks(
            KEY, g["x"], g["prior"], g["prior"], **{**args, setting: value}
        )
    return lambda g: train.batch_means(g["draws"], value)  # train.batch_means


@settings(max_examples=100, derandomize=True, deadline=None, database=None)
@given(
    entry=st.sampled_from(sorted(SETTING_ENTRY_POINTS)),
    setting_pick=st.integers(0, 10),
    value_pick=st.integers(0, 100),
)
def test_a_bad_size_or_setting_is_refused(good, entry, setting_pick, value_pick):
    table = SETTING_ENTRY_POINTS[entry]
    setting = sorted(table)[setting_pick % len(table)]
    values = BAD_SETTINGS[table[setting]]
    value = values[value_pick % len(values)]
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry)
    with pytest.raises(ValueError) as err:
        setting_call(entry, setting, value)(good)
    named = PRIOR_NAMES.get(setting, f"`{setting}`") if entry == "model.make_prior" else None
    named = named or f"`{setting}`"
    assert named in str(err.value), (entry, setting, value, str(err.value))


@pytest.mark.parametrize(
    "entry, setting, value",
    [
        ("data.make_dataset", "rho", -0.49),
        ("data.make_dataset", "noise_scale", 0.0),
        ("model.make_prior", "scale", 1e-6),
        ("train.batch_means", "num_batches", 2),
        ("calibration.uniformity_test", "num_bins", 20),
    ],
)
def test_a_setting_at_the_edge_of_its_range_is_accepted(good, entry, setting, value):
    """Negative controls: the refusals above are not of everything near them."""
    out = setting_call(entry, setting, value)(good)
    leaves = [leaf for leaf in jax.tree.leaves(out) if not isinstance(leaf, list)]
    assert leaves and all(np.all(np.isfinite(np.asarray(leaf, float))) for leaf in leaves)


@pytest.mark.parametrize("value", [1e-3, 1.0, 1e3])
def test_the_sampler_step_size_factor_range_is_closed(good, value):
    """The ends of `[0.001, 1000]` pass the samplers' checks (no sampler is run)."""
    assert hmc.check_step_size_factor(value) == value
    hmc.check_target(model.regression_log_density, _regression(good, {}), 3)


# --- coverage --------------------------------------------------------------------------------


def _command_names(group: click.Group, prefix: str = "") -> set[str]:
    names = set()
    for name, command in group.commands.items():
        names.add(prefix + name)
        if isinstance(command, click.Group):
            names |= _command_names(command, f"{prefix}{name} ")
    return names


# The commands each CLI test above drives (the tables the cases are drawn from).
COMMANDS_WITH_CASES = {*CONFIG_COMMANDS, "sample", "bench", "diagnose"}


def test_every_cli_command_has_bad_input_cases():
    """A new command of the group without cases fails here."""
    commands = _command_names(main)
    assert commands <= COMMANDS_WITH_CASES, commands - COMMANDS_WITH_CASES
    if TALLY["cases"]:  # the whole module ran: each command was really driven
        assert commands <= TALLY["commands"], commands - TALLY["commands"]
        assert TALLY["tracebacks"] == 0
