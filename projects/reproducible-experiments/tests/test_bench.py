"""`reproducible-experiments bench` still works: run at a tiny size, its report
checked for shape and sense. No speed is asserted (a benchmark is not a test)."""

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
    assert set(report["ratios"]) == {
        "batched_vs_per_metric",
        "aa_batched",
        "untracked_vs_tracked",
        "aa_untracked",
    }
    assert all(value > 0 for value in report["ratios"].values())
    for name in ("log/batched", "log/per_metric", "train/untracked", "train/tracked"):
        assert report["measurements"][name]["n"] == 2
    assert report["identity"]["backend"] == "cpu"
    assert report["identity"]["config_sha256"] == Config.tiny().sha256()
    assert report["extra"]["recompiled_during_timing"] is False
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
