"""`training-methods bench`: optimizer bytes of full fine-tuning vs LoRA, and one
training step in jitted JAX vs PyTorch eager, side by side in one process.

Run: `training-methods bench [--out runs/bench/bench.json] [--repetitions 20]`
(20 to 60 s on a 2-core CPU).

Ratios (above 1: the first is smaller or faster):
  - `full_vs_lora_optimizer_bytes`: AdamW state bytes, all parameters vs LoRA rank 4;
  - `jax_vs_torch_step`: median time of one SFT training step (forward,
    backward, AdamW) of the stage-8 Transformer, PyTorch eager over jitted JAX.
    Each side runs at its own best thread count: JAX at XLA's CPU default (one
    intra-op thread per visible core), PyTorch timed at 1 thread and at one per
    visible core in the same interleaved rounds, the faster median kept as the
    baseline; both are kept as named ratios (`jax_vs_torch_step_1thread`,
    `jax_vs_torch_step_2threads` on 2 cores);
  - `jax_vs_jax_control`: an A/A control, two interleaved copies of the JAX
    step (shows the noise of the machine; ~1 when quiet);
  - `jax_after_torch_1thread_vs_after_torch_Nthreads`: the order effect, the
    JAX steps timed right after a 1-thread PyTorch step against those timed
    right after an N-thread one (above 1: PyTorch's worker threads, still
    spinning, slow the JAX step that follows).
Timed calls per repetition: A, torch(1), B, torch(N), then B, torch(N), A,
torch(1): each JAX copy follows each torch setting in half the repetitions.
Compilation is timed apart (`lower`, `compile`, first call). `ratio_details`
gives, per ratio, the baseline (a sentence), its A/A control and the
per-repetition ratios (min, median, max).

What bounds the step (`limits`): each framework's achieved FLOP rate against
the rate of a dense matmul on the same cores (PyTorch at the thread count its
step was timed at), and the part of the step that does not shrink with the
batch (fitted through the full and a quarter batch).
"""

import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from training_methods import lora, sft
from training_methods.bench_report import identity, spread, step_limits, step_ratios
from training_methods.config import Config
from training_methods.data import generate, split_ids, vocab_size
from training_methods.model import build
from training_methods.parity import TorchTransformer, load_from_nnx
from training_methods.train import create_train_state, make_train_step, optimizer


def optimizer_bytes(config: Config, rank: int = 4) -> dict[str, int]:
    model = build(config, key=jax.random.key(0))
    tx = optimizer(config)
    full = lora.nbytes(tx.init(nnx.state(model, nnx.Param)))
    adapted = lora.apply_lora(nnx.clone(model), rank, config.lora_alpha, key=jax.random.key(1))
    small = lora.nbytes(tx.init(nnx.state(adapted, nnx.LoRAParam)))
    return {"full": full, f"lora_r{rank}": small}


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _steps(config: Config, batch_size: int) -> dict:
    """The JAX and PyTorch training steps of the stage-8 Transformer on the first
    `batch_size` training examples, compiled and called once each.

    Returns the two zero-argument step callables (each waits for its result),
    the compile-phase timings, and XLA's FLOP count of the compiled JAX step.
    """
    corpus = generate(config, split_ids(config)["train"][:batch_size])
    tokens = jnp.asarray(corpus.tokens)
    batch = {"tokens": tokens, "prompt_len": jnp.asarray(corpus.prompt_len)}
    model = build(config, key=jax.random.key(0))
    tx = optimizer(config)
    graphdef, state = create_train_state(model, tx)
    step = make_train_step(graphdef, tx, sft.loss_fn)
    key = jax.random.key(1)
    t0 = time.perf_counter()
    lowered = step.lower(state, batch, key)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(state, batch, key))
    t3 = time.perf_counter()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost

    # PyTorch eager: the same architecture and weights, the same objective and optimizer.
    # Its thread count is set by the caller before each timed call.
    tmodel = load_from_nnx(
        TorchTransformer(
            vocab_size(config), config.seq_len, config.d_model, config.num_heads, config.num_layers
        ),
        model,
    )
    topt = torch.optim.AdamW(tmodel.parameters(), lr=config.learning_rate, weight_decay=0.0)
    ttokens = torch.from_numpy(np.asarray(corpus.tokens, np.int64))
    tmask = torch.from_numpy(np.array(sft.response_mask(tokens[:, 1:], batch["prompt_len"])))

    def torch_step():
        logits = tmodel(ttokens[:, :-1])
        ce = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ttokens[:, 1:], reduction="none"
        )
        loss = (ce * tmask).sum() / tmask.sum()
        topt.zero_grad()
        loss.backward()
        topt.step()

    t4 = time.perf_counter()
    torch_step()
    t5 = time.perf_counter()

    holder = {"state": state}

    def jax_step():
        new_state, loss, _ = compiled(holder["state"], batch, key)
        jax.block_until_ready(loss)
        holder["state"] = new_state

    return {
        "jax": jax_step,
        "torch": torch_step,
        "compile": {"lower_s": t1 - t0, "compile_s": t2 - t1, "first_call_s": t3 - t2},
        "torch_first_call_s": t5 - t4,
        "flops": float(cost["flops"]),
    }


def _summary(xs, **extra) -> dict:
    return {
        **extra,
        "median_s": float(np.median(xs)),
        "p90_s": float(np.percentile(xs, 90)),
        "min_s": float(np.min(xs)),
        "max_s": float(np.max(xs)),
        "n": len(xs),
    }


def matmul_rate(torch_threads: list[int], size: int = 512, repetitions: int = 20) -> dict:
    """FLOP/s of one dense float32 `size x size` matmul: jitted JAX (XLA's
    default threads) and PyTorch at each of `torch_threads`, interleaved: the
    arithmetic rate this CPU reaches when kernels are large."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    jax.block_until_ready(matmul(a))
    ta = torch.from_numpy(np.array(a))
    flops = 2.0 * size**3
    jax_t: list[float] = []
    torch_t: dict[int, list[float]] = {n: [] for n in torch_threads}
    for n in torch_threads:
        torch.set_num_threads(n)
        torch.mm(ta, ta)
    for _ in range(repetitions):
        jax_t += _timed(lambda: jax.block_until_ready(matmul(a)), 1)
        for n in torch_threads:
            torch.set_num_threads(n)
            torch_t[n] += _timed(lambda: torch.mm(ta, ta), 1)
    return {
        "size": size,
        "jax_flop_per_s": flops / float(np.median(jax_t)),
        "torch_flop_per_s_by_threads": {
            str(n): flops / float(np.median(t)) for n, t in torch_t.items()
        },
    }


def torch_thread_candidates() -> list[int]:
    """1 and the number of visible cores (one entry on a 1-core machine)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return sorted({1, cores or 1})


def _thread_rounds(full: dict, candidates: list[int], repetitions: int) -> dict:
    """Phase 1, the thread trial: per repetition the JAX step twice and the
    PyTorch step once at each thread count, ordered A, torch(1), B, torch(N)
    then B, torch(N), A, torch(1), so that each JAX copy follows each torch
    setting in half the repetitions.

    Returns `torch[n]` (the torch times at n threads), `after[n]` (the JAX
    calls timed right after a torch call at n threads) and `pairs[n]` (each
    torch call at n threads with the JAX call that followed it).
    """
    first_t, last_t = candidates[0], candidates[-1]
    torch_t: dict[int, list[float]] = {n: [] for n in candidates}
    after: dict[int, list[float]] = {n: [] for n in candidates}
    pairs: dict[int, list[tuple[float, float]]] = {n: [] for n in candidates}
    # One untimed call per thread count starts its worker pool; the last one
    # at `first_t`, which is what precedes every other repetition.
    for n in reversed(candidates):
        _torch_call(full["torch"], n)
    # The torch call just before, (n, its time); the warm-up call has no time.
    previous: tuple[int, float | None] | None = (first_t, None)
    for i in range(repetitions):
        order = [("jax", None), ("torch", first_t), ("jax", None), ("torch", last_t)]
        if i % 2:
            order = [order[0], order[3], order[2], order[1]]
        if len(candidates) == 1:
            order = order[:3]
        for kind, n in order:
            if kind == "torch":
                (t,) = _torch_call(full["torch"], n)
                torch_t[n].append(t)
                previous = (n, t)
                continue
            (t,) = _timed(full["jax"], 1)
            if previous is not None:
                after[previous[0]].append(t)
                if previous[1] is not None:
                    pairs[previous[0]].append((previous[1], t))
            previous = None
    return {"torch": torch_t, "after": after, "pairs": pairs}


def _torch_call(fn, n: int) -> list[float]:
    torch.set_num_threads(n)  # Outside the timed region.
    return _timed(fn, 1)


def step_timings(config: Config, repetitions: int = 20) -> dict:
    """Medians of the JAX and PyTorch training steps at the configured batch and
    at a quarter of it, and XLA's FLOP count of each JAX step.

    Phase 1 (`_thread_rounds`) times PyTorch at each thread count of
    `torch_thread_candidates()` between JAX steps; the count with the lower
    median is PyTorch's best. Phase 2, the comparison: per repetition the JAX
    step twice (copies A and B, the A/A control) and PyTorch once at its best
    thread count, ordered A, torch, B then B, torch, A (each JAX copy follows
    torch in half the repetitions).

    The quarter batch (PyTorch at its best thread count) separates what a step
    costs whatever its size (launching its many small kernels, the optimizer's
    per-parameter work) from what grows with the batch: with `t(b) = fixed +
    per_example * b` fitted through the two sizes, `fixed` is the part no
    faster arithmetic can remove.
    """
    candidates = torch_thread_candidates()
    previous_threads = torch.get_num_threads()
    full = _steps(config, config.batch_size)
    quarter_size = max(1, config.batch_size // 4)
    quarter = _steps(config, quarter_size)

    trial = _thread_rounds(full, candidates, repetitions)
    best = min(candidates, key=lambda n: float(np.median(trial["torch"][n])))
    torch.set_num_threads(best)
    _timed(full["torch"], 1)  # Untimed: the first call at the kept thread count.
    jax_a, jax_b, torch_t = [], [], []
    for i in range(repetitions):
        first, second = (jax_a, jax_b) if i % 2 == 0 else (jax_b, jax_a)
        first += _timed(full["jax"], 1)
        torch_t += _timed(full["torch"], 1)
        second += _timed(full["jax"], 1)
    # The quarter batch: JAX and torch alternate, each first in half the repetitions.
    jax_q, torch_q = [], []
    for i in range(repetitions):
        pair = [(jax_q, quarter["jax"]), (torch_q, quarter["torch"])]
        for series, fn in pair if i % 2 == 0 else pair[::-1]:
            series += _timed(fn, 1)
    matmul = matmul_rate(candidates)
    matmul["torch_flop_per_s"] = matmul["torch_flop_per_s_by_threads"][str(best)]
    matmul["torch_threads"] = best
    torch.set_num_threads(previous_threads)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "threads": {
            "jax": f"XLA CPU default: one intra-op thread per visible core ({cores})",
            "torch_candidates": candidates,
            "torch_best": best,
        },
        "jax_step": _summary(jax_a, **full["compile"], flops=full["flops"]),
        "jax_step_control": _summary(jax_b),
        "torch_eager_step": _summary(
            torch_t, first_call_s=full["torch_first_call_s"], threads=best
        ),
        "thread_trial": {
            "torch_eager_step_by_threads": {
                str(n): _summary(t, threads=n) for n, t in trial["torch"].items()
            },
            "jax_step_after_torch": {
                str(n): {**_summary(t), "series": t} for n, t in trial["after"].items() if t
            },
            "pairs": {str(n): p for n, p in trial["pairs"].items()},
        },
        "series": {"jax_a": jax_a, "jax_b": jax_b, "torch": torch_t},
        "quarter_batch": {
            "batch_size": quarter_size,
            "jax_step": _summary(jax_q, flops=quarter["flops"]),
            "torch_eager_step": _summary(torch_q, threads=best),
        },
        "batch_size": config.batch_size,
        "matmul": matmul,
    }


def run(config: Config, out: Path, repetitions: int = 20) -> dict:
    opt = optimizer_bytes(config)
    opt_again = optimizer_bytes(config)  # The bytes A/A: a second, independent count.
    steps = step_timings(config, repetitions)
    timing_ratios, timing_details = step_ratios(steps)
    bytes_ratio = opt["full"] / opt["lora_r4"]
    ratios = {"full_vs_lora_optimizer_bytes": bytes_ratio, **timing_ratios}
    details = {
        "full_vs_lora_optimizer_bytes": {
            "baseline": "full fine-tuning: optax.adamw state (both moments and the count) "
            "for every parameter, against the same optimizer on the LoRA rank-4 factors only",
            "aa": opt_again["full"] / opt["full"],
            "aa_ratio": "the full state's bytes counted twice (an exact count, no noise)",
            **spread([bytes_ratio, opt_again["full"] / opt_again["lora_r4"]]),
        },
        **timing_details,
    }
    measurements = {
        "optimizer_bytes": opt,
        "jax_step": steps["jax_step"],
        "jax_step_control": steps["jax_step_control"],
        "torch_eager_step": steps["torch_eager_step"],
        "thread_trial": steps["thread_trial"],
        "threads": steps["threads"],
        "quarter_batch": steps["quarter_batch"],
        "matmul": steps["matmul"],
        "series_s": steps["series"],
    }
    report = {
        "identity": {**identity(config), "threads": steps["threads"]},
        "measurements": measurements,
        "limits": step_limits(steps),
        "ratios": ratios,
        "ratio_details": details,
        "targets": {"full_vs_lora_optimizer_bytes": 20.0, "jax_vs_torch_step": 1.2},
    }
    report["met"] = {k: report["ratios"][k] >= v for k, v in report["targets"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
