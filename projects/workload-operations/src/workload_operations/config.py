"""Run configuration: one frozen, validated object for the job and its supervisor.

`Config.tiny()` is the preset the tests use; `Config.default()` is what
`workload-operations run` and `supervise` use with no `--config`. Unknown keys
and out-of-range values are refused with a message that names the field; so is
a heartbeat interval that is not shorter than the timeouts it feeds.

Times are seconds; every detection bound the supervisor states is converted
into heartbeat intervals (`heartbeat_interval_s`), the unit a runbook uses.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything the job and its supervisor depend on.

    Presets:
      - `Config.tiny()`: the tests' job: 60 paced steps of a 16-32-4 MLP,
        heartbeats every second; about 4 s after JAX starts.
        `workload-operations supervise --config configs/tiny.json` runs it.
      - `Config.default()`: `workload-operations supervise`: 600 steps at 50
        steps/s with a checkpoint every 100 steps; the loss falls from about
        log(4) = 1.39 to under 0.3, about 15 s on a 2-core CPU.
    """

    # allow_inf_nan=False: NaN and infinity are refused for every float, bounded or not.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the parameter initialization."""

    data_seed: int = Field(default=1, ge=0, lt=2**32)
    """Root of the synthetic data set and of Grain's shuffle."""

    num_examples: int = Field(default=1024, ge=1, le=1_000_000)
    """Training rows of the synthetic data set; sample ID = row index."""

    heldout_examples: int = Field(default=256, ge=1, le=100_000)
    """Rows of the held-out set the verifier re-evaluates a restored state on."""

    num_features: int = Field(default=16, ge=1, le=4096)
    """Input width."""

    hidden_size: int = Field(default=64, ge=1, le=16384)
    """Width of the hidden layer."""

    num_classes: int = Field(default=4, ge=2, le=1024)
    """Classes of the synthetic labels."""

    batch_size: int = Field(default=16, ge=1, le=65536)
    """Examples per step (the last partial batch of an epoch is dropped)."""

    learning_rate: float = Field(default=1e-2, gt=0.0, le=10.0)
    """Adam step size, constant."""

    num_steps: int = Field(default=600, ge=1, le=10_000_000)
    """Optimizer steps of the run."""

    steps_per_second: float = Field(default=50.0, ge=0.0, le=100_000.0)
    """Pace of the job (a stand-in for a real step's cost); 0 runs unpaced."""

    heartbeat_interval_s: float = Field(default=1.0, gt=0.0, le=3600.0)
    """The job's reporter emits one heartbeat (with its progress) this often."""

    hang_timeout_s: float = Field(default=6.0, gt=0.0, le=86400.0)
    """No heartbeat for this long: the process is hung."""

    stall_timeout_s: float = Field(default=10.0, gt=0.0, le=86400.0)
    """Heartbeats but no new step for this long: the job is stalled."""

    startup_timeout_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    """Allowance for the first heartbeat and the first step (imports, compilation)."""

    min_examples_per_s: float = Field(default=80.0, gt=0.0, le=1e9)
    """The stated rate: fewer examples per second over `rate_window_steps` is slow."""

    rate_window_steps: int = Field(default=3, ge=1, le=10_000)
    """Steps over which the supervisor measures the rate against the stated one."""

    memory_limit_mb: float = Field(default=2048.0, gt=0.0, le=1_048_576.0)
    """Resident memory of the job's whole process group above this (at most 1 TiB) is a fault."""

    checkpoint_every: int = Field(default=100, ge=0)
    """Request an Orbax checkpoint every this many steps; 0 saves none."""

    sidecar: bool = False
    """Start a helper process in the job's process group (it must not outlive the job)."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        h = self.heartbeat_interval_s
        for name in ("hang_timeout_s", "stall_timeout_s"):
            timeout = getattr(self, name)
            if h >= timeout:
                raise ValueError(
                    f"`heartbeat_interval_s` = `{h}` is not shorter than `{name}` = "
                    f"`{timeout}`: a healthy job would be judged by a timeout it cannot "
                    f"meet; make the interval shorter (at most half of `{name}`)."
                )
        if self.steps_per_second > 0:
            paced_rate = self.steps_per_second * self.batch_size
            if self.min_examples_per_s * 4 > paced_rate:
                raise ValueError(
                    f"`min_examples_per_s` = `{self.min_examples_per_s}` leaves less than a 4x "
                    f"margin below the paced rate of {paced_rate:g} examples/s, so a loaded "
                    f"machine would make a healthy job look slow; lower it."
                )
        if self.batch_size > self.num_examples:
            raise ValueError(
                f"`batch_size` = `{self.batch_size}` exceeds `num_examples` = "
                f"`{self.num_examples}`; an epoch would hold no full batch."
            )
        return self

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: 60 steps at 20 steps/s, heartbeats every 1 s, hang after 6
        silent intervals, stall after 8 intervals without a step, slow below 80
        examples/s (a quarter of the paced 320), 512 MB for the job's group (a job
        forked from the fork server needs about 200 MB), checkpoints off."""
        return cls(
            num_examples=256,
            heldout_examples=128,
            num_features=16,
            hidden_size=32,
            num_classes=4,
            num_steps=60,
            steps_per_second=20.0,
            heartbeat_interval_s=1.0,
            hang_timeout_s=6.0,
            stall_timeout_s=8.0,
            startup_timeout_s=300.0,
            min_examples_per_s=80.0,
            rate_window_steps=3,
            memory_limit_mb=512.0,
            checkpoint_every=0,
        )

    @classmethod
    def tiny_recovery(cls) -> "Config":
        """Recovery-test preset: `tiny()` for 15 steps with a checkpoint request every 3
        steps. A blocking save pauses the loop (on a loaded machine, seconds for the
        first one), so the stall limit is 30 s and the stated rate a low 8 examples/s
        over 6 steps: a save is not an incident."""
        return cls.tiny().replace(
            num_steps=15,
            checkpoint_every=3,
            stall_timeout_s=30.0,
            min_examples_per_s=8.0,
            rate_window_steps=6,
        )

    @classmethod
    def default(cls) -> "Config":
        """The real run; see the class docstring."""
        return cls()

    def replace(self, **changes) -> "Config":
        """A validated copy with `changes` applied (raises `ConfigError`)."""
        return load_dict({**self.model_dump(), **changes})

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Config":
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"The config is not valid JSON: {err}.") from None
        if not isinstance(data, dict):
            raise ConfigError("The config must be a JSON object of field names to values.")
        return load_dict(data)


def load_dict(data: dict) -> Config:
    try:
        return Config.model_validate(data)
    except pydantic.ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) if e["loc"] else "config"
            got = repr(e.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            problems.append(f"`{where}`: {e['msg']} (got `{got}`)")
        raise ConfigError("Invalid config: " + "; ".join(problems)) from None


def load(path: str | Path | None) -> Config:
    """The config at `path`, or the default one when `path` is None."""
    if path is None:
        return Config.default()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read the config file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"The config file `{path}` is not UTF-8 text (byte {err.start}: {err.reason})."
        ) from None
    try:
        return Config.from_json(text)
    except ConfigError as err:
        raise ConfigError(f"`{path}`: {err}") from None


def check_output_path(path: str | Path, *, directory: bool, what: str) -> Path:
    """Refuses an output path that cannot be written, before anything starts.

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
