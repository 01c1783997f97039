"""A synthetic source for the memory and throughput bench: a stack of
`layers` PyTorch-style Linear layers of `width` x `width` float32 weights
(`layers.<i>.weight`, `layers.<i>.bias`), mapped by the project's own `linear`
and `copy` rules to NNX-style `layers.<i>.kernel` / `layers.<i>.bias`.

48 layers of 1024 x 1024 is 201.5 MB: many moderate tensors, as in a real
checkpoint, so that streaming holds one at a time while eager holds all.
"""

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from weight_conversion.config import Arch
from weight_conversion.weight_map import Rule

ARCH = Arch()  # the transforms used here (`linear`, `copy`) do not read it


def linear_stack(layers: int, width: int):
    """The map and the target spec for the synthetic stack."""
    rules, spec = [], {}
    for i in range(layers):
        rules.append(Rule((f"layers.{i}.weight",), (f"layers.{i}.kernel",), "linear"))
        rules.append(Rule((f"layers.{i}.bias",), (f"layers.{i}.bias",)))
        spec[f"layers.{i}.kernel"] = ((width, width), np.dtype(np.float32))
        spec[f"layers.{i}.bias"] = ((width,), np.dtype(np.float32))
    return rules, spec


def write_source(path: str | Path, layers: int, width: int, seed: int = 0) -> int:
    """Writes the synthetic source file; returns its size in bytes."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        tensors[f"layers.{i}.weight"] = rng.standard_normal((width, width), np.float32)
        tensors[f"layers.{i}.bias"] = rng.standard_normal((width,), np.float32)
    save_file(tensors, str(path))
    return Path(path).stat().st_size
