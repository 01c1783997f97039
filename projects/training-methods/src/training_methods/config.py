"""Run configuration: one frozen, validated object shared by every lab.

`Config.tiny()` is the preset the tests use; `Config.default()` is what the
CLI runs with no `--config`. A config file is the JSON form of a `Config`;
unknown keys and out-of-range values are refused with a message naming the
field and the value.
"""

import json
from pathlib import Path
from typing import Self

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message says why."""


class Config(BaseModel):
    """Everything a lab run depends on.

    Presets:
      - `Config.tiny()`: the test preset (`configs/tiny.json`); every lab
        trains for a few hundred steps or less, seconds on a 2-core CPU.
      - `Config.default()`: `training-methods <lab>` with no `--config`
        (`configs/default.json`); longer runs, still under a minute per lab.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )

    seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the training randomness: initialisation, masks, batch order."""

    data_seed: int = Field(default=0, ge=0, lt=2**32)
    """Root of the synthetic language: example `i` is drawn from `fold_in(key, i)`."""

    num_train: int = Field(default=4096, ge=16, le=1_000_000)
    """Examples with ids `0 .. num_train-1`: the only ids any objective may read."""

    num_heldout: int = Field(default=512, ge=16, le=100_000)
    """Held-out examples, ids `num_train .. num_train+num_heldout-1`."""

    min_len: int = Field(default=2, ge=1, le=16)
    """Shortest prompt (symbols before the separator)."""

    max_len: int = Field(default=6, ge=1, le=16)
    """Longest prompt; sequences are padded to `2 * max_len + 3` tokens."""

    num_symbols: int = Field(default=16, ge=2, le=64)
    """Size of the symbol alphabet of the synthetic language."""

    d_model: int = Field(default=64, ge=8, le=1024)
    """Width of the Transformer."""

    num_layers: int = Field(default=2, ge=1, le=12)
    """Transformer blocks."""

    num_heads: int = Field(default=4, ge=1, le=16)
    """Attention heads; must divide `d_model`."""

    learning_rate: float = Field(default=3e-3, gt=0.0, le=1.0)
    """AdamW step size of every lab."""

    batch_size: int = Field(default=64, ge=2, le=4096)
    """Examples per step."""

    mlm_steps: int = Field(default=300, ge=1, le=100_000)
    """Steps of the masked-language-modelling lab."""

    mask_rate: float = Field(default=0.15, gt=0.0, lt=1.0)
    """Fraction of real tokens selected for the masked objective (BERT: 0.15)."""

    contrastive_steps: int = Field(default=200, ge=1, le=100_000)
    """Steps of the contrastive lab."""

    temperature: float = Field(default=0.1, gt=0.0, le=10.0)
    """InfoNCE temperature (CLIP learns it; here it is fixed)."""

    sft_steps: int = Field(default=600, ge=1, le=100_000)
    """Steps of response-only supervised fine-tuning (the base of LoRA and DPO)."""

    lora_steps: int = Field(default=300, ge=1, le=100_000)
    """Steps of each LoRA run."""

    lora_rank: int = Field(default=4, ge=1, le=1024)
    """Rank of the adapters of the `lora` lab; at most `d_model`."""

    lora_alpha: float = Field(default=8.0, gt=0.0, le=1024.0)
    """LoRA scale numerator: the update is `(alpha / rank) * x @ A @ B`."""

    dpo_steps: int = Field(default=150, ge=1, le=100_000)
    """Steps of the preference-optimization lab."""

    dpo_beta: float = Field(default=0.1, gt=0.0, le=100.0)
    """DPO's beta: the strength of the implicit KL pull towards the reference."""

    @model_validator(mode="after")
    def _check_cross_field(self) -> Self:
        if self.min_len > self.max_len:
            raise ValueError(
                f"`min_len` (`{self.min_len}`) must not exceed `max_len` (`{self.max_len}`)."
            )
        if self.d_model % self.num_heads:
            raise ValueError(
                f"`num_heads` (`{self.num_heads}`) must divide `d_model` (`{self.d_model}`)."
            )
        if self.lora_rank > self.d_model:
            raise ValueError(
                f"`lora_rank` (`{self.lora_rank}`) is larger than the layers it adapts "
                f"(`d_model` = `{self.d_model}`); choose a rank of at most `{self.d_model}`."
            )
        return self

    @property
    def seq_len(self) -> int:
        """Padded length: BOS, prompt, SEP, response, EOS."""
        return 2 * self.max_len + 3

    @classmethod
    def tiny(cls) -> "Config":
        """Test preset: short runs, a 2-layer width-64 model. Seconds per lab.

        Run: `training-methods sft --config configs/tiny.json`.
        """
        return cls(
            num_train=2048,
            num_heldout=256,
            max_len=5,
            mlm_steps=60,
            contrastive_steps=60,
            sft_steps=150,
            lora_steps=200,
            dpo_steps=60,
        )

    @classmethod
    def default(cls) -> "Config":
        """The real run: `training-methods <lab>` with no `--config`."""
        return cls()

    def replace(self, **changes: object) -> "Config":
        """A validated copy with `changes` applied (unknown keys refused)."""
        return Config.from_json(json.dumps({**self.model_dump(mode="json"), **changes}))

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> "Config":
        """Parses and validates JSON text; raises `ConfigError` naming each bad field."""
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as err:
            raise ConfigError(_describe(err, source)) from None


def load_config(path: str | Path) -> Config:
    """Reads a JSON config file; raises `ConfigError` with a one-line message
    naming the file (and the field, for a bad value)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"Cannot read config file `{path}`: {err.strerror}.") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Config file `{path}` is not UTF-8 text: byte `0x{err.object[err.start]:02x}` "
            f"at offset {err.start}."
        ) from None
    return Config.from_json(text, source=str(path))


def _describe(err: pydantic.ValidationError, source: str) -> str:
    """One line: the source, then each problem, separated by `; `."""
    lines = []
    for item in err.errors(include_url=False):
        field = ".".join(str(part) for part in item["loc"])
        value = item.get("input")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown config key `{field}` (value `{json.dumps(value)[:60]}`)")
        elif item["type"] == "json_invalid":
            lines.append(f"the file is not valid JSON: {message.rstrip('.')}")
        elif not field:
            lines.append(message.rstrip("."))
        else:
            lines.append(
                f"field `{field}` has value `{json.dumps(value)[:60]}`: {message.rstrip('.')}"
            )
    return f"Invalid config `{source}`: " + "; ".join(lines) + "."
