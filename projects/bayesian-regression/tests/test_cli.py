"""The command line end to end on the tiny config: sample -> checkpoint ->
diagnose, fit, and clear errors (exit 2, the value named) for bad input."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from bayesian_regression import checkpoint, hmc
from bayesian_regression.cli import main

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.json")


def test_sample_then_diagnose_writes_checkpoint_plots_and_verdict(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["sample", "--config", TINY, "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "regression-hmc"
    assert (run / "trace.png").stat().st_size > 1000
    result = runner.invoke(main, ["diagnose", str(run)])
    assert result.exit_code == 0, result.output
    report = json.loads((run / "diagnostics.json").read_text())
    assert (run / "rank.png").stat().st_size > 1000
    assert report["max_rhat"] < 1.01 and report["num_divergent"] == 0
    assert report["verdict"] == "trustworthy"
    assert "verdict: trustworthy" in result.output


def test_fit_reports_both_families(tmp_path):
    result = CliRunner().invoke(main, ["fit", "--config", TINY, "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert fit["vi"]["fullrank"]["kl"] < fit["vi"]["meanfield"]["kl"]


def test_bad_input_is_a_clear_error(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.json"
    bad.write_text('{"prior_scale": -1.0}')
    result = runner.invoke(main, ["fit", "--config", str(bad)])
    assert result.exit_code == 2 and "`prior_scale`" in result.output
    result = runner.invoke(main, ["diagnose", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "No complete sampler checkpoint" in result.output
    result = runner.invoke(main, ["sample", "--step-size-factor", "0", "--workdir", str(tmp_path)])
    assert result.exit_code == 2 and "`--step-size-factor`" in result.output
    result = runner.invoke(main, ["sample", "--target", "nope"])
    assert result.exit_code == 2 and "nope" in result.output
    result = runner.invoke(main, ["fit", "--config", str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "missing.json" in result.output


# --- diagnose on hand-made checkpoints: the verdict gates the exit code ----------------------

NAMES = ["w[0]", "log_sigma2"]


def _save_draws(path: Path, positions: np.ndarray) -> Path:
    """A checkpoint of `positions` `(chains, draws, 2)` as `sample` writes one, no sampler."""
    chains, draws, dim = positions.shape
    samples = hmc.Samples(
        jnp.asarray(positions, jnp.float32),
        jnp.full((chains, draws), 0.9, jnp.float32),
        jnp.zeros((chains, draws), bool),
        jnp.full((chains,), 0.5, jnp.float32),
        jnp.ones((chains, dim), jnp.float32),
    )
    meta = {"target": "regression", "sampler": "hmc", "names": NAMES}
    return checkpoint.save(path, samples, meta)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Independent N(0, 1) draws (4 x 500: R-hat near 1, ESS near 2000, above the
    400 the verdict asks) and the same draws with chain 3 moved by 3 sd (R-hat far
    above 1.01)."""
    root = tmp_path_factory.mktemp("checkpoints")
    iid = np.asarray(jax.random.normal(jax.random.key(0), (4, 500, 2)), np.float64)
    shifted = iid.copy()
    shifted[3] += 3.0
    return {
        "trustworthy": _save_draws(root / "iid", iid),
        "shifted": _save_draws(root / "shifted", shifted),
    }


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def test_diagnose_exit_code_gates_on_the_verdict(checkpoints, tmp_path):
    """0 on a trustworthy verdict, 1 on a not-trustworthy one, so a script can gate on it."""
    runner = CliRunner()
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(checkpoints["trustworthy"], good)
    shutil.copytree(checkpoints["shifted"], bad)
    result = runner.invoke(main, ["diagnose", str(good)])
    assert result.exit_code == 0, result.output
    assert json.loads((good / "diagnostics.json").read_text())["verdict"] == "trustworthy"
    result = runner.invoke(main, ["diagnose", str(bad)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "verdict: NOT trustworthy: max R-hat" in result.output
    verdict = json.loads((bad / "diagnostics.json").read_text())
    assert verdict["max_rhat"] > 1.2 and verdict["verdict"].startswith("NOT trustworthy")


@pytest.mark.parametrize(
    "text, named",
    [
        ("{not json", ["meta.json", "line 1"]),
        ('{"target": "regression", "sampler": "hmc"}', ["meta.json", "`names`"]),
    ],
)
def test_diagnose_refuses_a_damaged_meta_json(checkpoints, tmp_path, text, named):
    run = tmp_path / "run"
    shutil.copytree(checkpoints["trustworthy"], run)
    (run / "meta.json").write_text(text, encoding="utf-8")
    before = _tree(run)
    result = CliRunner().invoke(main, ["diagnose", str(run)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert all(n in lines[0] for n in named), lines[0]
    assert _tree(run) == before


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-0.0", "-2", "0.0009", "1000.5"])
def test_step_size_factor_outside_its_range_is_refused(tmp_path, value):
    """The factor must be finite, in [0.001, 1000]: inf makes every transition
    divergent, nan or 0 make no move at all."""
    result = CliRunner().invoke(
        main,
        ["sample", "--config", TINY, "--workdir", str(tmp_path), "--step-size-factor", value],
    )
    assert result.exit_code == 2, result.output
    assert "`--step-size-factor`" in result.output and value in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["0.001", "1000"])
def test_step_size_factor_at_the_ends_of_its_range_is_accepted(tmp_path, value):
    result = CliRunner().invoke(
        main,
        ["sample", "--config", TINY, "--workdir", str(tmp_path), "--step-size-factor", value],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "regression-hmc" / "meta.json").read_text())
    assert meta["step_size_factor"] == float(value)
