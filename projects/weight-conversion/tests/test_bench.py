"""The bench still works (a tiny size, two rounds) and the CLI answers; no speed
asserted. The per-round ratios are checked against the children's own records
(recomputed here from `measurements`, not taken from `ratio_details`)."""

import json
import math

import pytest
from click.testing import CliRunner

from weight_conversion.bench import RATIOS, round_ratios
from weight_conversion.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(
        main, ["bench", "--out", str(out), "--layers", "4", "--width", "64", "--rounds", "2"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result


def test_bench_smoke(report):
    data, result = report
    assert set(data) >= {"identity", "measurements", "ratios", "ratio_details", "targets"}
    assert set(data["measurements"]) == {"eager", "streaming", "copy", "streaming_aa"}
    assert data["ratios"]["eager_vs_streaming_peak_memory"] > 0
    assert "eager_vs_streaming_peak_memory" in result.output
    for m in data["measurements"].values():
        assert m["n"] == 2 == len(m["seconds"])
        assert m["min_s"] <= m["median_s"] <= m["max_s"]


def test_every_ratio_has_baseline_aa_and_round_spread(report):
    data, _result = report
    details = data["ratio_details"]
    assert set(details) == set(data["ratios"]) == set(RATIOS)
    for name, d in details.items():
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert d["aa_ratio"] in data["ratios"], name
        assert d["aa"] == data["ratios"][d["aa_ratio"]], name
        assert math.isfinite(d["aa"]) and d["aa"] > 0, name
        assert len(d["rounds"]) == data["config"]["rounds"] == 2, name
        assert d["min"] <= d["median"] <= d["max"], name
        assert min(d["rounds"]) == d["min"] and max(d["rounds"]) == d["max"], name


def test_round_ratios_follow_the_recorded_seconds(report):
    """A throughput ratio of one round is b's seconds over a's seconds of that
    round, as the children recorded them."""
    data, _result = report
    m = data["measurements"]
    runs = {mode: [{"seconds": s, "added_bytes": 1} for s in m[mode]["seconds"]] for mode in m}
    got = data["ratio_details"]["streaming_vs_eager_throughput"]["rounds"]
    want = [e / s for s, e in zip(m["streaming"]["seconds"], m["eager"]["seconds"], strict=True)]
    assert got == pytest.approx(want, rel=1e-12)
    assert round_ratios(runs, "throughput", "streaming", "eager") == pytest.approx(want)


def test_round_ratios_on_constructed_records():
    runs = {
        "x": [{"seconds": 2.0, "added_bytes": 400}, {"seconds": 4.0, "added_bytes": 300}],
        "y": [{"seconds": 1.0, "added_bytes": 10}, {"seconds": 8.0, "added_bytes": 0}],
    }
    assert round_ratios(runs, "throughput", "x", "y") == [0.5, 2.0]
    assert round_ratios(runs, "peak", "x", "y") == [40.0, 300.0]  # 0 bytes floored at 1


def test_cli_help_and_bad_run_dir(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["--help"]).exit_code == 0
    result = runner.invoke(main, ["reload", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "nowhere" in result.output
    result = runner.invoke(main, ["compare", str(tmp_path), "--fault", "no-such-fault"])
    assert result.exit_code == 2 and "no-such-fault" in result.output
