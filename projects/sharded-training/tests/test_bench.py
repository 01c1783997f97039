"""`sharded-training bench`: the ratios and their details computed as defined, and
a short run writing every ratio with its baseline, A/A control and per-round
spread, at the default batch and at batch 16. No speed is asserted."""

import json

import pytest
from click.testing import CliRunner

from sharded_training import bench
from sharded_training.cli import main
from sharded_training.config import Config


def _m(times, batch=96):
    return {
        "times_s": times,
        "median_s": sorted(times)[len(times) // 2],
        "batch_size": batch,
    }


def test_ratios_of_constructed_measurements():
    """Medians and per-round ratios worked out by hand: t(baseline) / t(other side)."""
    m = {
        "before": _m([4.0, 2.0, 3.0]),
        "after": _m([2.0, 1.0, 1.0]),
        "before_aa": _m([3.0, 3.0, 6.0]),
        "before_b16": _m([2.0, 2.0, 2.0], 16),
        "after_b16": _m([1.0, 0.5, 2.0], 16),
        "before_aa_b16": _m([2.0, 2.0, 2.0], 16),
        "checkpoint/async": _m([1.0, 1.0, 1.0]),
        "checkpoint/sync": _m([4.0, 5.0, 3.0]),
        "checkpoint/sync_aa": _m([4.0, 4.0, 4.0]),
    }
    ratios, details = bench.ratios_of(m)
    assert ratios["after_vs_before"] == 3.0 / 1.0  # medians: before 3, after 1
    assert ratios["before_vs_before_aa"] == 3.0 / 3.0
    assert details["after_vs_before"]["rounds"] == [2.0, 2.0, 3.0]
    assert details["after_vs_before"]["min"] == 2.0
    assert details["after_vs_before"]["median"] == 2.0
    assert details["after_vs_before"]["max"] == 3.0
    assert details["before_vs_before_aa"]["rounds"] == [3.0 / 4.0, 3.0 / 2.0, 6.0 / 3.0]
    assert ratios["after_vs_before_batch16"] == 2.0 / 1.0
    assert details["after_vs_before_batch16"]["rounds"] == [2.0, 4.0, 1.0]
    assert "Batch 16" in details["after_vs_before_batch16"]["baseline"]
    assert ratios["async_vs_sync_checkpoint_blocking"] == 4.0
    assert details["async_vs_sync_checkpoint_blocking"]["rounds"] == [4.0, 5.0, 3.0]
    assert ratios["sync_vs_sync_aa_checkpoint_blocking"] == 1.0
    assert details["async_vs_sync_checkpoint_blocking"]["aa"] == 1.0
    assert set(details) == set(ratios)


def test_bench_config_is_the_default_batch():
    assert bench.bench_config().batch_size == Config.default().batch_size == 96
    assert bench.bench_config(16).batch_size == 16
    assert bench.bench_config().mesh_shape == Config.default().mesh_shape


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--out", str(out), "--steps", "8", "--rounds", "3"])
    assert result.exit_code == 0, (result.output, repr(result.exception))
    return json.loads(out.read_text()), result.output, out


def test_bench_report_has_every_ratio_with_baseline_aa_and_spread(report):
    bench_report, output, out = report
    m, details = bench_report["measurements"], bench_report["ratio_details"]
    assert (
        set(details)
        == set(bench_report["ratios"])
        >= {
            "after_vs_before",
            "after_vs_before_batch16",
            "before_vs_before_aa",
            "async_vs_sync_checkpoint_blocking",
        }
    )
    assert m["before"]["batch_size"] == 96 and m["after"]["batch_size"] == 96
    assert m["before_b16"]["batch_size"] == 16 and m["after_b16"]["steps_per_call"] == 8
    for name, d in details.items():
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert len(d["rounds"]) == 3, name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["value"] == bench_report["ratios"][name]
    # The per-round ratio recomputed from the recorded per-round times.
    recomputed = [b / a for a, b in zip(m["after"]["times_s"], m["before"]["times_s"], strict=True)]
    assert details["after_vs_before"]["rounds"] == pytest.approx(recomputed, rel=1e-12)
    assert details["after_vs_before"]["aa"] == bench_report["ratios"]["before_vs_before_aa"]
    assert bench_report["profile"]["batch_size"] == 96
    assert "after_vs_before_batch16" in output and "A/A" in output
    assert out.with_suffix(".png").stat().st_size > 0
