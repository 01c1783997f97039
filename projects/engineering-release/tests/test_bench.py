"""The bench runs end to end at a tiny size and writes the report format
(a smoke test: no speed is asserted here)."""

import json

from click.testing import CliRunner

from engineering_release.cli import main


def test_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        main,
        ["bench", "--out", str(out), "--switches", "2", "--clients", "1", "--verify-entries", "6"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"identity", "measurements", "ratios", "verdicts"}
    assert report["ratios"]["steady_vs_switch_p99"] > 0
    assert report["measurements"]["verify/log"]["entries"] == 6
    assert report["serving"]["requests"] > 0
    assert (tmp_path / "bench.png").is_file()
