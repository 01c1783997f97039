"""Audit configuration: one frozen, validated object, read from JSON files.

`Config.tiny()` is the preset the tests use; `Config.default()` is what
`derivative-audit report` runs. A config file is the JSON form of a `Config`;
unknown keys and out-of-range values are refused with a message that names
the field.
"""

import json
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything an audit depends on.

    Presets:
      - `Config.tiny()` (`configs/tiny.json`): the test preset, n = 5. About
        15 s for `derivative-audit report --config configs/tiny.json` on a
        2-core CPU, mostly compilation.
      - `Config.default()` (`configs/default.json`): `derivative-audit report`.
        Every suite function passes every float64 check; about 40 s on a
        2-core CPU.
    """

    # frozen: a config is a value. extra="forbid": a misspelt key is an error.
    # strict: `"8"` is not an int. Field docstrings are the descriptions.
    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of every random draw: the suite's weights, points, tangents, cotangents."""

    n: int = Field(default=8, ge=2, le=256)
    """Input width of every suite function (x has shape `(n,)`)."""

    scan_length: int = Field(default=6, ge=1, le=1000)
    """Steps of the `scan_recurrence` suite function."""

    solver_iterations: int = Field(default=30, ge=1, le=1000)
    """Fixed iteration count of the `fixed_point_solver` suite function."""

    directions: int = Field(default=3, ge=1, le=64)
    """Random tangent/cotangent directions per check."""

    sweep_min_exponent: int = Field(default=-13, ge=-16, le=-2)
    """Smallest finite-difference step of the sweep is 10**this."""

    sweep_max_exponent: int = Field(default=-1, ge=-10, le=0)
    """Largest finite-difference step of the sweep is 10**this."""

    sweep_points_per_decade: int = Field(default=3, ge=1, le=10)
    """Steps per decade in the error-vs-step sweep."""

    train_steps: int = Field(default=60, ge=1, le=10_000)
    """Adam steps of the implicit-layer training demo (`report`)."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if self.sweep_max_exponent - self.sweep_min_exponent < 4:
            raise ValueError(
                f"The sweep must span at least 4 decades so that both the round-off and "
                f"the truncation side show, but `sweep_min_exponent` = {self.sweep_min_exponent} "
                f"and `sweep_max_exponent` = {self.sweep_max_exponent} span "
                f"{self.sweep_max_exponent - self.sweep_min_exponent}."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: n = 5, 2 directions, 20 training steps.
        Run: `derivative-audit report --config configs/tiny.json`."""
        return cls(n=5, scan_length=6, solver_iterations=25, directions=2, train_steps=20)

    @classmethod
    def default(cls) -> "Config":
        """`derivative-audit report`: n = 8, 3 directions, 60 training steps."""
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
            f"Config file `{path}` is not UTF-8 text (byte {err.start}: {err.reason})."
        ) from None
    return Config.from_json(text, source=str(path))


def _describe(err: pydantic.ValidationError, source: str) -> str:
    """Turns pydantic's errors into one line: every problem, each naming its field."""
    problems = []
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        message = " ".join(item["msg"].removeprefix("Value error, ").split()).rstrip(".")
        if item["type"] == "extra_forbidden":
            known = ", ".join(f"`{name}`" for name in Config.model_fields)
            problems.append(f"unknown field `{field}` (known fields: {known})")
        elif item["type"] == "json_invalid":
            problems.append(f"not valid JSON: {message}")
        elif not field:
            problems.append(message)
        else:
            problems.append(f"field `{field}` has value `{item.get('input')!r}`: {message}")
    return f"Invalid config `{source}`: " + "; ".join(problems) + "."
