"""Run configuration: one frozen, validated object, read from JSON files.

`Config.tiny()` is the preset the tests use; `Config.default()` is the real
run. A config file is the JSON form of a `Config`; unknown keys and
out-of-range values are refused with a message that names the field.
"""

import json
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything a run depends on: the data, the prior and the inference settings.

    Presets:
      - `Config.tiny()`: the test preset (`configs/tiny.json`): 4 chains of 300
        draws after 300 warm-up iterations. `bayesian-regression report --config
        configs/tiny.json` gives every HMC and NUTS moment within 4 Monte-Carlo
        standard errors of the exact one; its run time is compilation-bound
        (see the README for measured figures).
      - `Config.default()`: `bayesian-regression report` with no `--config`:
        8 chains of 1000 draws after 500 warm-up iterations.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the inference randomness: chain starts, momenta, VI noise."""

    data_seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the synthetic data set (design, true weights, noise)."""

    num_obs: int = Field(default=100, ge=2, le=1_000_000)
    """Observations `n` in the synthetic data set."""

    num_features: int = Field(default=3, ge=1, le=64)
    """Regression weights `d` (no separate intercept)."""

    feature_correlation: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Correlation between every pair of features; near 1 makes the posterior
    over weights strongly correlated (and the design nearly collinear)."""

    noise_scale: float = Field(default=1.0, gt=0.0, le=1e3)
    """True standard deviation of the observation noise."""

    prior_scale: float = Field(default=2.0, gt=0.0, le=1e6)
    """`w | sigma^2 ~ N(0, sigma^2 prior_scale^2 I)`."""

    prior_shape: float = Field(default=3.0, gt=0.0, le=1e6)
    """`a0` of `sigma^2 ~ InvGamma(a0, b0)`."""

    prior_rate: float = Field(default=2.0, gt=0.0, le=1e6)
    """`b0` of `sigma^2 ~ InvGamma(a0, b0)`."""

    num_chains: int = Field(default=8, ge=1, le=256)
    """HMC chains, run side by side with `jax.vmap`."""

    num_warmup: int = Field(default=500, ge=20, le=100_000)
    """Warm-up iterations per chain (dual-averaging step size, diagonal mass matrix)."""

    num_samples: int = Field(default=1000, ge=4, le=1_000_000)
    """Kept draws per chain after warm-up."""

    num_leapfrog: int = Field(default=8, ge=1, le=1024)
    """Leapfrog steps per HMC transition."""

    target_accept: float = Field(default=0.8, gt=0.0, lt=1.0)
    """Mean Metropolis acceptance that dual averaging aims for."""

    vi_steps: int = Field(default=2000, ge=1, le=1_000_000)
    """Adam steps of each VI fit."""

    vi_learning_rate: float = Field(default=0.1, gt=0.0, le=1.0)
    """Adam learning rate of the VI fits."""

    vi_num_mc: int = Field(default=16, ge=1, le=4096)
    """Reparameterized draws per ELBO gradient estimate."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if self.num_obs < self.num_features and self.prior_scale > 1e3:
            raise ValueError(
                f"With fewer observations (`{self.num_obs}`) than features "
                f"(`{self.num_features}`) the prior alone pins some weights; `prior_scale` "
                f"`{self.prior_scale}` is too flat for that."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: 4 chains, 300 warm-up and 300 kept draws.

        Run: `bayesian-regression report --config configs/tiny.json`.
        """
        return cls(num_chains=4, num_warmup=300, num_samples=300)

    @classmethod
    def default(cls) -> "Config":
        """The real run: `bayesian-regression report`."""
        return cls()

    def to_json(self) -> str:
        """The config as the JSON text that `from_json` reads back."""
        return json.dumps(self.model_dump(), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str | Path | None = None) -> "Config":
        """Parses and validates a config; raises `ConfigError` naming the bad field
        (and the file `source`, when given)."""
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as err:
            problems = "; ".join(
                f"`{'.'.join(str(p) for p in e['loc']) or 'config'}`: {e['msg']}"
                + (f" (got `{_shown(e['input'])}`)" if e["type"] not in _NO_INPUT else "")
                for e in err.errors()
            )
            where = "" if source is None else f" file `{source}`"
            raise ConfigError(f"Invalid config{where}: {problems}.") from None

    def replace(self, **changes: object) -> "Config":
        """A validated copy with `changes` applied."""
        try:
            return type(self).model_validate({**self.model_dump(), **changes})
        except pydantic.ValidationError as err:
            raise ConfigError(
                f"Invalid config change {changes}: {err.errors()[0]['msg']}."
            ) from None


# Errors whose input is not worth repeating: a missing field has none, and the
# input of unparsable JSON is the whole file.
_NO_INPUT = ("missing", "json_invalid", "json_type")


def _shown(value: object, limit: int = 60) -> str:
    """A value as one short line, for an error message."""
    text = " ".join(repr(value).split()) if isinstance(value, str) else " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_config(path: str | Path) -> Config:
    """Reads a JSON config file; raises `ConfigError` naming the file for a missing,
    unreadable, non-UTF-8 or invalid one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read the config file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"The config file `{path}` is not UTF-8 text (byte {err.start})."
        ) from None
    return Config.from_json(text, source=path)
