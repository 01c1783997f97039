"""`deployment-audit bench`: the report keeps its format and the paths compute the
same function. No speed is asserted here (a test may run a
benchmark at a tiny size to check that it still works, never to assert a speed)."""

import json
import math

import pytest
from click.testing import CliRunner

from deployment_audit.bench import bench

PATHS = {
    "native_b1",
    "native_b1_aa",
    "exported_b1",
    "exported_b1_aa",
    "native_b64",
    "native_b64_aa",
    "exported_b64",
}


def test_tiny_bench_report(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(bench, ["--size", "tiny", "--no-load", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {"identity", "measurements", "ratios", "checks", "targets"} <= report.keys()
    for key in ("jax", "jaxlib", "flax", "backend", "devices", "xla_flags", "commit"):
        assert key in report["identity"], key
    assert len(report["identity"]["config_sha256"]) == 64
    assert set(report["measurements"]) == PATHS
    for name, m in report["measurements"].items():
        assert m["n"] == len(m["times_s"]) >= 20, name
        for key in ("compile_s", "first_call_s", "median_s", "p90_s"):
            assert math.isfinite(m[key]) and m[key] > 0, (name, key)
        assert m["p90_s"] >= m["median_s"]
    for name in ("exported_vs_native", "batched_vs_unbatched", "native_vs_native_aa"):
        assert math.isfinite(report["ratios"][name]) and report["ratios"][name] > 0
    # Every ratio: a named baseline, an A/A, per-round spread, the fastest rounds' ratio,
    # each recomputed here from the recorded per-round times.
    m = report["measurements"]
    assert set(report["ratio_details"]) == set(report["ratios"])
    for name, d in report["ratio_details"].items():
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        fast, base = m[d["paths"]["faster"]], m[d["paths"]["baseline"]]
        rows = fast["batch"] // base["batch"]  # rows/s: 64 for batch 64 against batch 1
        per_round = [rows * b / f for f, b in zip(fast["times_s"], base["times_s"], strict=True)]
        assert d["rounds"] == pytest.approx(per_round, rel=1e-12), name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["min"] == pytest.approx(min(per_round)) and d["max"] == pytest.approx(
            max(per_round)
        )
        fastest = rows * min(base["times_s"]) / min(fast["times_s"])
        assert d["from_fastest"] == pytest.approx(fastest, rel=1e-12), name
        assert d["value"] == pytest.approx(report["ratios"][name], rel=1e-12), name
        copy = m[d["paths"]["aa_copy"]]
        assert d["aa"] == pytest.approx(base["median_s"] / copy["median_s"], rel=1e-12), name
        lo, mid, hi = d["aa_rounds_min_median_max"]
        assert 0 < lo <= mid <= hi, name
    batched = report["ratio_details"]["batched_vs_unbatched"]["paths"]
    assert batched == {
        "faster": "exported_b64",
        "baseline": "exported_b1",
        "aa_copy": "exported_b1_aa",
    }
    # Same function, same bits; and the timed rounds never compile.
    assert report["checks"]["exported_equals_native_b1_bitwise"] is True
    assert report["checks"]["exported_equals_native_b64_bitwise"] is True
    assert report["checks"]["compiles_while_timed"] == 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exported_vs_native" in result.stdout
    assert "training" in result.stderr  # Progress goes to stderr.
