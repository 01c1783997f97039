"""Run configuration: one frozen, validated object, read from JSON files.

`Config.tiny()` is the preset the tests use; `Config.default()` is what
`kernel-audit audit` and `kernel-audit train` run with no `--config`. Unknown
keys and out-of-range values are refused with a message naming the field.
"""

import json
from pathlib import Path
from typing import Literal, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernel_audit import data

DType = Literal["float32", "bfloat16"]
Activation = Literal["none", "relu", "gelu"]


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything an audit or a training demo depends on.

    Presets:
      - `Config.tiny()`: the test preset (`configs/tiny.json`): two matmul and
        two layer-norm shapes, both dtypes, one block size. `kernel-audit audit
        --config configs/tiny.json`: 8/8 cells within bound, about 12 s of CPU
        time on a 2-core CPU (25 s wall when the machine is shared).
      - `Config.default()`: `kernel-audit audit` with no `--config`: every shape
        of `data.MATMUL_CASES` and `data.ROW_CASES`, both dtypes, three
        activations, three block sizes: 76 cells run, all within bound, 52 block
        sizes refused for their shape; about 55 s of CPU time on a 2-core CPU
        (2.5 min wall when shared). `kernel-audit train` with it: 30 steps,
        loss about 1.7 -> 0.24, kernels and references within 1e-6; 5 s of CPU time.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    seed: int = Field(default=0, ge=0, lt=2**31)
    """Root of every random operand (`jax.random.key(seed)`, folded per table cell)."""

    dtypes: tuple[DType, ...] = Field(default=("float32", "bfloat16"), min_length=1)
    """Operand dtypes audited; accumulation is float32 for both."""

    activations: tuple[Activation, ...] = Field(default=("none", "relu", "gelu"), min_length=1)
    """Epilogue activations of the fused matmul."""

    matmul_cases: tuple[str, ...] = Field(
        default=tuple(c.name for c in data.MATMUL_CASES), min_length=1
    )
    """Names of rows of `data.MATMUL_CASES` to audit."""

    row_cases: tuple[str, ...] = Field(default=tuple(c.name for c in data.ROW_CASES), min_length=1)
    """Names of rows of `data.ROW_CASES` to audit with the layer norm."""

    matmul_blocks: tuple[tuple[int, int, int], ...] = Field(
        default=((16, 128, 128), (32, 128, 256), (64, 256, 512)), min_length=1
    )
    """(block_m, block_n, block_k) targets swept; each is fitted to a shape (a block
    wider than its dimension becomes the whole dimension, `fit_matmul_blocks`), and a
    fitted triple the kernel refuses (a TPU block rule) is recorded as refused."""

    row_blocks: tuple[int, ...] = Field(default=(8, 16, 32), min_length=1)
    """`block_rows` targets swept for the layer norm, fitted to the row count; 8 rows
    are refused for bfloat16, whose native tile has 16."""

    hidden: int = Field(default=48, ge=1, le=1024)
    """Width of the training demo's hidden layer."""

    batch_size: int = Field(default=40, ge=1, le=4096)
    """Rows per training step of the demo (not a multiple of the blocks on purpose)."""

    train_steps: int = Field(default=30, ge=1, le=10_000)
    """SGD steps of the training demo."""

    learning_rate: float = Field(default=0.1, gt=0.0, le=10.0)
    """SGD step size of the training demo."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        known_mm = {c.name for c in data.MATMUL_CASES}
        known_rows = {c.name for c in data.ROW_CASES}
        for field, names, known in (
            ("matmul_cases", self.matmul_cases, known_mm),
            ("row_cases", self.row_cases, known_rows),
        ):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(
                    f"`{field}` names unknown cases `{unknown}`; known: "
                    f"{', '.join(f'`{k}`' for k in sorted(known))}."
                )
        for triple in self.matmul_blocks:
            if any(v < 1 for v in triple):
                raise ValueError(
                    f"Every entry of `matmul_blocks` must be positive, but got `{list(triple)}`."
                )
        if any(v < 1 for v in self.row_blocks):
            raise ValueError(
                f"Every entry of `row_blocks` must be positive, got `{list(self.row_blocks)}`."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: a divisible and a ragged shape per kernel, float32 and
        bfloat16, one block size; about 12 s of CPU time for `kernel-audit audit`."""
        return cls(
            activations=("gelu",),
            matmul_cases=("divides", "ragged"),
            row_cases=("divides", "ragged"),
            matmul_blocks=((16, 128, 128),),
            row_blocks=(16,),
            hidden=16,
            batch_size=20,
            train_steps=5,
        )

    @classmethod
    def default(cls) -> "Config":
        """The full audit table: `kernel-audit audit` (76 cells run, about 55 s of CPU time)."""
        return cls()

    def to_json(self) -> str:
        """The config as the JSON text that `from_json` reads back."""
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> "Config":
        """Parses and validates JSON text; raises `ConfigError` naming each bad field."""
        try:
            return cls.model_validate_json(text)
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
            f"Config file `{path}` is not UTF-8 text (byte {err.start}: {err.reason}); "
            "a config is a JSON object."
        ) from None
    return Config.from_json(text, source=str(path))


def _describe(err: pydantic.ValidationError, source: str) -> str:
    """Turns pydantic's errors into one line: one full sentence per problem."""
    lines = [f"Invalid config `{source}`:"]
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        value = item.get("input")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            known = ", ".join(f"`{name}`" for name in Config.model_fields)
            lines.append(
                f"Unknown field `{field}` (value `{_short(value)}`); known fields: {known}."
            )
        elif item["type"] == "json_invalid":
            lines.append(f"The file is not valid JSON: {message}.")
        elif item["type"] == "model_type":
            lines.append(f"A config is a JSON object of fields, not `{_short(value)}`.")
        elif not field:
            lines.append(f"{message.rstrip('.')}.")
        else:
            lines.append(f"Field `{field}` has value `{_short(value)}`: {message}.")
    return " ".join(lines)


def _short(value: object) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."
