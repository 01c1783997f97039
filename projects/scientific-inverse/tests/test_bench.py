"""`scientific-inverse bench`: the report keeps its documented format, every
ratio names its baseline with its per-round spread and A/A control, the two
solvers do the same work and the four gradients agree. No speed is asserted
here (a test may run a benchmark on a tiny size to check that it still works,
never to assert a speed)."""

import json
import math

import pytest
from click.testing import CliRunner

from scientific_inverse.bench import bench

PATHS = (
    "diffrax_forward",
    "gradient_sensitivity_ode",
    "gradient_jacfwd",
    "gradient_reverse",
    "gradient_reverse_sqrt_checkpoints",
    "diffrax_aa",
    "scipy_loop",
)
RATIOS = {
    "diffrax_vs_scipy",
    "forward_vs_gradient",
    "forward_vs_gradient_jacfwd",
    "forward_vs_gradient_reverse",
    "forward_vs_gradient_reverse_sqrt_checkpoints",
    "diffrax_vs_diffrax_aa",
}
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
    assert {"identity", "measurements", "ratios", "ratio_details"} <= data.keys()
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
    for name in ("diffrax_forward", "gradient_sensitivity_ode", "gradient_reverse"):
        assert data["measurements"][name]["compile_s"] > 0, name
    assert set(data["ratios"]) == RATIOS
    assert all(math.isfinite(v) and v > 0 for v in data["ratios"].values())


def test_every_ratio_has_baseline_spread_and_aa(report):
    data, _, _ = report
    assert set(data["ratio_details"]) == RATIOS
    reps = data["config"]["reps"]
    for name, d in data["ratio_details"].items():
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert d["a"] in PATHS and d["b"] in PATHS, name
        assert len(d["rounds"]) == reps, name
        assert d["min"] == min(d["rounds"]) and d["max"] == max(d["rounds"]), name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["aa"]["min"] <= d["aa"]["median"] <= d["aa"]["max"], name
        # The headline ratio is the ratio of the two paths' median times.
        expected = (
            data["measurements"][d["b"]]["median_s"] / data["measurements"][d["a"]]["median_s"]
        )
        assert data["ratios"][name] == pytest.approx(expected), name
    aa = data["ratio_details"]["diffrax_vs_diffrax_aa"]
    assert aa["rounds"] == aa["aa"]["rounds"]


def test_timed_rounds_compile_nothing_and_solvers_agree(report):
    data, _, _ = report
    assert data["compiles_in_timed_rounds"] == 0
    agreement = data["agreement"]
    # Both solvers hold a local error of rtol = atol = 1e-6 per step; over the
    # window the global difference stays far below 1e-3 of a unit-size trajectory.
    assert agreement["max_abs_diffrax_minus_scipy"] < 1e-3 * agreement["trajectory_scale"]


def test_the_four_gradients_agree(report):
    data, _, _ = report
    agreement = data["agreement"]
    scale = agreement["gradient_scale"]
    assert scale > 0
    # Forward and reverse mode differentiate the same Tsit5 steps (their sizes are not
    # differentiated): equal up to float64 round-off accumulated along the solve. The
    # sensitivity solve takes the same steps (error control on the state only).
    for name in ("gradient_sensitivity_ode", "gradient_jacfwd"):
        assert agreement[f"max_abs_{name}_minus_gradient_reverse"] < 1e-9 * scale, name
    # Default checkpointing recomputes the same steps, whose accepted step sizes
    # can differ only through round-off in the controller.
    assert (
        agreement["max_abs_gradient_reverse_sqrt_checkpoints_minus_gradient_reverse"] < 1e-6 * scale
    )
