"""The report side of `training-methods bench`: what bounds each framework's
step (`step_limits`), the timing ratios with their baselines, A/A controls and
per-repetition spreads (`step_ratios`), and the identity of the run. `bench.py`
times; this module derives.
"""

import hashlib
import os
import platform
import subprocess

import jax
import numpy as np
import torch

from training_methods.config import Config


def thread_label(n: int) -> str:
    return f"{n}thread" if n == 1 else f"{n}threads"


def step_limits(steps: dict) -> dict:
    """What bounds each framework's step, from the timings of `step_timings`.

    Per framework: the achieved FLOP rate of the full-batch step (XLA's count of
    the JAX program, the same arithmetic in both) as a fraction of the dense
    matmul rate, and the linear fit `t(b) = fixed + per_example * b` through the
    quarter and full batches: `fixed_s` and its share of the full step.
    """
    flops = steps["jax_step"]["flops"]
    b_full, b_quarter = steps["batch_size"], steps["quarter_batch"]["batch_size"]
    out = {}
    for name, full, quarter, rate in (
        (
            "jax",
            steps["jax_step"],
            steps["quarter_batch"]["jax_step"],
            steps["matmul"]["jax_flop_per_s"],
        ),
        (
            "torch",
            steps["torch_eager_step"],
            steps["quarter_batch"]["torch_eager_step"],
            steps["matmul"]["torch_flop_per_s"],
        ),
    ):
        t_full, t_quarter = full["median_s"], quarter["median_s"]
        per_example = (t_full - t_quarter) / (b_full - b_quarter)
        fixed = t_full - per_example * b_full
        out[name] = {
            "flop_per_s": flops / t_full,
            "fraction_of_matmul_rate": flops / t_full / rate,
            "fixed_s": fixed,
            "fixed_share": fixed / t_full,
            "per_example_s": per_example,
        }
    return out


def identity(config: Config) -> dict:
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        commit = "unknown"
    return {
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
        "torch": torch.__version__,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": commit,
        "machine": platform.machine(),
        "config_sha256": hashlib.sha256(config.to_json().encode()).hexdigest(),
    }


def spread(rounds: list[float]) -> dict:
    return {
        "rounds": [float(r) for r in rounds],
        "min": float(np.min(rounds)),
        "median": float(np.median(rounds)),
        "max": float(np.max(rounds)),
    }


def step_ratios(steps: dict) -> tuple[dict[str, float], dict[str, dict]]:
    """The timing ratios of `step_timings` and their details.

    Each ratio is a ratio of medians. `rounds`: for the phase-2 ratios the
    calls of one repetition (torch's over copy A's, copy B's over copy A's);
    for the per-thread ratios of the trial each torch call over the JAX call
    right after it; for the order effect, repetitions 2k (JAX after torch at 1
    thread) and 2k + 1 (after N threads), the sum of the two JAX calls of the
    second over the first's.
    """
    series = steps["series"]
    jax_a, jax_b = np.asarray(series["jax_a"]), np.asarray(series["jax_b"])
    torch_main = np.asarray(series["torch"])
    candidates = steps["threads"]["torch_candidates"]
    best = steps["threads"]["torch_best"]
    trial = steps["thread_trial"]
    aa = float(np.median(jax_b) / np.median(jax_a))
    same = "same weights, objective (response-only cross-entropy) and AdamW, same batch"
    ratios = {"jax_vs_torch_step": float(np.median(torch_main) / np.median(jax_a))}
    details = {
        "jax_vs_torch_step": {
            "baseline": f"PyTorch eager at its best thread count: {best}, the faster median "
            f"of {', '.join(map(str, candidates))} threads in the thread trial; {same}",
            "aa": aa,
            "aa_ratio": "jax_vs_jax_control",
            **spread(list(torch_main / jax_a)),
        }
    }
    for n in candidates:
        name = f"jax_vs_torch_step_{thread_label(n)}"
        torch_n = trial["torch_eager_step_by_threads"][str(n)]["median_s"]
        after = trial["jax_step_after_torch"].get(str(n))
        pairs = trial["pairs"][str(n)]
        if after is None or not pairs:
            continue
        ratios[name] = torch_n / after["median_s"]
        details[name] = {
            "baseline": f"PyTorch eager at {n} thread(s) in the thread trial, against the "
            f"JAX steps timed right after it; {same}",
            "aa": aa,
            "aa_ratio": "jax_vs_jax_control",
            **spread([t / j for t, j in pairs]),
        }
    ratios["jax_vs_jax_control"] = aa
    details["jax_vs_jax_control"] = {
        "baseline": "the same jitted JAX step (copy B) timed in the same repetitions as copy A",
        "aa": aa,
        "aa_ratio": "jax_vs_jax_control",
        **spread(list(jax_b / jax_a)),
    }
    after = trial["jax_step_after_torch"]
    first, last = candidates[0], candidates[-1]
    if len(candidates) > 1 and str(first) in after and str(last) in after:
        after_first = np.asarray(after[str(first)]["series"])
        after_last = np.asarray(after[str(last)]["series"])
        count = min(len(after_first), len(after_last)) // 2
        rounds = [
            float(after_last[2 * k : 2 * k + 2].sum() / after_first[2 * k : 2 * k + 2].sum())
            for k in range(count)
        ]
        name = f"jax_after_torch_{thread_label(first)}_vs_after_torch_{thread_label(last)}"
        ratios[name] = float(np.median(after_last) / np.median(after_first))
        details[name] = {
            "baseline": f"the JAX steps timed right after a {last}-thread PyTorch step "
            f"(the order effect; over the JAX steps right after a {first}-thread one)",
            "aa": aa,
            "aa_ratio": "jax_vs_jax_control",
            **(spread(rounds) if rounds else spread([ratios[name]])),
        }
    return ratios, details
