"""The bench: its limit figures are computed from the timings (checked on
constructed timings with a known answer), and the command runs end to end at
a tiny size and writes the report (no speed is asserted here)."""

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from training_methods.bench_report import step_limits
from training_methods.cli import main

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.json")


def _timings(fixed_jax, per_jax, fixed_torch, per_torch, flops=6.4e8):
    def step(fixed, per, batch):
        return {"median_s": fixed + per * batch}

    return {
        "batch_size": 64,
        "jax_step": {**step(fixed_jax, per_jax, 64), "flops": flops},
        "torch_eager_step": step(fixed_torch, per_torch, 64),
        "quarter_batch": {
            "batch_size": 16,
            "jax_step": step(fixed_jax, per_jax, 16),
            "torch_eager_step": step(fixed_torch, per_torch, 16),
        },
        "matmul": {"jax_flop_per_s": 1e11, "torch_flop_per_s": 2e11},
    }


@pytest.mark.parametrize(
    "fixed_jax, per_jax, fixed_torch, per_torch",
    [(0.004, 0.0002, 0.008, 0.0001), (0.010, 0.0, 0.001, 0.0005)],
)
def test_limits_recover_the_fixed_and_per_example_parts(fixed_jax, per_jax, fixed_torch, per_torch):
    limits = step_limits(_timings(fixed_jax, per_jax, fixed_torch, per_torch))
    for name, fixed, per, rate in (
        ("jax", fixed_jax, per_jax, 1e11),
        ("torch", fixed_torch, per_torch, 2e11),
    ):
        full = fixed + 64 * per
        got = limits[name]
        assert math.isclose(got["fixed_s"], fixed, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(got["per_example_s"], per, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(got["fixed_share"], fixed / full, rel_tol=1e-9)
        assert math.isclose(got["flop_per_s"], 6.4e8 / full, rel_tol=1e-12)
        assert math.isclose(got["fraction_of_matmul_rate"], 6.4e8 / full / rate, rel_tol=1e-12)


def test_bench_smoke(tmp_path):
    config = json.loads(Path(TINY).read_text())
    config.update(d_model=16, num_heads=2, num_layers=1, batch_size=8)
    (tmp_path / "small.json").write_text(json.dumps(config))
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--config",
            str(tmp_path / "small.json"),
            "--out",
            str(out),
            "--repetitions",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report) >= {"identity", "measurements", "ratios", "targets", "met", "limits"}
    for name, target in report["targets"].items():
        assert report["met"][name] == (report["ratios"][name] >= target)
    assert (
        report["measurements"]["jax_step"]["flops"]
        > (report["measurements"]["quarter_batch"]["jax_step"]["flops"])
    )
    for lim in report["limits"].values():
        assert lim["flop_per_s"] > 0 and 0 < lim["fraction_of_matmul_rate"]
    assert "batch-independent part" in result.output

    # Every ratio names its baseline, its A/A control and its spread.
    m = report["measurements"]
    threads = m["threads"]
    assert threads["torch_candidates"][0] == 1
    assert threads["torch_best"] in threads["torch_candidates"]
    assert m["torch_eager_step"]["threads"] == threads["torch_best"]
    by_threads = m["thread_trial"]["torch_eager_step_by_threads"]
    assert set(by_threads) == {str(n) for n in threads["torch_candidates"]}
    best = min(by_threads.values(), key=lambda x: x["median_s"])
    assert best["threads"] == threads["torch_best"]
    assert set(report["ratio_details"]) == set(report["ratios"])
    for name, d in report["ratio_details"].items():
        assert isinstance(d["baseline"], str) and d["baseline"], name
        assert math.isfinite(d["aa"]) and d["aa"] > 0, name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["min"] == min(d["rounds"]) and d["max"] == max(d["rounds"]), name
    series = m["series_s"]
    assert len(series["jax_a"]) == len(series["jax_b"]) == len(series["torch"]) == 2
    # The per-repetition ratios pair the calls of one repetition, recomputed here.
    want = [t / a for t, a in zip(series["torch"], series["jax_a"], strict=True)]
    assert report["ratio_details"]["jax_vs_torch_step"]["rounds"] == pytest.approx(want)
    # Every thread count of the trial has its named ratio, its torch calls each
    # paired with the JAX call after it (all but possibly the last torch call).
    for n in threads["torch_candidates"]:
        label = f"{n}thread" if n == 1 else f"{n}threads"
        assert f"jax_vs_torch_step_{label}" in report["ratios"]
        pairs = m["thread_trial"]["pairs"][str(n)]
        assert len(pairs) >= by_threads[str(n)]["n"] - 1
    assert report["ratio_details"]["jax_vs_jax_control"]["aa"] == pytest.approx(
        report["ratios"]["jax_vs_jax_control"]
    )
    assert report["ratio_details"]["full_vs_lora_optimizer_bytes"]["aa"] == 1.0
