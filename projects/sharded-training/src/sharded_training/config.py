"""Run configuration: one frozen, validated object, read from JSON files.

`Config.tiny()` is the preset the tests use; `Config.default()` is the run that
`sharded-training train` and `launch` use with no `--config`. Unknown keys and
out-of-range values are refused with a message that names the field. Checks
that need the devices (does the mesh divide them?) live in `sharding.py`.
"""

import hashlib
import json
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


def check_output_dir(path: str | Path, what: str) -> None:
    """Refuses an output folder that is a file or lies under one: checked before a job
    starts, not when its first file is written."""
    existing = Path(path).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} `{path}` cannot be created: `{existing}` is not a directory.")


class Config(BaseModel):
    """Everything a training run depends on.

    Presets:
      - `Config.tiny()`: the test preset (`configs/tiny.json`): 12 steps of a
        16-32-4 MLP on 8 simulated devices; a few seconds after start-up.
      - `Config.default()`: `sharded-training train` (`configs/default.json`):
        300 steps of a 32-256-8 MLP on a (4, 2) data x model mesh; final loss
        well under the initial log(8) = 2.08, about 20 s on a 2-core CPU.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the training randomness: parameter init and dropout masks."""

    data_seed: int = Field(default=1, ge=0, lt=2**32)
    """Root of the synthetic data set and of Grain's per-epoch shuffle: the order in
    which examples are fed follows it alone, whatever `seed` is
    [claim:data-seed-alone-orders-the-data]."""

    num_examples: int = Field(default=1000, ge=1, le=1_000_000)
    """Rows of the synthetic data set; sample ID = row index. When it is not a
    multiple of `batch_size`, each epoch ends with a padded, masked batch."""

    num_features: int = Field(default=32, ge=1, le=4096)
    """Input width."""

    hidden_size: int = Field(default=256, ge=1, le=16384)
    """Width of the hidden layer; sharded over the mesh's `model` axis."""

    num_classes: int = Field(default=8, ge=2, le=1024)
    """Number of classes of the synthetic labels."""

    dropout_rate: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout on the hidden layer; its masks come from the PRNG key in the state."""

    learning_rate: float = Field(default=3e-3, gt=0.0, le=10.0)
    """Adam step size, constant."""

    batch_size: int = Field(default=96, ge=1, le=65536)
    """Global examples per step, split over the `data` axis of the mesh."""

    num_steps: int = Field(default=300, ge=1, le=1_000_000)
    """Optimizer steps of the run."""

    mesh_shape: tuple[int, int] = (4, 2)
    """(data, model) sizes of the device mesh; their product is the device count."""

    checkpoint_every: int = Field(default=50, ge=1)
    """Save an Orbax checkpoint every this many steps (and at the last step)."""

    max_to_keep: int = Field(default=3, ge=2, le=100)
    """Checkpoints kept; at least 2 so that a damaged latest one has a fallback."""

    heartbeat_timeout_s: int = Field(default=10, ge=1, le=3600)
    """`jax.distributed` heartbeat timeout: a process whose peer died stops after it."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        data, model = self.mesh_shape
        if data < 1 or model < 1:
            raise ValueError(
                f"Both sizes of `mesh_shape` must be positive, but got `{list(self.mesh_shape)}`."
            )
        if self.batch_size % data:
            raise ValueError(
                f"`batch_size` = `{self.batch_size}` does not divide over the mesh's data axis "
                f"of size `{data}`; use a multiple of {data}."
            )
        if self.hidden_size % model:
            raise ValueError(
                f"`hidden_size` = `{self.hidden_size}` does not divide over the mesh's model "
                f"axis of size `{model}`; use a multiple of {model}."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: 12 steps of a 16-32-4 MLP on 8 devices, (8, 1) mesh, checkpoints
        every 2 steps; 44 examples in batches of 16, so every third batch is padded."""
        return cls(
            num_examples=44,
            num_features=16,
            hidden_size=32,
            num_classes=4,
            batch_size=16,
            num_steps=12,
            mesh_shape=(8, 1),
            checkpoint_every=3,
            learning_rate=1e-2,
        )

    @classmethod
    def default(cls) -> "Config":
        """The real run: 300 steps on a (4, 2) mesh; see the class docstring."""
        return cls()

    def digest(self) -> str:
        """sha256 of the canonical JSON form; a checkpoint records it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        """The config as the JSON text that `from_json` reads back."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> "Config":
        """Parses and validates JSON text; raises `ConfigError` naming each bad field."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError(
                f"Invalid config `{source}`: the file is not valid JSON ({err})."
            ) from None
        if isinstance(data, dict) and isinstance(data.get("mesh_shape"), list):
            data["mesh_shape"] = tuple(data["mesh_shape"])
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as err:
            raise ConfigError(_describe(err, source)) from None


def load_config(path: str | Path) -> Config:
    """Reads a JSON config file; raises `ConfigError` with a readable message."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read config file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Cannot read config file `{path}`: it is not UTF-8 text (byte {err.start})."
        ) from None
    return Config.from_json(text, source=str(path))


def _describe(err: pydantic.ValidationError, source: str) -> str:
    """Turns pydantic's errors into one line: a clause per problem, `;`-separated."""
    problems = []
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ").rstrip(".")
        if item["type"] == "extra_forbidden":
            known = ", ".join(f"`{name}`" for name in Config.model_fields)
            problems.append(f"Unknown field `{field}`; known fields: {known}")
        elif item["type"] in ("model_type", "dict_type"):
            problems.append(f"The top level must be a JSON object, not `{item.get('input')}`")
        elif not field:
            problems.append(message)
        else:
            problems.append(f"Field `{field}` has value `{item.get('input')}`: {message}")
    return f"Invalid config `{source}`: " + "; ".join(problems) + "."
