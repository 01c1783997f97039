"""`reproducible-experiments bench` still works: run at a tiny size, its report
checked for shape and sense: every ratio names its baseline and carries its
per-round spread and A/A control. No speed is asserted (a benchmark is not a
test)."""

import json

from click.testing import CliRunner

from reproducible_experiments.cli import main
from reproducible_experiments.config import Config


def test_bench_writes_its_report(tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(Config.tiny().to_json())
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        main, ["bench", "--out", str(out), "--config", str(config), "--reps", "2", "--values", "20"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    ratios = {
        "batched_vs_per_metric",
        "batched_vs_per_step",
        "untracked_vs_tracked",
        "untracked_vs_tracked_flush_30",
        "untracked_vs_tracked_flush_90",
    }
    assert set(report["ratios"]) == ratios | {"aa_batched", "aa_untracked"}
    assert all(value > 0 for value in report["ratios"].values())
    for name in ("log/batched", "log/per_metric", "log/per_step", "log/batched_aa"):
        assert report["measurements"][name]["n"] == 2
    for name in ("untracked", "tracked", "tracked_flush_30", "tracked_flush_90", "untracked_aa"):
        assert report["measurements"][f"train/{name}"]["n"] == 2
    assert set(report["ratio_details"]) == ratios
    for name, d in report["ratio_details"].items():
        assert isinstance(d["baseline"], str) and d["baseline"], name
        assert len(d["rounds"]) == len(d["aa_rounds"]) == 2, name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["aa_min"] <= d["aa"] <= d["aa_max"], name
        assert d["median"] == report["ratios"][name], name
        assert d["aa_path"] in report["measurements"], name
    assert report["ratios"]["aa_batched"] == report["ratio_details"]["batched_vs_per_step"]["aa"]
    assert report["ratios"]["aa_untracked"] == report["ratio_details"]["untracked_vs_tracked"]["aa"]
    assert report["identity"]["backend"] == "cpu"
    assert report["identity"]["config_sha256"] == Config.tiny().sha256()
    assert report["extra"]["recompiled_during_timing"] is False
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_detail_pairs_rounds_and_keeps_the_spread():
    from reproducible_experiments.bench_stats import per_round, ratio_detail

    rounds = per_round([4.0, 9.0, 2.0], [2.0, 3.0, 2.0])
    assert rounds == [2.0, 3.0, 1.0]
    d = ratio_detail("a loop", rounds, [1.0, 0.5, 2.0], "fast")
    assert (d["min"], d["median"], d["max"]) == (1.0, 2.0, 3.0)
    assert (d["aa_min"], d["aa"], d["aa_max"]) == (0.5, 1.0, 2.0)
    assert d["baseline"] == "a loop" and d["aa_path"] == "fast"
