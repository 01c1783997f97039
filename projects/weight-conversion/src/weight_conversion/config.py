"""Run configuration: the architecture shared by the three frameworks and the
brief training that gives the source models real (not random) weights.

`Config.tiny()` is the preset the tests use; `Config.default()` is what
`weight-conversion convert` runs. Both train for seconds on scikit-learn's
digits; the subject of the project is the conversion, not the training.
"""

import dataclasses
import json
import math
from pathlib import Path
from typing import Literal


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


MAX_WIDTH = 1024
"""Largest channel count, width or class count an `Arch` accepts (the digits
need 64 at most; a width of millions would only exhaust memory)."""


def _check_types(obj, ints: tuple[str, ...], reals: tuple[str, ...], bools=()) -> None:
    """Refuses, by field name, a value of the wrong JSON type (a bool is not an int)."""
    for name in ints:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"`{name}` must be an integer, got `{value!r}`.")
    for name in reals:
        value = getattr(obj, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigError(f"`{name}` must be a finite number, got `{value!r}`.")
    for name in bools:
        value = getattr(obj, name)
        if not isinstance(value, bool):
            raise ConfigError(f"`{name}` must be true or false, got `{value!r}`.")


@dataclasses.dataclass(frozen=True)
class Arch:
    """The network every framework builds (PyTorch, Keras, Flax NNX).

    8x8 digit -> conv1 (3x3) -> BatchNorm -> GELU -> spatial self-attention over
    the 64 pixel positions (position embedding, LayerNorm, multi-head attention
    with a residual) -> conv2 (3x3, stride 2) -> GELU -> flatten -> fc1 -> GELU
    -> fc2 (square) -> GELU -> logits from the class embedding (tied weights)
    plus a bias.

    The epsilons and the GELU form are properties of the *source* framework
    (PyTorch: 1e-5 and exact GELU; Keras: 1e-3 and exact GELU); the converted
    model must copy them, or its outputs drift.
    """

    channels: int = 16
    """Output channels of conv1 = width of the attention tokens."""

    heads: int = 2
    """Attention heads; must divide `channels`."""

    conv2_channels: int = 16
    """Output channels of the stride-2 conv2 (feature map 4x4)."""

    hidden: int = 64
    """Width of fc1 and of the square fc2; also the class-embedding width."""

    num_classes: int = 10
    """Digits 0-9."""

    bn_epsilon: float = 1e-5
    """Added to the BatchNorm running variance before the square root."""

    ln_epsilon: float = 1e-5
    """Added to the LayerNorm variance before the square root."""

    gelu_approximate: bool = False
    """False: exact GELU, x * Phi(x); True: the tanh approximation."""

    image_size: int = 8
    """Side of the square input image."""

    def __post_init__(self) -> None:
        sizes = ("channels", "heads", "conv2_channels", "hidden", "num_classes", "image_size")
        _check_types(self, sizes, ("bn_epsilon", "ln_epsilon"), ("gelu_approximate",))
        for name in sizes:
            if not 1 <= getattr(self, name) <= MAX_WIDTH:
                raise ConfigError(
                    f"`{name}` must be an integer in [1, {MAX_WIDTH}], got `{getattr(self, name)}`."
                )
        if self.channels % self.heads:
            raise ConfigError(
                f"`heads` must divide `channels`, but `channels` = `{self.channels}` and "
                f"`heads` = `{self.heads}`."
            )
        for name in ("bn_epsilon", "ln_epsilon"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"`{name}` must lie in (0, 1), got `{getattr(self, name)}`.")

    @property
    def tokens(self) -> int:
        """Pixel positions the attention attends over."""
        return self.image_size * self.image_size

    @property
    def pooled_size(self) -> int:
        """Side of the conv2 feature map (stride 2, padding 1, kernel 3)."""
        return (self.image_size + 1) // 2

    @property
    def flat_features(self) -> int:
        """Inputs of fc1: the flattened conv2 feature map."""
        return self.conv2_channels * self.pooled_size * self.pooled_size


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a conversion run depends on.

    Presets:
      - `Config.tiny()`: the test preset (3 epochs). About 2 s of PyTorch
        training on a 2-core CPU; held-out accuracy about 0.9.
      - `Config.default()`: `weight-conversion convert` (8 epochs). About 5 s of
        training; held-out accuracy about 0.97; the whole command about 20 s.
    """

    arch: Arch = dataclasses.field(default_factory=Arch)
    """The architecture (PyTorch conventions; a Keras source overrides the epsilons)."""

    source: Literal["torch", "keras"] = "torch"
    """Which framework trains the source model."""

    seed: int = 0
    """Root of the source model's initialisation and batch order."""

    split_seed: int = 0
    """Root of the stratified train / held-out split."""

    test_fraction: float = 0.2
    """Fraction of each class held out for the parity and reload checks."""

    epochs: int = 8
    """Passes of the brief source training."""

    batch_size: int = 64
    """Examples per training step."""

    learning_rate: float = 3e-3
    """Adam step size of the source training."""

    def __post_init__(self) -> None:
        if not isinstance(self.arch, Arch):
            raise ConfigError(f"`arch` must be an Arch, got `{self.arch!r}`.")
        _check_types(
            self, ("seed", "split_seed", "epochs", "batch_size"), ("test_fraction", "learning_rate")
        )
        if (self.arch.image_size, self.arch.num_classes) != (8, 10):
            raise ConfigError(
                "The digits are 8x8 images of 10 classes: `arch.image_size` must be 8 and "
                f"`arch.num_classes` 10, got `{self.arch.image_size}` and "
                f"`{self.arch.num_classes}`."
            )
        if self.source not in ("torch", "keras"):
            raise ConfigError(f"`source` must be `torch` or `keras`, got `{self.source}`.")
        if not 0.05 <= self.test_fraction <= 0.5:
            raise ConfigError(
                f"`test_fraction` must lie in [0.05, 0.5], got `{self.test_fraction}`."
            )
        if self.epochs < 1 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ConfigError(
                "`epochs`, `batch_size` and `learning_rate` must be positive, got "
                f"`{self.epochs}`, `{self.batch_size}`, `{self.learning_rate}`."
            )
        for name in ("seed", "split_seed"):
            if not 0 <= getattr(self, name) < 2**32:
                raise ConfigError(f"`{name}` must lie in [0, 2**32), got `{getattr(self, name)}`.")

    @classmethod
    def tiny(cls, **changes) -> "Config":
        """Test preset: 3 epochs of training (about 2 s)."""
        changes.setdefault("epochs", 3)
        return cls(**changes)

    @classmethod
    def default(cls, **changes) -> "Config":
        """`weight-conversion convert`: 8 epochs, held-out accuracy about 0.97."""
        return cls(**changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Config":
        """Reads `to_dict`'s output back: every key required, unknown keys
        refused by name, each value of its field's type."""
        if not isinstance(raw, dict):
            raise ConfigError(f"A config must be a JSON object, got a {type(raw).__name__}.")
        raw = dict(raw)
        arch_raw = raw.pop("arch", None)
        if not isinstance(arch_raw, dict):
            raise ConfigError(f"`arch` must be a JSON object, got `{arch_raw!r}`.")
        known = {f.name for f in dataclasses.fields(cls)} - {"arch"}
        arch_known = {f.name for f in dataclasses.fields(Arch)}
        unknown = sorted(set(raw) - known) + [
            f"arch.{k}" for k in sorted(set(arch_raw) - arch_known)
        ]
        if unknown:
            raise ConfigError(f"Unknown config keys: `{unknown}`.")
        missing = sorted(known - set(raw)) + [
            f"arch.{k}" for k in sorted(arch_known - set(arch_raw))
        ]
        if missing:
            raise ConfigError(f"Missing config keys: `{missing}`.")
        return cls(arch=Arch(**arch_raw), **raw)


def load_config(path: str | Path) -> Config:
    """A `Config` from a JSON file; a missing or malformed file names the path."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"Cannot read the config `{path}`: {err}.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"The config `{path}` must hold a JSON object.")
    try:
        return Config.from_dict(raw)
    except ConfigError as err:
        raise ConfigError(f"The config `{path}`: {err}") from None
