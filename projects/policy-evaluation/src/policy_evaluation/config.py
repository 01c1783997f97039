"""Run configuration: one frozen, validated object, read from JSON files.

`Config.default(env)` is the real run of `policy-evaluation train --env ENV`;
`Config.tiny(env)` is the small budget the tests use. Unknown keys,
out-of-range values and inconsistent sizes are refused with a message naming
the fields and their values.
"""

import json
from pathlib import Path
from typing import Literal, Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything a PPO run (all seeds) and its evaluation depend on."""

    # allow_inf_nan=False: NaN and infinity are refused in every float field (an
    # infinite `ent_coef` passes `ge=0` but gives a NaN loss).
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )

    env: Literal["gridworld", "cartpole"] = "cartpole"
    """Environment: the enumerable `gridworld` or `cartpole`."""

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root key; training and evaluation keys are split from it apart."""

    num_seeds: int = Field(default=8, ge=1, le=256)
    """Independent training runs, vmapped."""

    seed_shards: int = Field(default=2, ge=1, le=256)
    """CPU devices the vmapped seeds are split over (`num_seeds / seed_shards`
    seeds each), so that every core works; CPU backend only. Part of the config
    because it is part of the compiled program: results are bitwise repeatable
    for a given value, and a different value may round differently."""

    num_envs: int = Field(default=4, ge=1, le=4096)
    """Environments stepped in parallel per seed."""

    num_steps: int = Field(default=128, ge=1, le=4096)
    """Rollout length per update."""

    total_timesteps: int = Field(default=500_000, ge=1, le=10**9)
    """Environment steps per seed over the whole run."""

    update_epochs: int = Field(default=4, ge=1, le=100)
    num_minibatches: int = Field(default=4, ge=1, le=4096)
    gamma: float = Field(default=0.99, gt=0.0, lt=1.0)
    gae_lambda: float = Field(default=0.95, ge=0.0, le=1.0)
    clip_eps: float = Field(default=0.2, gt=0.0, lt=1.0)
    ent_coef: float = Field(default=0.01, ge=0.0)
    vf_coef: float = Field(default=0.5, ge=0.0)
    learning_rate: float = Field(default=2.5e-4, gt=0.0, le=1.0)
    max_grad_norm: float = Field(default=0.5, gt=0.0)
    anneal_lr: bool = True
    """Linear decay of the learning rate to 0 over the run."""

    hidden_size: int = Field(default=64, ge=1, le=4096)
    eval_episodes: int = Field(default=64, ge=2, le=100_000)
    """Held-out evaluation episodes per seed."""

    eval_greedy: bool = True
    """Evaluate the argmax action (True) or sample from the policy (False)."""

    eval_horizon: int = Field(default=500, ge=1, le=100_000)
    """Step limit of an evaluation episode."""

    @model_validator(mode="after")
    def _check_sizes(self) -> Self:
        if self.num_seeds % self.seed_shards:
            raise ValueError(
                f"`seed_shards` = {self.seed_shards} must divide `num_seeds` = {self.num_seeds}."
            )
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            raise ValueError(
                f"`num_minibatches` = {self.num_minibatches} must divide the batch "
                f"`num_envs` * `num_steps` = {self.num_envs} * {self.num_steps} = {batch}."
            )
        if self.total_timesteps < batch:
            raise ValueError(
                f"`total_timesteps` = {self.total_timesteps} is less than one batch "
                f"(`num_envs` * `num_steps` = {batch}); no update would run."
            )
        return self

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @classmethod
    def default(cls, env: str = "cartpole") -> "Config":
        """The real run of `policy-evaluation train --env ENV`."""
        if env == "gridworld":
            return cls(
                env="gridworld",
                num_seeds=8,
                num_envs=16,
                num_steps=32,
                total_timesteps=100_000,
                gamma=0.95,
                learning_rate=2.5e-3,
                eval_episodes=512,
                eval_greedy=False,
                eval_horizon=200,
            )
        return cls(env="cartpole")

    @classmethod
    def tiny(cls, env: str = "cartpole") -> "Config":
        """Test budget: seconds on a 2-core CPU, mostly compilation. The default
        run of `env` with fewer seeds, fewer steps and a smaller network."""
        if env == "gridworld":
            return cls.default("gridworld").replace(
                num_seeds=5,
                seed_shards=1,
                total_timesteps=16_384,
                learning_rate=5e-3,
                anneal_lr=False,
                hidden_size=32,
            )
        return cls.default("cartpole").replace(
            num_seeds=2,
            num_envs=8,
            num_steps=64,
            total_timesteps=20_480,
            learning_rate=2.5e-3,
            anneal_lr=False,
            hidden_size=32,
            eval_episodes=16,
        )

    def replace(self, **changes) -> "Config":
        """A copy with `changes`, validated like a config file (`ConfigError`
        naming the fields on bad values or inconsistent sizes)."""
        return type(self).from_dict(self.model_dump() | changes)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        """Validates a mapping; raises `ConfigError` naming each bad field."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"Invalid config: it must be a mapping of fields, not `{type(data).__name__}`."
            )
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as err:
            lines = []
            for e in err.errors():
                field = ".".join(str(p) for p in e["loc"]) or "config"
                msg = e["msg"].removeprefix("Value error, ")
                if e["type"] == "extra_forbidden":
                    msg = f"unknown key `{field}` (value {e['input']!r}); it is not a config field"
                lines.append(f"{field}: {msg}")
            raise ConfigError("Invalid config: " + "; ".join(lines)) from None

    @classmethod
    def from_json(cls, path: str | Path) -> "Config":
        """Reads a JSON config file; raises `ConfigError` naming the file or the field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"Config file `{path}` does not exist.") from None
        except OSError as err:
            raise ConfigError(f"Cannot read config file `{path}`: {err.strerror}.") from None
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"Config file `{path}` is not UTF-8 text (byte {err.start})."
            ) from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"Config file `{path}` is not valid JSON: {err}.") from None
        if not isinstance(data, dict):
            raise ConfigError(f"Config file `{path}` must hold a JSON object.")
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{err} (in `{path}`)") from None
