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


def step_timings(config: Config, repetitions: int = 20) -> dict:
    corpus = generate(config, split_ids(config)["train"][: config.batch_size])
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

    # PyTorch eager: the same architecture and weights, the same objective and optimizer.
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
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

    # Interleaved A, torch, B then B, torch, A: a step right after torch's runs
    # slower (its worker threads still hold the cores), so each JAX series
    # follows torch in half the repetitions and the A/A control stays unbiased.
    jax_a, jax_b, torch_t = [], [], []
    for i in range(repetitions):
        first, second = (jax_a, jax_b) if i % 2 == 0 else (jax_b, jax_a)
        first += _timed(jax_step, 1)
        torch_t += _timed(torch_step, 1)
        second += _timed(jax_step, 1)

    def summary(xs, **extra):
        return {
            **extra,
            "median_s": float(np.median(xs)),
            "p90_s": float(np.percentile(xs, 90)),
            "n": len(xs),
        }

    return {
        "threads": threads,
        "jax_step": summary(jax_a, lower_s=t1 - t0, compile_s=t2 - t1, first_call_s=t3 - t2),
        "jax_step_control": summary(jax_b),
        "torch_eager_step": summary(torch_t, first_call_s=t5 - t4),
    }


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
        },
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
