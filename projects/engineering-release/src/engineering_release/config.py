"""Configuration: the training run of the released classifier, and the release policy.

Both are frozen, validated pydantic models read from JSON. `TrainConfig.tiny()`
is the preset the tests use; `TrainConfig.default()` the real run. The
`Policy` names the held-out data set a report must be computed on and the
thresholds a release must pass; an approval signs the policy with the model
and evaluation ids, so a report judged under one policy cannot be released
under another.
"""

import hashlib
import json
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config or policy file that cannot be used; the message says why."""


def canonical_json(value: object) -> bytes:
    """The one byte serialization of a JSON value used for every identity here:
    sorted keys, no insignificant whitespace, ASCII only, UTF-8. Floats keep
    Python's shortest round-trip repr, so a parsed value serializes back to the
    same bytes."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("utf-8")


def shown(value: object, limit: int = 80) -> str:
    """`value` as it may appear inside a one-line message: printable text as it is,
    anything else (newlines, control characters) escaped, and long text cut."""
    text = str(value)
    if not text.isprintable():
        text = ascii(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Frozen(BaseModel):
    # frozen: a config is a value. extra="forbid": a misspelt key is an error.
    # strict: `"0.1"` is not a float. allow_inf_nan=False: NaN and infinity are refused
    # by name. The docstring under each field describes it.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    def sha256(self) -> str:
        """The sha256 of this value's canonical JSON."""
        return hashlib.sha256(canonical_json(self.to_dict())).hexdigest()


class TrainConfig(_Frozen):
    """One training run of the digits classifier (a one-hidden-layer NNX MLP).

    Presets:
      - `TrainConfig.tiny()`: the tests' preset (`configs/tiny.json`), hidden
        width 32, 12 epochs: held-out accuracy about 0.95, about 2 s after
        start-up on a 2-core CPU (mostly compilation).
      - `TrainConfig.default()`: `engineering-release register` with no
        `--config`; hidden width 64, 40 epochs: held-out accuracy about 0.97
        in about 3 s after start-up.
    """

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the training randomness: parameter init and the per-epoch shuffles."""

    split_seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the held-out split; training never sees the held-out examples."""

    test_fraction: float = Field(default=0.2, gt=0.0, lt=0.5)
    """Fraction of each class held out (the evaluation set)."""

    hidden_size: int = Field(default=64, ge=1, le=1024)
    """Width of the hidden layer."""

    learning_rate: float = Field(default=3e-3, gt=0.0, le=1.0)
    """Adam step size."""

    batch_size: int = Field(default=64, ge=1, le=1024)
    """Examples per step; each epoch drops the remainder of its own shuffle."""

    num_epochs: int = Field(default=40, ge=1, le=1000)
    """Passes over the training examples."""

    golden_count: int = Field(default=16, ge=1, le=256)
    """Held-out inputs whose logits ship with the model: a server's self-test."""

    @classmethod
    def tiny(cls, **changes: object) -> "TrainConfig":
        """Test preset; `engineering-release register --config configs/tiny.json`."""
        return cls(hidden_size=32, num_epochs=12, **changes)

    @classmethod
    def default(cls) -> "TrainConfig":
        """The real run: `engineering-release register`."""
        return cls()


class Policy(_Frozen):
    """What a release must satisfy: the held-out set it was judged on and the
    thresholds its metrics must reach. `configs/policy.json` is the default."""

    name: str = Field(default="digits-release-v1", min_length=1, max_length=100)
    """A label shown in approvals and logs."""

    split_seed: int = Field(default=0, ge=0, lt=2**32)
    """The held-out set: the stratified split drawn from this seed ..."""

    test_fraction: float = Field(default=0.2, gt=0.0, lt=0.5)
    """... holding out this fraction of each class."""

    min_accuracy: float = Field(default=0.9, ge=0.0, le=1.0)
    """Lowest held-out accuracy a release may have."""

    min_class_recall: float = Field(default=0.75, ge=0.0, le=1.0)
    """Lowest recall of any single digit class."""

    approval_valid_days: float = Field(default=30.0, gt=0.0, le=3650.0)
    """How long an approval may be used for a release after it was signed."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min_class_recall > self.min_accuracy + 0.25:
            raise ValueError(
                f"`min_class_recall` ({self.min_class_recall}) is far above `min_accuracy` "
                f"({self.min_accuracy}); a policy that demands more of every class than of "
                f"their average is probably a typo."
            )
        return self


def _short(value: object, limit: int = 60) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load(cls: type[_Frozen], path: str | Path) -> _Frozen:
    """Reads and validates a `cls` JSON file; one `ConfigError` line naming the file
    and every bad field (its value and what is wrong) otherwise."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Invalid {cls.__name__} file `{path}`: not UTF-8 text (byte {err.start})."
        ) from None
    try:
        return cls.model_validate_json(text)
    except pydantic.ValidationError as err:
        problems = []
        for item in err.errors(include_url=False):
            field = ".".join(str(p) for p in item["loc"]) or "(file)"
            message = item["msg"].removeprefix("Value error, ")
            if item["type"] == "json_invalid":
                problems.append(f"not JSON ({message})")
            else:
                problems.append(f"`{field}` (value `{_short(item.get('input'))}`): {message}")
        raise ConfigError(
            f"Invalid {cls.__name__} file `{path}`: " + "; ".join(problems) + "."
        ) from None


def load_train_config(path: str | Path) -> TrainConfig:
    """Reads a `TrainConfig` JSON file; raises `ConfigError` naming each bad field."""
    return _load(TrainConfig, path)  # type: ignore[return-value]


def load_policy(path: str | Path) -> Policy:
    """Reads a `Policy` JSON file; raises `ConfigError` naming each bad field."""
    return _load(Policy, path)  # type: ignore[return-value]
