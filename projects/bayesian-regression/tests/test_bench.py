"""`bayesian-regression bench` on a tiny posterior run: the report keeps its
documented format, every ratio names its baseline and carries its spread and
A/A control, the compiled paths compile nothing while timed, and the compiled
NUTS program does the same work as a plain `MCMC.run`. No speed is asserted (a
test may run a benchmark on a tiny size to check that it still works, never to
assert a speed)."""

import json
import math

import pytest

from bayesian_regression import bench
from bayesian_regression.config import Config

TINY = Config(num_warmup=20, num_samples=12, num_leapfrog=3)
REPEATS = 3
RATIOS = {
    "vmapped_chains_vs_sequential",
    "vmapped_control_vs_vmapped",
    "hmc_vs_nuts_ess_per_s",
    "hmc_vs_nuts_ess_per_s_numpyro_run",
    "hmc_vs_nuts_ess_per_grad",
    "hmc_vs_nuts_ess_per_grad_sampling",
    "hmc_control_vs_hmc",
}
COMPILED_PATHS = (
    "hmc_8_chains_vmapped",
    "hmc_8_chains_sequential",
    "hmc_8_chains_vmapped_control",
    "hmc_ess_run",
    "nuts_compiled_run",
    "hmc_ess_run_control",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = bench.run(out, repeats=REPEATS, progress=lambda message: None, config=TINY)
    return result, json.loads(out.read_text(encoding="utf-8"))


def test_the_report_file_holds_what_run_returned(report):
    result, written = report
    assert written == json.loads(json.dumps(result))
    assert {"identity", "measurements", "ratios", "ratio_details"} <= written.keys()
    for key in ("jax", "numpyro", "backend", "devices", "xla_flags", "commit"):
        assert key in written["identity"], key
    assert len(written["identity"]["config_sha256"]) == 64


def test_every_ratio_names_its_baseline_with_spread_and_aa(report):
    _, data = report
    assert set(data["ratios"]) == RATIOS
    assert set(data["ratio_details"]) == RATIOS
    for name, detail in data["ratio_details"].items():
        assert isinstance(detail["baseline"], str) and len(detail["baseline"]) > 20, name
        assert detail["min"] <= detail["median"] <= detail["max"], name
        assert detail["rounds"] and min(detail["rounds"]) == detail["min"], name
        assert math.isfinite(data["ratios"][name]) and data["ratios"][name] > 0, name
    for name in RATIOS:  # every ratio has an A/A, the per-gradient ones too
        aa = data["ratio_details"][name]["aa"]
        assert aa["min"] <= aa["median"] <= aa["max"], name
    assert len(data["ratio_details"]["vmapped_chains_vs_sequential"]["rounds"]) == REPEATS
    assert len(data["ratio_details"]["hmc_vs_nuts_ess_per_s"]["rounds"]) == 3


def test_compiled_paths_compile_nothing_while_timed(report):
    _, data = report
    for name in COMPILED_PATHS:
        m = data["measurements"][name]
        assert m["compiles_in_timed_calls"] == 0, name
        assert m["cache_hits_in_timed_calls"] == 0, name
        assert m["min_s"] <= m["median_s"] <= m["max_s"], name
    assert data["measurements"]["nuts_mcmc_run"]["compile_s"] is None


def test_compiled_nuts_does_the_work_of_mcmc_run(report):
    """On 32 iterations float32 rounding has not yet flipped a tree decision: the
    compiled program and `MCMC.run` give the same trees and the same draws."""
    _, data = report
    same = data["nuts_compiled_vs_mcmc_run"]
    assert same["same_tree_sizes"] is True
    assert same["max_abs_draw_difference"] < 1e-3
    leapfrog = same["mean_leapfrog_per_draw"]
    assert leapfrog["compiled"] == pytest.approx(leapfrog["mcmc_run"])
    assert same["min_bulk_ess"]["compiled"] == pytest.approx(
        same["min_bulk_ess"]["mcmc_run"], rel=1e-3
    )
    assert same["divergences"]["compiled"] == same["divergences"]["mcmc_run"]


def test_gradient_counts_follow_from_the_settings(report):
    _, data = report
    e = data["ess"]
    chains = bench.NUM_CHAINS
    draws, warm, steps = TINY.num_samples, TINY.num_warmup, TINY.num_leapfrog
    assert e["hmc_gradient_evaluations_sampling"] == chains * draws * steps
    assert e["hmc_gradient_evaluations"] == chains * ((warm + draws) * steps + 1)
    assert (
        e["nuts_gradient_evaluations"]
        == e["nuts_gradient_evaluations_warmup"] + e["nuts_gradient_evaluations_sampling"]
    )
    # A NUTS tree has at least one leapfrog step per iteration.
    assert e["nuts_gradient_evaluations_warmup"] >= chains * warm
    assert e["nuts_gradient_evaluations_sampling"] >= chains * draws
    per_grad = (e["hmc_min_bulk_ess"] / e["hmc_gradient_evaluations"]) / (
        e["nuts_min_bulk_ess"] / e["nuts_gradient_evaluations"]
    )
    assert data["ratios"]["hmc_vs_nuts_ess_per_grad"] == pytest.approx(per_grad)


def test_per_gradient_ratios_take_their_aa_from_a_second_key(report):
    """The A/A of a per-gradient ratio is the same ratio worked out from the
    second key's own ESS and counts; another key gives other draws, so the
    control is not 1 by construction."""
    _, data = report
    e, second = data["ess"], data["ess"]["second_key"]
    draws = TINY.num_samples * bench.NUM_CHAINS * TINY.num_leapfrog
    sampled = second["nuts_gradient_evaluations_sampling"]
    assert sampled >= TINY.num_samples * bench.NUM_CHAINS
    assert second["nuts_gradient_evaluations_warmup"] >= TINY.num_warmup * bench.NUM_CHAINS
    total = second["nuts_gradient_evaluations_warmup"] + sampled
    per_grad = (second["hmc_min_bulk_ess"] / e["hmc_gradient_evaluations"]) / (
        second["nuts_min_bulk_ess"] / total
    )
    per_grad_sampling = (second["hmc_min_bulk_ess"] / draws) / (
        second["nuts_min_bulk_ess"] / sampled
    )
    for name, on_second in (
        ("hmc_vs_nuts_ess_per_grad", per_grad),
        ("hmc_vs_nuts_ess_per_grad_sampling", per_grad_sampling),
    ):
        aa = data["ratio_details"][name]["aa"]
        assert aa["median"] == pytest.approx(on_second / data["ratios"][name]), name
        assert aa["median"] != 1.0, name
    assert second["hmc_min_bulk_ess"] != e["hmc_min_bulk_ess"]
