"""`scientific-inverse bench`: the report keeps its documented format and the
two solvers do the same work. No speed is asserted here (a test
may run a benchmark on a tiny size to check that it still works, never to
assert a speed)."""

import json
import math

import pytest
from click.testing import CliRunner

from scientific_inverse.bench import bench

PATHS = ("diffrax_forward", "diffrax_gradient", "diffrax_aa", "scipy_loop")
IDENTITY_KEYS = (
    "jax",
    "jaxlib",
    "diffrax",
    "scipy",
    "backend",
    "devices",
    "xla_flags",
    "commit",
    "config_sha256",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(bench, ["--size", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), out, result


def test_report_has_the_benchmarks_format(report):
    data, out, result = report
    assert {"identity", "measurements", "ratios"} <= data.keys()
    for key in IDENTITY_KEYS:
        assert key in data["identity"], key
    assert len(data["identity"]["config_sha256"]) == 64
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "diffrax_vs_scipy" in result.output


def test_every_path_measured_and_ratios_named(report):
    data, _, _ = report
    assert set(data["measurements"]) == set(PATHS)
    for name, m in data["measurements"].items():
        for key in ("compile_s", "first_call_s", "median_s", "p90_s", "n"):
            assert key in m, (name, key)
        assert m["n"] >= 20 and 0 < m["median_s"] <= m["p90_s"]
    assert data["measurements"]["diffrax_forward"]["compile_s"] > 0
    assert set(data["ratios"]) == {
        "diffrax_vs_scipy",
        "forward_vs_gradient",
        "diffrax_vs_diffrax_aa",
    }
    assert all(math.isfinite(v) and v > 0 for v in data["ratios"].values())


def test_timed_rounds_compile_nothing_and_solvers_agree(report):
    data, _, _ = report
    assert data["compiles_in_timed_rounds"] == 0
    agreement = data["agreement"]
    # Both solvers hold a local error of rtol = atol = 1e-6 per step; over the
    # window the global difference stays far below 1e-3 of a unit-size trajectory.
    assert agreement["max_abs_diffrax_minus_scipy"] < 1e-3 * agreement["trajectory_scale"]
