"""The bench still works (a tiny size, one round) and the CLI answers; no speed asserted."""

import json

from click.testing import CliRunner

from weight_conversion.cli import main


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        main, ["bench", "--out", str(out), "--layers", "4", "--width", "64", "--rounds", "1"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"identity", "measurements", "ratios", "targets"}
    assert set(report["measurements"]) == {"eager", "streaming", "copy"}
    assert report["ratios"]["eager_vs_streaming_peak_memory"] > 0
    assert "eager_vs_streaming_peak_memory" in result.output


def test_cli_help_and_bad_run_dir(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["--help"]).exit_code == 0
    result = runner.invoke(main, ["reload", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "nowhere" in result.output
    result = runner.invoke(main, ["compare", str(tmp_path), "--fault", "no-such-fault"])
    assert result.exit_code == 2 and "no-such-fault" in result.output
