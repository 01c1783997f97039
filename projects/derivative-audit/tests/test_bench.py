"""The bench still works: a tiny run through the CLI writes a complete report
whose paths agree with each other. No speed is asserted (a test is not a bench)."""

import json

from click.testing import CliRunner

from derivative_audit.cli import main


def test_bench_tiny_writes_a_complete_report(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--size", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"identity", "measurements", "ratios", "agreement"}
    assert set(report["ratios"]) == {"implicit_vs_unrolled", "hvp_vs_full_hessian", "hvp_vs_hvp_aa"}
    for name, m in report["measurements"].items():
        assert m["n"] == 3 and m["compile_s"] > 0 and m["median_s"] > 0, name
    # The paths compute the same derivatives (float32): agreement before any timing.
    assert report["agreement"]["implicit_vs_unrolled_max_rel"] < 1e-4
    assert report["agreement"]["hvp_vs_full_max_rel"] < 1e-5
    assert "no speed claim" in report["verdicts"][0]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
