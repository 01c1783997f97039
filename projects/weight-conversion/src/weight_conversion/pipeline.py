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

Every file of a run folder is checked where it is read: `read_config`
(`ConfigError`), `load_torch_source`, `read_reference_logits` and the two
artifact loaders (`CheckpointError`); each message names the file, and the
tensor or field.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from weight_conversion import checkpoint, data, model, sources, streaming
from weight_conversion.checkpoint import CheckpointError
from weight_conversion.config import Arch, Config, load_config
from weight_conversion.parity import tolerance
from weight_conversion.weight_map import SUPPORTED_DTYPES, first_nonfinite, keras_map, torch_map


def save_torch_source(net, path: str | Path) -> Path:
    """The PyTorch weights as safetensors. `save_model` stores a tied tensor
    once (here `class_embed.weight`) and records the alias in the metadata."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(net, str(path))
    return path


def check_torch_file(path: str | Path, net) -> None:
    """Checks a PyTorch safetensors file against `net` before loading it:
    every tensor of `net.state_dict()` present (a tied pair may be stored
    once), none foreign, each with `net`'s shape, a float dtype that the
    conversion supports (integer buffers: an integer dtype), every value
    finite. Raises `CheckpointError` naming the file and the tensor."""
    from safetensors import SafetensorError, safe_open

    expected = net.state_dict()
    ties: dict[str, set[str]] = {}
    for name, tensor in expected.items():
        ties.setdefault(name, set()).update(
            k for k, t in expected.items() if t.data_ptr() == tensor.data_ptr()
        )
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = list(f.keys())
            extra = sorted(set(keys) - set(expected))
            missing = sorted(k for k in expected if not ties[k] & set(keys))
            if missing or extra:
                raise CheckpointError(
                    f"`{path}` does not hold this model's tensors: missing {missing}, "
                    f"extra {extra}."
                )
            for name in keys:
                want = tuple(expected[name].shape)
                piece = f.get_slice(name)
                found = tuple(piece.get_shape())
                if found != want:
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` has shape {found}; the model's has {want}."
                    )
                integer = not expected[name].is_floating_point()
                allowed = (
                    ["I64", "I32"]
                    if integer
                    else [streaming.DTYPE_CODES[d] for d in SUPPORTED_DTYPES]
                )
                if piece.get_dtype() not in allowed:
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` has dtype {piece.get_dtype()}; "
                        f"expected one of {', '.join(allowed)}."
                    )
                bad = first_nonfinite(f.get_tensor(name))
                if bad is not None:
                    raise CheckpointError(
                        f"`{path}`: tensor `{name}` holds {bad[0]} non-finite value(s) "
                        f"(NaN or inf), the first at index {bad[1]}."
                    )
    except (SafetensorError, OSError) as err:
        damage = streaming.describe_damage(path)
        raise CheckpointError(f"Cannot read `{path}`: {damage or err}") from None


def load_torch_source(path: str | Path, arch: Arch, dtype=None):
    """A `TorchDigitNet` (eval mode) from `save_torch_source`'s file, checked
    tensor by tensor first (`check_torch_file`)."""
    import torch
    from safetensors.torch import load_model

    net = sources.TorchDigitNet(arch)
    check_torch_file(path, net)
    load_model(net, str(path))
    net.eval()
    return net.to(dtype or torch.float32)


def read_config(run_dir: str | Path) -> Config:
    """The run folder's `config.json`; `ConfigError` names the file and field."""
    return load_config(Path(run_dir) / "config.json")


def read_reference_logits(path: str | Path, examples: int, classes: int) -> np.ndarray:
    """`source_logits.npy`: float logits of shape (examples, classes), all finite."""
    path = Path(path)
    try:
        logits = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise CheckpointError(f"Cannot read `{path}`: {err}") from None
    if not isinstance(logits, np.ndarray) or not np.issubdtype(logits.dtype, np.floating):
        raise CheckpointError(
            f"`{path}` must hold float logits, found dtype `{getattr(logits, 'dtype', None)}`."
        )
    if logits.shape != (examples, classes):
        raise CheckpointError(
            f"`{path}` has shape {logits.shape}; the held-out split needs ({examples}, {classes})."
        )
    bad = first_nonfinite(logits)
    if bad is not None:
        raise CheckpointError(
            f"`{path}` holds {bad[0]} non-finite value(s) (NaN or inf), "
            f"the first at index {bad[1]}."
        )
    return logits


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
    within the float32 tolerance of the whole network, identical predictions.
    [claim:reload-check-both-artifacts]

    Cases: the region fills `result["safetensors"]` and `result["orbax"]`, each
    `{"max_abs_logit_error": float, "identical_predictions": count of equal argmaxes,
    "accuracy": against the held-out labels, "passed": error <= bound AND every
    prediction identical}` [claim:reload-result-fields] [claim:reload-passed-rule] (an
    error exactly at the bound passes [claim:reload-error-at-bound-passes]; a shift within
    the argmax but beyond the bound fails [claim:reload-bound-alone-fails]), and
    `result["passed"]`: both passed. [claim:reload-passed-needs-both]
    """
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    arch = checkpoint.read_arch(run_dir / "converted.safetensors")
    if arch != target_arch(config):
        raise CheckpointError(
            f"`{run_dir / 'converted.safetensors'}`: metadata `arch` {arch} is not the "
            f"architecture of `{run_dir / 'config.json'}` ({target_arch(config)})."
        )
    split = data.load_split(config.split_seed, config.test_fraction)
    reference = read_reference_logits(
        run_dir / "source_logits.npy", len(split.test_labels), arch.num_classes
    )
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
