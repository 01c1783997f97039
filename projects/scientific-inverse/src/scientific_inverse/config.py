"""Run configuration: one frozen, validated object, read from JSON files.

`Config.tiny()` is the preset the tests use; `Config.default()` is the real
run (`scientific-inverse fit`). A config file is the JSON form of a `Config`
(`fit` writes the one it used into its run folder as `config.json`); unknown
keys and out-of-range values are refused with a message that names the field.
"""

import json
import math
import os
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


def _divides(whole: float, part: float) -> bool:
    ratio = whole / part
    return abs(ratio - round(ratio)) <= 1e-9 * max(1.0, ratio) and round(ratio) >= 1


class Config(BaseModel):
    """The inverse problem: a damped oscillator `m x'' + c x' + k x = 0`, its position
    observed with Gaussian noise; `c` and `k` are recovered, `m` is known.

    Presets:
      - `Config.tiny()`: the test preset (`configs/tiny.json`): 24 coverage seeds,
        3 grid levels, 15-point profiles, no sensitivity study. About 15 s of CPU
        time for `scientific-inverse fit --config configs/tiny.json` on a 2-core
        CPU, mostly compilation.
      - `Config.default()`: `scientific-inverse fit` with no `--config`
        (`configs/default.json`): 400 coverage seeds, 4 grid levels, 41-point
        profiles, the sensitivity study; about 30 s of CPU time (66 s wall on a
        shared 2-core CPU). Coverage about 0.95; see the README for the figures.
    """

    # frozen: a config is a value; extra="forbid": a misspelt key is an error;
    # strict: `"0.1"` is not a float. The docstring under each field describes it.
    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of all randomness: observation noise and the held-out split."""

    mass: float = Field(default=1.0, gt=0.0, le=1e3)
    """Known mass `m` (not fitted: from the free response only c/m and k/m are identifiable)."""

    damping: float = Field(default=0.3, ge=0.0, le=1e3)
    """True damping `c` that generates the synthetic observations."""

    stiffness: float = Field(default=4.0, gt=0.0, le=1e4)
    """True stiffness `k` that generates the synthetic observations."""

    x0: float = Field(default=1.0, ge=-1e3, le=1e3)
    """Known initial position."""

    v0: float = Field(default=0.0, ge=-1e3, le=1e3)
    """Known initial velocity."""

    initial_guess: tuple[float, float] = (0.6, 3.0)
    """Starting point `(c, k)` of the least-squares fit."""

    t_end: float = Field(default=10.0, gt=0.0, le=1e3)
    """End of the observation window (observations at obs_dt, 2 obs_dt, ..., t_end)."""

    obs_dt: float = Field(default=0.1, gt=0.0, le=10.0)
    """Spacing of the observation times; must divide `t_end`."""

    noise_std: float = Field(default=0.05, gt=0.0, le=10.0)
    """Standard deviation of the Gaussian observation noise."""

    heldout_fraction: float = Field(default=0.2, gt=0.0, lt=0.5)
    """Fraction of observation times held out of the fit for the prediction error."""

    solver_dt: float = Field(default=0.0125, gt=0.0, le=10.0)
    """RK4 step of the refined solver of the fit; must divide `obs_dt`."""

    coarse_dt: float = Field(default=0.1, gt=0.0, le=10.0)
    """RK4 step of the coarse solver (solver bias = coarse fit - refined fit); divides `obs_dt`."""

    refinement_levels: int = Field(default=4, ge=3, le=6)
    """Grid levels of the convergence study: dt = obs_dt / 2**j for j = 1, ..., levels."""

    short_window: float = Field(default=1.2, gt=0.0, le=1e3)
    """End of the short observation window of the weakly identifiable variant."""

    coverage_seeds: int = Field(default=400, ge=8, le=100_000)
    """Synthetic data sets (seeds) over which interval coverage is measured."""

    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Nominal level of the Laplace and profile-likelihood intervals."""

    profile_points: int = Field(default=41, ge=5, le=1001)
    """Points of each profile-likelihood curve."""

    check_sensitivities: bool = True
    """Run the sensitivity study (autodiff vs finite differences vs diffrax adjoints)
    for the report; it costs about 15 s of compilation, so the tiny preset skips it."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if self.damping**2 >= 4.0 * self.mass * self.stiffness:
            raise ValueError(
                f"The oscillator must be underdamped (`damping`^2 < 4 `mass` `stiffness`) for "
                f"its exact solution, but `damping = {self.damping}`, `mass = {self.mass}`, "
                f"`stiffness = {self.stiffness}`."
            )
        if any(not math.isfinite(v) or v <= 0 for v in self.initial_guess):
            raise ValueError(
                f"`initial_guess` must hold a positive `(c, k)`, but got `{self.initial_guess}`."
            )
        for name in ("solver_dt", "coarse_dt"):
            if not _divides(self.obs_dt, getattr(self, name)):
                raise ValueError(
                    f"`{name} = {getattr(self, name)}` must divide `obs_dt = {self.obs_dt}` so "
                    "that every observation time lies on the solver's grid."
                )
        for name in ("t_end", "short_window"):
            if not _divides(getattr(self, name), self.obs_dt):
                raise ValueError(
                    f"`obs_dt = {self.obs_dt}` must divide `{name} = {getattr(self, name)}`."
                )
        if self.short_window >= self.t_end:
            raise ValueError(
                f"`short_window = {self.short_window}` must be shorter than `t_end = {self.t_end}`."
            )
        if round(self.short_window / self.obs_dt) < 5:
            raise ValueError(
                f"`short_window = {self.short_window}` holds fewer than 5 observations at "
                f"`obs_dt = {self.obs_dt}`; two parameters need more."
            )
        return self

    @property
    def theta_true(self) -> tuple[float, float, float]:
        """The true `(m, c, k)`."""
        return (self.mass, self.damping, self.stiffness)

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: 24 coverage seeds, 3 grid levels, 15-point profiles.

        Run: `scientific-inverse fit --config configs/tiny.json` (about 15 s of CPU).
        """
        return cls(
            coverage_seeds=24, refinement_levels=3, profile_points=15, check_sensitivities=False
        )

    @classmethod
    def default(cls) -> "Config":
        """The real run: `scientific-inverse fit`. 400 coverage seeds, 4 grid levels;
        about 30 s of CPU time on a 2-core CPU, report and plots included."""
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


def check_output_path(path: str | Path, *, directory: bool, what: str) -> Path:
    """Refuses an output path that cannot be written, before any work is done.

    `directory`: the path is a folder to create (else a file to create or replace).
    The path itself, if it exists, must be of that kind, and its nearest existing
    ancestor must be a folder; raises `ConfigError` naming `what` and the path.
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
