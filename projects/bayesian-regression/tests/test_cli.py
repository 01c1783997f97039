"""The command line end to end on the tiny config: sample -> checkpoint ->
diagnose, fit, and clear errors (exit 2, the value named) for bad input."""

import json
from pathlib import Path

from click.testing import CliRunner

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
