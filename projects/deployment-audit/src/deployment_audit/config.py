"""Configuration: frozen, validated objects read from JSON files.

Three configs, one per job:
  - `Config`: training the classifier (stage 1). `Config.tiny()` is the test
    preset, `Config.default()` the real run.
  - `ServeConfig`: the server's dynamic batching and backpressure (stage 3).
  - `LoadConfig`: the stated workload of the load generator (stage 3).
A config file is the JSON form of one of them; unknown keys and out-of-range
values are refused with a message that names the field.
"""

import json
import os
from pathlib import Path
from typing import Self, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


# frozen: a config is a value. extra="forbid": a misspelt key is an error.
# strict: `"0.1"` is not a float. use_attribute_docstrings: field docs below.
# allow_inf_nan=False: NaN and infinity are refused, in tuples (`rates`) too.
_MODEL_CONFIG = ConfigDict(
    frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True, allow_inf_nan=False
)


class _Base(BaseModel):
    model_config = _MODEL_CONFIG

    def to_json(self) -> str:
        """The config as the JSON text that `from_json` reads back."""
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Self:
        """Parses and validates JSON text; raises `ConfigError` naming each bad field."""
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as err:
            raise ConfigError(_describe(cls, err, source)) from None


class Config(_Base):
    """Everything the training run depends on.

    Presets:
      - `Config.tiny()`: the tests' preset. Hidden (32,), 15 epochs; test
        accuracy about 0.97 (0.969 measured); a few seconds on a 2-core CPU.
      - `Config.default()`: `deployment-audit train`. Hidden (128,), 60 epochs;
        test accuracy >= 0.96 (0.984 measured) in about 10-20 s on a shared
        2-core CPU, start-up and checkpoint included.
    """

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the training randomness: parameter init and batch shuffling."""

    split_seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the stratified train/test split (kept apart from `seed`)."""

    test_fraction: float = Field(default=0.25, gt=0.0, lt=0.8)
    """Fraction of each class held out: the test set, the golden sample and the
    held-out data of the precision comparison all come from it."""

    hidden_sizes: tuple[int, ...] = Field(default=(128,), min_length=1, max_length=4)
    """Width of each hidden layer, input side first."""

    learning_rate: float = Field(default=1e-3, gt=0.0, le=1.0)
    """AdamW step size, constant over the run."""

    batch_size: int = Field(default=64, ge=1, le=1024)
    """Examples per optimizer step; the remainder of an epoch is dropped."""

    num_epochs: int = Field(default=60, ge=1, le=10_000)
    """Passes over the training split."""

    num_golden: int = Field(default=16, ge=1, le=256)
    """Size of the golden sample: the first test IDs whose predictions are kept
    with the artifact and re-checked after every reload."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if any(width < 1 for width in self.hidden_sizes):
            raise ValueError(
                f"Every entry of `hidden_sizes` must be a positive width, but got "
                f"`{list(self.hidden_sizes)}`."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: hidden (32,), 15 epochs, a few seconds.
        Run: `deployment-audit train --config configs/tiny.json`."""
        return cls(hidden_sizes=(32,), num_epochs=15, num_golden=8)

    @classmethod
    def default(cls) -> "Config":
        """The real run: `deployment-audit train`. Hidden (128,), 60 epochs."""
        return cls()


class ServeConfig(_Base):
    """The server's batching and backpressure policy (`deployment-audit serve`)."""

    max_batch_size: int = Field(default=64, ge=1, le=4096)
    """Most rows the batcher hands to the model in one call."""

    batch_timeout_ms: float = Field(default=2.0, ge=0.0, le=1000.0)
    """How long the batcher waits after the first queued request for more rows
    before it runs a partial batch."""

    max_queue_rows: int = Field(default=512, ge=1, le=1_000_000)
    """Rows allowed to wait; a request that would exceed it gets 503 at once
    (backpressure) instead of queueing without bound."""

    max_rows_per_request: int = Field(default=64, ge=1, le=4096)
    """Largest `inputs` list one request may carry (400 beyond it)."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if self.max_rows_per_request > self.max_batch_size:
            raise ValueError(
                f"`max_rows_per_request` ({self.max_rows_per_request}) must not exceed "
                f"`max_batch_size` ({self.max_batch_size}): a request is never split "
                f"across batches."
            )
        if self.max_rows_per_request > self.max_queue_rows:
            raise ValueError(
                f"`max_rows_per_request` ({self.max_rows_per_request}) must not exceed "
                f"`max_queue_rows` ({self.max_queue_rows}), or a valid request could never queue."
            )
        return self


class LoadConfig(_Base):
    """The stated workload of `deployment-audit load`: open-loop Poisson arrivals."""

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the arrival times and the request sizes."""

    rates: tuple[float, ...] = Field(default=(50.0, 100.0, 200.0, 400.0), min_length=1)
    """Offered request rates (requests per second), each run in turn."""

    requests_per_rate: int = Field(default=400, ge=10, le=100_000)
    """Requests sent at each rate."""

    request_sizes: tuple[int, ...] = Field(default=(1, 8), min_length=1)
    """Rows per request, drawn uniformly from these values."""

    max_seconds_per_rate: float = Field(default=20.0, gt=0.0, le=600.0)
    """Hard stop for one rate: requests not sent by then are counted as not sent."""

    request_timeout_s: float = Field(default=5.0, gt=0.0, le=60.0)
    """Client timeout of one request; a timeout counts as an error, not a latency."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if any(rate <= 0 for rate in self.rates):
            raise ValueError(f"Every entry of `rates` must be positive, got `{list(self.rates)}`.")
        if any(size < 1 for size in self.request_sizes):
            raise ValueError(
                f"Every entry of `request_sizes` must be >= 1, got `{list(self.request_sizes)}`."
            )
        return self

    @classmethod
    def tiny(cls) -> "LoadConfig":
        """Test preset: two rates (40 and 120 req/s), 60 requests each: about 4 s
        with the idle probe, once the server is ready."""
        return cls(rates=(40.0, 120.0), requests_per_rate=60, max_seconds_per_rate=8.0)

    @classmethod
    def default(cls) -> "LoadConfig":
        """`deployment-audit load`: four rates (50-400 req/s), 400 requests each:
        about 30 s on a shared 2-core CPU, server start-up included."""
        return cls()


C = TypeVar("C", bound=_Base)


def load_config(path: str | Path, kind: type[C] = Config) -> C:
    """Reads a JSON config file of type `kind`; raises `ConfigError` with a readable message."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read config file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Config file `{path}` is not UTF-8 text (byte {err.start}: {err.reason}); "
            "a config is a JSON object."
        ) from None
    return kind.from_json(text, source=str(path))


def check_output_path(path: str | Path, *, directory: bool, what: str) -> Path:
    """Refuses an output path that cannot be written, before any work is done.

    `directory`: the path is a folder to create (else a file to create or replace).
    The path, if it exists, must be of that kind, and its nearest existing ancestor
    must be a folder; raises `ConfigError` naming `what` and the path.
    """
    given = Path(path)
    path = Path(os.path.abspath(given))  # `..` taken lexically, as `mkdir` will meet it
    if path.exists() and path.is_dir() != directory:
        kind = "a folder" if directory else "a file"
        raise ConfigError(f"{what} `{given}` exists and is not {kind}.")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                shown = parent if given.is_absolute() else os.path.relpath(parent)
                raise ConfigError(
                    f"{what} `{given}` cannot be created: `{shown}` is a file, not a folder."
                )
            break
    return given


def _describe(kind: type[BaseModel], err: pydantic.ValidationError, source: str) -> str:
    """Turns pydantic's errors into one line: one full sentence per problem."""
    lines = [f"Invalid {kind.__name__} `{source}`:"]
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        value = item.get("input")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            known = ", ".join(f"`{name}`" for name in kind.model_fields)
            lines.append(
                f"Unknown field `{field}` (value `{_short(value)}`); known fields: {known}."
            )
        elif item["type"] == "json_invalid":
            lines.append(f"The file is not valid JSON: {message}.")
        elif item["type"] == "model_type":
            lines.append(f"A {kind.__name__} is a JSON object of fields, not `{_short(value)}`.")
        elif not field:
            lines.append(f"{message.rstrip('.')}.")
        else:
            lines.append(f"Field `{field}` has value `{_short(value)}`: {message}.")
    return " ".join(lines)


def _short(value: object) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."
