"""The run folder: source model -> source safetensors -> streamed conversion
-> NNX safetensors + Orbax checkpoint -> reload check.

    runs/<name>/
      config.json            the Config used
      source.safetensors     the trained source weights (PyTorch names, or Keras paths)
      source_logits.npy      the source model's held-out logits (the reference)
      converted.safetensors  the NNX weights (paths such as `attn.query.kernel`)
      orbax/                 the same state as an Orbax checkpoint
      convert.json           what was converted, accuracies, sizes
      reload.json            written by `reload`: the fresh-process comparison

`reload_check` is what `weight-conversion reload` runs; it reads only the
run folder, so a fresh process proves the artifact alone is enough.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from weight_conversion import checkpoint, data, model, sources, streaming
from weight_conversion.config import Arch, Config
from weight_conversion.parity import tolerance
from weight_conversion.weight_map import keras_map, torch_map


def save_torch_source(net, path: str | Path) -> Path:
    """The PyTorch weights as safetensors. `save_model` stores a tied tensor
    once (here `class_embed.weight`) and records the alias in the metadata."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(net, str(path))
    return path


def load_torch_source(path: str | Path, arch: Arch, dtype=None):
    """A `TorchDigitNet` (eval mode) from `save_torch_source`'s file."""
    import torch
    from safetensors.torch import load_model

    net = sources.TorchDigitNet(arch)
    load_model(net, str(path))
    net.eval()
    return net.to(dtype or torch.float32)


def target_arch(config: Config) -> Arch:
    """The architecture the converted model must have (the source's epsilons)."""
    return sources.keras_arch(config.arch) if config.source == "keras" else config.arch


def rules_for(config: Config):
    arch = target_arch(config)
    return keras_map(arch) if config.source == "keras" else torch_map(arch)


def convert_run(
    config: Config, run_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
    """Trains the source, writes its safetensors, streams it through the map,
    saves the NNX artifact both ways. Returns the summary (also convert.json)."""
    from weight_conversion import train

    say = progress or (lambda _msg: None)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    split = data.load_split(config.split_seed, config.test_fraction)
    arch = target_arch(config)
    if config.source == "torch":
        trained = train.train_torch(config, split, progress=say)
        save_torch_source(trained.model, run_dir / "source.safetensors")
        source_logits = sources.torch_logits(trained.model, data.nchw(split.test_images))
    else:
        from safetensors.numpy import save_file

        trained = train.train_keras(config, split, progress=say)
        save_file(sources.keras_weights(trained.model), str(run_dir / "source.safetensors"))
        source_logits = sources.keras_taps(trained.model, data.nhwc(split.test_images))["head"]
    np.save(run_dir / "source_logits.npy", np.asarray(source_logits, np.float32))
    (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=1) + "\n")

    say("streaming the conversion")
    spec = checkpoint.target_spec(model.abstract_model(arch))
    metadata = {"arch": json.dumps(arch.__dict__), "source": config.source}
    streaming.convert_file(
        run_dir / "source.safetensors",
        run_dir / "converted.safetensors",
        rules_for(config),
        arch,
        spec,
        metadata,
    )
    converted = checkpoint.load_safetensors(run_dir / "converted.safetensors", arch)
    checkpoint.save_orbax(converted, run_dir / "orbax")
    summary = {
        "source": config.source,
        "source_test_accuracy": trained.test_accuracy,
        "source_train_losses": trained.losses,
        "held_out_examples": int(len(split.test_labels)),
        "source_bytes": (run_dir / "source.safetensors").stat().st_size,
        "converted_bytes": (run_dir / "converted.safetensors").stat().st_size,
        "parameters": int(sum(np.prod(s) for s, _ in spec.values())),
    }
    (run_dir / "convert.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def reload_check(run_dir: str | Path) -> dict:
    """Reloads the converted weights (safetensors and Orbax), recomputes the
    held-out logits and compares them with the source model's saved logits:
    within the float32 tolerance of the whole network, identical predictions."""
    run_dir = Path(run_dir)
    config = Config.from_dict(json.loads((run_dir / "config.json").read_text()))
    arch = Arch(**json.loads(checkpoint.read_metadata(run_dir / "converted.safetensors")["arch"]))
    split = data.load_split(config.split_seed, config.test_fraction)
    reference = np.load(run_dir / "source_logits.npy")
    images = data.nhwc(split.test_images)
    cumulative = sum(layer.reduction for layer in model.layers(arch))
    bound = tolerance(np.float32, cumulative, float(np.max(np.abs(reference))))
    result: dict = {"tolerance": bound, "held_out_examples": int(len(reference))}
    # --- exercise stage 3: Reload both artifacts; logits within the bound, same predictions. ---
    artifacts = {
        "safetensors": checkpoint.load_safetensors(run_dir / "converted.safetensors", arch),
        "orbax": checkpoint.load_orbax(run_dir / "orbax", arch),
    }
    for name, reloaded in artifacts.items():
        logits = model.logits(reloaded, images)
        error = float(np.max(np.abs(logits.astype(np.float64) - reference)))
        same = int(np.sum(np.argmax(logits, 1) == np.argmax(reference, 1)))
        result[name] = {
            "max_abs_logit_error": error,
            "identical_predictions": same,
            "accuracy": float(np.mean(np.argmax(logits, 1) == split.test_labels)),
            "passed": error <= bound and same == len(reference),
        }
    result["passed"] = all(result[name]["passed"] for name in artifacts)
    # --- end exercise ---
    (run_dir / "reload.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
