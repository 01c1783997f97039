"""`deployment-audit bench`: the report keeps its format and the paths compute the
same function. No speed is asserted here (a test may run a
benchmark at a tiny size to check that it still works, never to assert a speed)."""

import json
import math

from click.testing import CliRunner

from deployment_audit.bench import bench

PATHS = {"native_b1", "native_b1_aa", "exported_b1", "native_b64", "exported_b64"}


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
    # Same function, same bits; and the timed rounds never compile.
    assert report["checks"]["exported_equals_native_b1_bitwise"] is True
    assert report["checks"]["exported_equals_native_b64_bitwise"] is True
    assert report["checks"]["compiles_while_timed"] == 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exported_vs_native" in result.stdout
    assert "training" in result.stderr  # Progress goes to stderr.
