"""`training-methods`: one subcommand per objective lab, and `bench`.

    training-methods sft          # response-only SFT; saves runs/sft/checkpoint
    training-methods mlm | contrastive | lora | dpo | reductions | heldout | parity
    training-methods bench        # optimizer bytes and JAX vs PyTorch step ratios

Every lab runs on the embedded default config (`--config FILE.json` to
change it) and writes `runs/<lab>/report.json` (plus a loss-curve PNG for the
training labs). Bad input (a config file that is missing, not UTF-8 JSON, or
has an unknown key or a bad value; a LoRA rank larger than the layers; a
`--out` under a file) exits with status 2 and a one-line message naming the
file, field or value, before anything is computed or written.
"""

import json
from pathlib import Path

import click
import jax
import numpy as np

from training_methods.config import Config, ConfigError, load_config

RUNS = Path("runs")


class BadInput(click.ClickException):
    """An input the command cannot use: exit status 2, one line naming it."""

    exit_code = 2


def _config(path: str | None) -> Config:
    try:
        return load_config(path) if path else Config.default()
    except ConfigError as err:
        raise BadInput(str(err)) from None


def _writable(out_path: str, option: str) -> Path:
    """Refuses an output path below an existing file (before any work is done)."""
    out = Path(out_path)
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadInput(
                    f"Cannot write `{option}` `{out_path}`: `{parent}` is a file, not a folder."
                )
            break
    return out


def _write(lab: str, report: dict, losses: dict[str, list[float]] | None = None) -> Path:
    out = RUNS / lab
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps(report, indent=1, default=float) + "\n", encoding="utf-8"
    )
    if losses:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, ys in losses.items():
            ax.plot(ys, label=name)
        ax.set(xlabel="step", ylabel="training loss", yscale="log", title=f"{lab}: training loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "loss.png", dpi=100)
        plt.close(fig)
    click.echo(json.dumps(report, indent=1, default=float))
    click.echo(f"Wrote {out / 'report.json'}")
    return out


def _data(config: Config, task: str = "reverse"):
    from training_methods.data import generate, split_ids

    splits = split_ids(config)
    return splits, generate(config, np.concatenate([splits["train"], splits["heldout"]]), task)


def _sft_model(config: Config, ledger=None):
    """The SFT base: restored from runs/sft/checkpoint, trained when missing."""
    from training_methods import checkpoint, sft
    from training_methods.model import build
    from training_methods.train import fit

    key_init, key_fit = jax.random.split(jax.random.key(config.seed))
    model = build(config, key=key_init)
    path = RUNS / "sft" / "checkpoint"
    if path.is_dir() and ledger is None:
        try:
            return checkpoint.restore(path, model), None
        except checkpoint.CheckpointError as err:
            click.echo(f"{err} Training the SFT model again.", err=True)
    splits, corpus = _data(config)
    trained, history = fit(
        model,
        sft.loss_fn,
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=config.sft_steps,
        key=key_fit,
        objective="sft",
        ledger=ledger,
        progress=True,
    )
    return trained, history


@click.group()
def main() -> None:
    """Objective labs on a small NNX Transformer (see each subcommand's help)."""


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="JSON config file (default: the embedded default config).",
)


@main.command()
@config_option
def sft(config_path):
    """Stage 3: response-only SFT on the reversal task; saves the checkpoint."""
    from training_methods import checkpoint
    from training_methods.train import evaluate

    config = _config(config_path)
    splits, corpus = _data(config)
    model, history = _train_sft(config)
    ckpt = RUNS / "sft" / "checkpoint"
    if ckpt.exists():
        import shutil

        shutil.rmtree(ckpt)
    checkpoint.save(ckpt, model)
    _write(
        "sft",
        {
            "heldout": evaluate(model, corpus, splits["heldout"]),
            "steps": config.sft_steps,
            "final_loss": history["loss"][-1],
        },
        {"sft": history["loss"]},
    )


def _train_sft(config):
    from training_methods import sft as sft_lab
    from training_methods.model import build
    from training_methods.train import fit

    splits, corpus = _data(config)
    key_init, key_fit = jax.random.split(jax.random.key(config.seed))
    return fit(
        build(config, key=key_init),
        sft_lab.loss_fn,
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=config.sft_steps,
        key=key_fit,
        objective="sft",
        progress=True,
    )


@main.command()
@config_option
def mlm(config_path):
    """Stage 1: masked language modelling with BERT corruption."""
    from training_methods import mlm as lab
    from training_methods.model import build
    from training_methods.train import fit

    config = _config(config_path)
    splits, corpus = _data(config)
    k_init, k_fit, k_eval = jax.random.split(jax.random.key(config.seed), 3)
    loss_fn = lab.make_loss_fn(config.mask_rate, config.num_symbols)
    model, history = fit(
        build(config, key=k_init),
        loss_fn,
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=config.mlm_steps,
        key=k_fit,
        objective="mlm",
        progress=True,
    )
    held = corpus.take(splits["heldout"])
    loss, acc = loss_fn(model, {"tokens": jax.numpy.asarray(held["tokens"])}, k_eval)
    _write(
        "mlm",
        {
            "heldout/masked_loss": float(loss),
            "heldout/masked_accuracy": float(acc),
            "chance": 1 / config.num_symbols,
        },
        {"mlm": history["loss"]},
    )


@main.command()
@config_option
def contrastive(config_path):
    """Stage 2: symmetric InfoNCE between each prompt and its response."""
    from training_methods import contrastive as lab
    from training_methods.model import build
    from training_methods.train import fit

    config = _config(config_path)
    splits, corpus = _data(config)
    k_init, k_fit = jax.random.split(jax.random.key(config.seed))
    model, history = fit(
        build(config, key=k_init),
        lab.make_loss_fn(config.temperature),
        config,
        corpus,
        splits["train"],
        splits["heldout"],
        steps=config.contrastive_steps,
        key=k_fit,
        objective="contrastive",
        progress=True,
    )
    held = corpus.take(splits["heldout"][:64])
    _write(
        "contrastive",
        {
            "heldout/retrieval_accuracy_of_64": lab.retrieval_accuracy(
                model, held["tokens"], held["prompt_len"]
            ),
            "chance": 1 / 64,
            "false_negative_pairs_in_that_batch": len(lab.false_negatives(held["tokens"])),
        },
        {"contrastive": history["loss"]},
    )


@main.command(name="lora")
@config_option
@click.option(
    "--rank", "ranks", type=int, multiple=True, help="Adapter rank (repeatable; default: config)."
)
def lora_cmd(config_path, ranks):
    """Stage 4: LoRA from the SFT model to the shift task; ranks compared."""
    from flax import nnx

    from training_methods import lora
    from training_methods import sft as sft_lab
    from training_methods.train import evaluate, fit

    config = _config(config_path)
    ranks = ranks or (config.lora_rank,)
    for rank in ranks:
        if not 1 <= rank <= config.d_model:
            raise BadInput(
                f"LoRA rank `{rank}` (`--rank`) does not fit layers of width `{config.d_model}`; "
                f"choose a rank from 1 to {config.d_model}."
            )
    base, _ = _sft_model(config)
    splits, shift = _data(config, "shift")
    table, losses = {}, {}
    for rank in ranks:
        k_init, k_fit = jax.random.split(jax.random.fold_in(jax.random.key(config.seed), rank))
        trained, history = fit(
            lora.adapted_model(config, base, rank, key=k_init),
            sft_lab.loss_fn,
            config,
            shift,
            splits["train"],
            splits["heldout"],
            steps=config.lora_steps,
            key=k_fit,
            objective=f"lora-r{rank}",
            wrt=nnx.LoRAParam,
            progress=True,
        )
        table[rank] = {
            "trainable": lora.count(nnx.state(trained, nnx.LoRAParam)),
            "optimizer_bytes": lora.nbytes(history["opt_state"]),
            "heldout": evaluate(trained, shift, splits["heldout"]),
        }
        losses[f"rank {rank}"] = history["loss"]
    _write(
        "lora", {"base_on_shift": evaluate(base, shift, splits["heldout"]), "ranks": table}, losses
    )


@main.command()
@config_option
def dpo(config_path):
    """Stage 5: DPO from the SFT model on synthetic preference pairs."""
    from training_methods import dpo as lab

    config = _config(config_path)
    base, _ = _sft_model(config)
    splits, corpus = _data(config)
    held = corpus.take(splits["heldout"])
    k_pairs, k_fit = jax.random.split(jax.random.key(config.seed))
    pairs = lab.make_pairs(held["tokens"], held["prompt_len"], config.num_symbols, k_pairs)
    before = lab.preference_metrics(lab.PolicyAndReference(base, base), pairs, config.dpo_beta)
    trained, history = lab.train_dpo(
        config, base, corpus, splits["train"], splits["heldout"], key=k_fit, progress=True
    )
    _write(
        "dpo",
        {
            "heldout_before": before,
            "heldout_after": lab.preference_metrics(trained, pairs, config.dpo_beta),
            "denominator": "pairs in the batch; log-probabilities summed over response tokens",
        },
        {"dpo": history["loss"]},
    )


@main.command()
@config_option
def reductions(config_path):
    """Stage 6: accumulation normalized globally vs mean of micro-batch means."""
    from flax import nnx

    from training_methods import reductions as lab
    from training_methods.model import build
    from training_methods.sft import response_mask

    config = _config(config_path)
    splits, corpus = _data(config)
    graphdef, params = nnx.split(build(config, key=jax.random.key(config.seed)))

    def token_loss_fn(p, batch):
        tokens = batch["tokens"]
        logp = jax.nn.log_softmax(nnx.merge(graphdef, p)(tokens[:, :-1]), -1)
        ce = -jax.numpy.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return ce, response_mask(tokens[:, 1:], batch["prompt_len"])

    order = np.argsort(corpus.prompt_len[:64], kind="stable")
    rows = np.concatenate([order[:4], order[-4:]])
    batch = {
        "tokens": jax.numpy.asarray(corpus.tokens[rows]),
        "prompt_len": jax.numpy.asarray(corpus.prompt_len[rows]),
    }
    micros = [{k: v[i : i + 2] for k, v in batch.items()} for i in range(0, 8, 2)]
    full = lab.full_batch_grad(token_loss_fn, params, batch)
    good, _ = lab.accumulate_global(token_loss_fn, params, micros)
    bad = lab.accumulate_mean_of_means(token_loss_fn, params, micros)
    _write(
        "reductions",
        {
            "global_count_vs_full_max_abs": lab.max_abs_diff(good, full),
            "mean_of_means_vs_full_max_abs": lab.max_abs_diff(bad, full),
            "full_grad_max_abs": lab.max_abs(full),
        },
    )


@main.command()
@config_option
def heldout(config_path):
    """Stage 7: SFT with a ledger, then the separation and contamination audit."""
    from training_methods import heldout as lab
    from training_methods.data import Corpus
    from training_methods.train import Ledger

    config = _config(config_path)
    ledger = Ledger()
    model, _ = _sft_model(config, ledger=ledger)
    splits, corpus = _data(config)

    def sub(ids):
        r = corpus.rows(ids)
        return Corpus(corpus.ids[r], corpus.tokens[r], corpus.prompt_len[r], corpus.vocab)

    train, held = sub(splits["train"]), sub(splits["heldout"])
    report = lab.audit(ledger, train, held)
    _write(
        "heldout",
        {
            "audit": {k: v for k, v in report.items() if k != "duplicate_ids"},
            **lab.heldout_metrics(model, held, report["duplicate_ids"]),
        },
    )


@main.command()
@config_option
def parity(config_path):
    """Stage 8: Flax vs PyTorch layer by layer, clean and with injected differences."""
    import math

    from training_methods import parity as lab
    from training_methods.data import generate

    config = _config(config_path)
    tokens = generate(config, np.arange(16)).tokens
    injections = {
        "clean": {},
        "ln_epsilon=1e-6": {"ln_epsilon": 1e-6},
        "tanh GELU": {"gelu_approximate": True},
        "attn_scale=1/sqrt(d_model)": {"attn_scale": 1 / math.sqrt(config.d_model)},
        "mask_offset=1": {"mask_offset": 1},
    }
    out = {}
    for dtype in (np.float64, np.float32):
        for name, override in injections.items():
            r = lab.run_parity(config, tokens, dtype, key=jax.random.key(config.seed), **override)
            out[f"{np.dtype(dtype).name}/{name}"] = {
                "first_mismatch": r["first_mismatch"],
                "worst_max_abs_diff": max(x["max_abs_diff"] for x in r["layers"]),
            }
    _write("parity", out)


@main.command()
@config_option
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=str(RUNS / "bench" / "bench.json"),
    help="Where to write the JSON report.",
)
@click.option("--repetitions", type=click.IntRange(min=1), default=20, help="Timed calls per path.")
def bench(config_path, out_path, repetitions):
    """Optimizer bytes (full vs LoRA r4) and one training step, JAX jit vs PyTorch eager."""
    from training_methods import bench as lab

    config = _config(config_path)
    out = _writable(out_path, "--out")
    report = lab.run(config, out, repetitions)
    for name, value in report["ratios"].items():
        target = report["targets"].get(name)
        verdict = (
            ""
            if target is None
            else f" (target >= {target:g}: {'met' if value >= target else 'MISSED'})"
        )
        click.echo(f"{name:32s} {value:8.2f}{verdict}")
    m = report["measurements"]
    click.echo(
        f"jax step compile {m['jax_step']['compile_s']:.2f} s, "
        f"first call {m['jax_step']['first_call_s']:.3f} s"
    )
    for name, lim in report["limits"].items():
        click.echo(
            f"{name:5s} step: {lim['flop_per_s'] / 1e9:6.1f} GFLOP/s = "
            f"{lim['fraction_of_matmul_rate']:.0%} of its dense-matmul rate; "
            f"batch-independent part {lim['fixed_s'] * 1e3:.1f} ms "
            f"({lim['fixed_share']:.0%} of the step)"
        )
    click.echo(f"Wrote {out_path}")
