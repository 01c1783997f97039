"""The bench runs end to end at a tiny size and writes the report format
(a smoke test: no speed is asserted here)."""

import json
import math

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
    assert set(report) >= {"identity", "measurements", "ratios", "ratio_details", "verdicts"}
    assert report["ratios"]["steady_vs_switch_p99"] > 0
    assert report["measurements"]["verify/log"]["entries"] == 6
    assert report["serving"]["requests"] > 0
    assert (tmp_path / "bench.png").is_file()
    # Every ratio names its baseline, carries the A/A control and its per-round spread.
    assert set(report["ratio_details"]) == set(report["ratios"])
    aa = report["ratios"]["steady_vs_steady_p99"]
    for name, d in report["ratio_details"].items():
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert d["value"] == report["ratios"][name]
        assert d["aa"] == aa
        assert all(r > 0 for r in d["rounds"]), name
    # Two switches: two rounds of steady-vs-switch, one pair of steady windows for the A/A.
    main_ratio = report["ratio_details"]["steady_vs_switch_p99"]
    assert len(main_ratio["rounds"]) == 2
    assert len(report["ratio_details"]["steady_vs_steady_p99"]["rounds"]) == 1
    assert main_ratio["min"] <= main_ratio["median"] <= main_ratio["max"]
    assert main_ratio["min"] == min(main_ratio["rounds"])
    assert main_ratio["max"] == max(main_ratio["rounds"])
    assert not any(math.isnan(v) for v in main_ratio["rounds"])
    assert "process" in report["settings"]["candidates"]
    assert report["settings"]["candidate_nice"] == 0
    for op in report["serving"]["operations"]:  # Each release's candidate start-up, measured.
        startup = op["candidate_startup"]
        assert startup["load_nice"] == 0 and startup["threads_left_lowered"] is None
        assert 0 < startup["cpu_s_jax_and_model_imports"] < startup["cpu_s_total"]
    assert len(report["identity"]["loadavg_at_start"]) == 3
