"""`training-methods bench`: optimizer bytes of full fine-tuning vs LoRA, and one
training step in jitted JAX vs PyTorch eager, side by side in one process.

Ratios (above 1: the first is smaller or faster):
  - `full_vs_lora_optimizer_bytes`: AdamW state bytes, all parameters vs LoRA rank 4;
  - `jax_vs_torch_step`: median time of one SFT training step (forward,
    backward, AdamW) of the stage-8 Transformer, PyTorch eager over jitted JAX,
    at the same thread count; timed calls interleaved (A, torch, B, then B,
    torch, A, ...: each JAX copy follows torch in half the repetitions);
  - `jax_vs_jax_control`: an A/A control, two interleaved copies of the JAX
    step (shows the noise of the machine; ~1 when quiet).
Compilation is timed apart (`lower`, `compile`, first call).

What bounds the step (`limits`): each framework's achieved FLOP rate against
the rate of a dense matmul on the same cores, and the part of the step that
does not shrink with the batch (fitted through the full and a quarter batch).
"""

import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from training_methods import lora, sft
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


def _steps(config: Config, batch_size: int, threads: int) -> dict:
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
    torch.set_num_threads(threads)
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
        "n": len(xs),
    }


def matmul_rate(threads: int, size: int = 512, repetitions: int = 20) -> dict:
    """FLOP/s of one dense float32 `size x size` matmul, jitted JAX and PyTorch at
    `threads` threads: the arithmetic rate this CPU reaches when kernels are large."""
    torch.set_num_threads(threads)
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x).lower(a).compile()
    jax.block_until_ready(matmul(a))
    ta = torch.from_numpy(np.array(a))
    torch.mm(ta, ta)
    flops = 2.0 * size**3
    jax_t, torch_t = [], []
    for _ in range(repetitions):
        jax_t += _timed(lambda: jax.block_until_ready(matmul(a)), 1)
        torch_t += _timed(lambda: torch.mm(ta, ta), 1)
    return {
        "size": size,
        "jax_flop_per_s": flops / float(np.median(jax_t)),
        "torch_flop_per_s": flops / float(np.median(torch_t)),
    }


def step_timings(config: Config, repetitions: int = 20) -> dict:
    """Medians of the JAX and PyTorch training steps at the configured batch and
    at a quarter of it, and XLA's FLOP count of each JAX step.

    The quarter batch separates what a step costs whatever its size (launching
    its many small kernels, the optimizer's per-parameter work) from what grows
    with the batch: with `t(b) = fixed + per_example * b` fitted through the two
    sizes, `fixed` is the part no faster arithmetic can remove.
    """
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    full = _steps(config, config.batch_size, threads)
    quarter_size = max(1, config.batch_size // 4)
    quarter = _steps(config, quarter_size, threads)

    # Interleaved A, torch, B then B, torch, A: a step right after torch's runs
    # slower (its worker threads still hold the cores), so each JAX series
    # follows torch in half the repetitions and the A/A control stays unbiased.
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

    return {
        "threads": threads,
        "jax_step": _summary(jax_a, **full["compile"], flops=full["flops"]),
        "jax_step_control": _summary(jax_b),
        "torch_eager_step": _summary(torch_t, first_call_s=full["torch_first_call_s"]),
        "quarter_batch": {
            "batch_size": quarter_size,
            "jax_step": _summary(jax_q, flops=quarter["flops"]),
            "torch_eager_step": _summary(torch_q),
        },
        "batch_size": config.batch_size,
        "matmul": matmul_rate(threads),
    }


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


def run(config: Config, out: Path, repetitions: int = 20) -> dict:
    opt = optimizer_bytes(config)
    steps = step_timings(config, repetitions)
    report = {
        "identity": identity(config),
        "measurements": {
            "optimizer_bytes": opt,
            "jax_step": steps["jax_step"],
            "jax_step_control": steps["jax_step_control"],
            "torch_eager_step": steps["torch_eager_step"],
            "threads": steps["threads"],
            "quarter_batch": steps["quarter_batch"],
            "matmul": steps["matmul"],
        },
        "limits": step_limits(steps),
        "ratios": {
            "full_vs_lora_optimizer_bytes": opt["full"] / opt["lora_r4"],
            "jax_vs_torch_step": steps["torch_eager_step"]["median_s"]
            / steps["jax_step"]["median_s"],
            "jax_vs_jax_control": steps["jax_step_control"]["median_s"]
            / steps["jax_step"]["median_s"],
        },
        "targets": {"full_vs_lora_optimizer_bytes": 20.0, "jax_vs_torch_step": 1.2},
    }
    report["met"] = {k: report["ratios"][k] >= v for k, v in report["targets"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
