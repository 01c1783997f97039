"""`policy-evaluation bench` at the tiny size: it runs, writes JSON + PNG with
every ratio, each ratio with its baseline, per-round spread and A/A control,
and the vmapped and sequential PPO compute the same parameters. The Python
baseline's precomputed successor tables draw the grid world's own transition
probabilities. No speed is asserted (timings on a shared CPU are noise at
this size)."""

import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from policy_evaluation.bench_paths import GridTables, sample_successor
from policy_evaluation.cli import main
from policy_evaluation.envs import GridWorld

RATIOS = {
    "jax_vs_python",
    "jax_vs_python_choice",
    "jax_vs_gymnasium",
    "jax_vs_gymnasium_sync",
    "jax_no_draws_vs_gymnasium",
    "vmapped_seeds_vs_sequential",
    "vmapped_one_device_vs_sequential",
    "vmapped_seeds_vs_sequential_one_device",
    "pcg64_vs_threefry",
}


def test_bench_tiny_writes_report(tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--size", "tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert set(report["ratios"]) == RATIOS | {"aa_control"}
    assert all(v > 0 for v in report["ratios"].values())
    assert all(p["reps"] >= 20 for p in report["paths"].values())
    assert set(report["ratio_details"]) == RATIOS
    for name, d in report["ratio_details"].items():
        assert isinstance(d["baseline"], str) and d["baseline"], name
        assert len(d["rounds"]) == len(d["aa_rounds"]) == 20, name
        assert d["min"] <= d["median"] <= d["max"], name
        assert d["aa_min"] <= d["aa"] <= d["aa_max"], name
        assert d["median"] == report["ratios"][name], name
        assert f"{d['aa_path']}_aa" in report["paths"], name
    assert report["ratios"]["aa_control"] == report["ratio_details"]["jax_vs_python"]["aa"]
    assert all(p["cpu_per_wall"] >= 0 for p in report["paths"].values())
    assert set(report["rng_ns_per_word"]) == {"threefry", "pcg64"}
    # Recorded, not bounded: after several updates rounding differences between
    # batched and unbatched matmuls can flip a sampled action (stage 4 checks one update).
    assert report["identity"]["ppo_vmapped_vs_sequential_max_abs_param_diff"] >= 0.0
    # The same single-seed program on another CPU device computes the same numbers.
    assert report["identity"]["ppo_sequential_devices_vs_one_device_max_abs_param_diff"] == 0.0
    assert [p["envs"] for p in report["cartpole_sweep"]] == [4, 8]
    assert all(p["jax_vs_gymnasium"] > 0 for p in report["cartpole_sweep"])
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize(("state", "action"), [(0, 0), (6, 1), (9, 3), (15, 2)])
def test_python_baseline_draws_the_transition_probabilities(state, action):
    env = GridWorld()
    P, R, _ = env.transition_table()
    tables = GridTables.of(env)
    rng = random.Random(1)
    n = 40_000
    counts = np.zeros(env.num_states)
    for _ in range(n):
        s2, reward = sample_successor(tables, state, action, rng.random())
        counts[s2] += 1
        assert reward == R[state, action, s2]
    # Binomial standard error of each frequency; 5 of them is a bound a correct
    # sampler misses with probability below 1e-5 per cell.
    p = P[state, action]
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts / n - p) <= 5 * sigma + 1e-12)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(p))


def test_python_baseline_covers_the_unit_interval_ends():
    tables = GridTables.of(GridWorld())
    for s in range(16):
        for a in range(4):
            assert len(tables.thresholds[s][a]) == len(tables.successors[s][a]) - 1
            first, _ = sample_successor(tables, s, a, 0.0)
            last, _ = sample_successor(tables, s, a, np.nextafter(1.0, 0.0))
            assert first == tables.successors[s][a][0]
            assert last == tables.successors[s][a][-1]


def test_ratio_detail_pairs_rounds_and_keeps_the_spread():
    from policy_evaluation.bench_stats import per_round, ratio_detail

    rounds = per_round([4.0, 9.0, 2.0], [2.0, 3.0, 2.0])
    assert rounds == [2.0, 3.0, 1.0]
    d = ratio_detail("a loop", rounds, [1.0, 0.5, 2.0], "fast")
    assert (d["min"], d["median"], d["max"]) == (1.0, 2.0, 3.0)
    assert (d["aa_min"], d["aa"], d["aa_max"]) == (0.5, 1.0, 2.0)
    assert d["baseline"] == "a loop" and d["aa_path"] == "fast"
