"""Bad input: every CLI command and the library entry points a learner calls.

A damaged input must be refused where it is read:
  - CLI: exit status 2 (the project's `BadInput`, or click's own usage
    error), a single `Error:` line naming the file, field or value, no
    traceback, and nothing written (the working folder's file names and
    bytes are equal before and after);
  - library: a `ValueError` (or a project subclass of it) naming the field or
    value; never a silent NaN.

The damaged values are chosen by what a field means (a count of zero, a
negative seed, a rate outside (0, 1)), not read from the code's bounds.
Every case is counted; the module writes `evidence/bad_input.json`.
"""

import contextlib
import json
import math
import os
import shutil
import string
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from training_methods import checkpoint, contrastive, dpo, heldout, lora, mlm, parity, reductions
from training_methods import sft as sft_lab
from training_methods.cli import main
from training_methods.config import Config, ConfigError, load_config
from training_methods.data import Corpus, batches, generate
from training_methods.model import Transformer, build
from training_methods.train import Ledger, evaluate, fit

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TINY = json.loads((PROJECT_ROOT / "configs" / "tiny.json").read_text(encoding="utf-8"))
FIELDS = sorted(Config.model_fields)

# A small model and data for the library cases: vocabulary 5 + 16 = 21,
# sequences of 2 * 5 + 3 = 13 tokens (the model's `max_len`).
SMALL = Config.tiny().replace(
    d_model=8, num_heads=1, num_layers=1, batch_size=2, num_train=16, num_heldout=16
)
VOCAB = 21
MAX_LEN = 13

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None)

# What was tried, for the evidence file.
TALLY: dict = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}


def _tried(*, command: str | None = None, entry_point: str | None = None) -> None:
    TALLY["cases"] += 1
    if command:
        TALLY["commands"].add(command)
    if entry_point:
        TALLY["entry_points"].add(entry_point)


@pytest.fixture(scope="module", autouse=True)
def _write_evidence():
    yield
    directory = Path(os.environ.get("EVIDENCE_DIR", PROJECT_ROOT / "evidence"))
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "cases": TALLY["cases"],
        "tracebacks": TALLY["tracebacks"],
        "commands": sorted(TALLY["commands"]),
        "entry_points": sorted(TALLY["entry_points"]),
    }
    (directory / "bad_input.json").write_text(json.dumps(payload, indent=1) + "\n", "utf-8")


# ----------------------------------------------------------------------------
# Damaged config files (shared by the CLI and `load_config`)

# A value each field must refuse, by what the field means.
_COUNT = st.integers(min_value=-(2**40), max_value=0)
_NONPOSITIVE = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
_SEED = st.integers(max_value=-1, min_value=-(2**40)) | st.integers(
    min_value=2**32, max_value=2**40
)
MEANINGLESS = {
    "seed": _SEED,
    "data_seed": _SEED,
    "num_train": _COUNT,
    "num_heldout": _COUNT,
    "min_len": _COUNT,
    "max_len": _COUNT,
    "num_symbols": st.integers(min_value=-(2**40), max_value=1),  # an alphabet needs two
    "d_model": _COUNT,
    "num_layers": _COUNT,
    "num_heads": _COUNT,
    "learning_rate": _NONPOSITIVE,
    "batch_size": _COUNT,
    "mlm_steps": _COUNT,
    "mask_rate": _NONPOSITIVE | st.floats(min_value=1.0, allow_nan=False, allow_infinity=False),
    "contrastive_steps": _COUNT,
    "temperature": _NONPOSITIVE,
    "sft_steps": _COUNT,
    "lora_steps": _COUNT,
    "lora_rank": _COUNT,
    "lora_alpha": _NONPOSITIVE,
    "dpo_steps": _COUNT,
    "dpo_beta": _NONPOSITIVE,
}
# Pairs of fields that are each valid but do not fit together (the field named first).
CROSS = [
    ("min_len", {"min_len": 5, "max_len": 3}),
    ("num_heads", {"d_model": 64, "num_heads": 3}),
    ("lora_rank", {"d_model": 16, "num_heads": 4, "lora_rank": 17}),
]
FILE_KINDS = ["missing", "empty", "truncated", "non_utf8", "not_json", "not_object", "directory"]
FIELD_KINDS = ["unknown", "wrong_type", "meaningless", "nonfinite", "cross_field"]


def _text(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


@st.composite
def damaged_config(draw, kinds=FILE_KINDS + FIELD_KINDS):
    """`(kind, content, names)`: the file's bytes (None: no file; "dir": a
    directory) and the strings one of which the message must contain
    (`"<path>"` stands for the file's path)."""
    kind = draw(st.sampled_from(kinds))
    text = _text(TINY)
    if kind == "missing":
        return kind, None, ["<path>"]
    if kind == "directory":
        return kind, "dir", ["<path>"]
    if kind == "empty":
        return kind, draw(st.sampled_from([b"", b"\n", b"   "])), ["<path>"]
    if kind == "truncated":
        cut = draw(st.integers(min_value=1, max_value=text.rindex("}") - 1))
        return kind, text[:cut].encode(), ["<path>"]
    if kind == "non_utf8":
        at = draw(st.integers(min_value=0, max_value=len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xe9", b"\xc3\x28", b"\x80"]))
        raw = text.encode()
        return kind, raw[:at] + bad + raw[at:], ["<path>"]
    if kind == "not_json":
        junk = draw(st.sampled_from(["seed = 1", "{'seed': 1}", "{seed: 1}", "<config/>", "{,}"]))
        return kind, junk.encode(), ["<path>"]
    if kind == "not_object":
        value = draw(st.sampled_from([[TINY], [], 3, "tiny", None, True]))
        return kind, json.dumps(value).encode(), ["<path>"]
    config = dict(TINY)
    if kind == "unknown":
        key = draw(
            st.text(string.ascii_lowercase + "_", min_size=1, max_size=12).filter(
                lambda k: k not in FIELDS
            )
        )
        config[key] = draw(st.sampled_from([1, 0.5, "x", None, [1]]))
        return kind, _text(config).encode(), [f"`{key}`"]
    if kind == "cross_field":
        name, changes = draw(st.sampled_from(CROSS))
        return kind, _text({**config, **changes}).encode(), [f"`{name}`"]
    field = draw(st.sampled_from(FIELDS))
    if kind == "wrong_type":
        is_int = isinstance(TINY[field], int)
        choices = ["4", True, None, [4], {"v": 4}] + ([4.5] if is_int else [])
        config[field] = draw(st.sampled_from(choices))
    elif kind == "nonfinite":
        config[field] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    else:
        config[field] = draw(MEANINGLESS[field])
    return kind, _text(config).encode(), [f"`{field}`"]


def _place(folder: Path, content) -> Path:
    """Writes the damaged config under `folder`; returns the path to pass."""
    path = folder / "config.json"
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


# ----------------------------------------------------------------------------
# The CLI

# Valid arguments besides --config, so that only the damaged input is wrong.
COMMAND_ARGS = {
    "sft": [],
    "mlm": [],
    "contrastive": [],
    "lora": ["--rank", "1"],
    "dpo": [],
    "reductions": [],
    "heldout": [],
    "parity": [],
    "bench": ["--out", "out/bench.json", "--repetitions", "1"],
}
COMMANDS = sorted(COMMAND_ARGS)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The working folder of every CLI case (its `runs/` is where labs write)."""
    root = tmp_path_factory.mktemp("cli")
    (root / "inputs").mkdir()
    (root / "a_file").write_text("not a folder\n", encoding="utf-8")
    (root / "a_folder").mkdir()
    return root


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def _invoke(work: Path, args: list[str], *, command: str, names: list[str], usage: bool = False):
    """Runs the CLI in `work` and checks the refusal; `usage`: a click usage
    error (its usage lines are allowed around the one `Error:` line)."""
    before = _snapshot(work)
    with contextlib.chdir(work):
        result = CliRunner().invoke(main, args)
    after = _snapshot(work)
    _tried(command=command)
    if "Traceback" in result.output:
        TALLY["tracebacks"] += 1
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    if not usage:
        assert result.output.strip() == errors[0], result.output
    assert any(n in errors[0] for n in names), (names, errors[0])
    assert after == before, sorted(set(after) ^ set(before))
    return errors[0]


@pytest.mark.parametrize("kind", FILE_KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_damaged_config_file(work, command, kind):
    # One representative of each kind of file damage, for every command.
    content = {
        "missing": None,
        "directory": "dir",
        "empty": b"",
        "truncated": _text(TINY)[:40].encode(),
        "non_utf8": _text(TINY).replace("0.003", "0.003\xe9").encode("latin-1"),
        "not_json": b"seed = 1",
        "not_object": b"[1, 2]",
    }[kind]
    path = _place(work / "inputs", content)
    rel = str(path.relative_to(work))
    _invoke(
        work,
        [command, "--config", rel, *COMMAND_ARGS[command]],
        command=command,
        names=[rel],
        usage=kind == "directory",
    )


@SETTINGS
@given(command=st.sampled_from(COMMANDS), damage=damaged_config())
def test_cli_refuses_damaged_configs(work, command, damage):
    kind, content, names = damage
    path = _place(work / "inputs", content)
    rel = str(path.relative_to(work))
    names = [rel if n == "<path>" else n for n in names]
    _invoke(
        work,
        [command, "--config", rel, *COMMAND_ARGS[command]],
        command=command,
        names=names,
        usage=kind == "directory",
    )


OPTION_DAMAGES = [
    # (command, arguments, names, a click usage error)
    ("lora", ["--rank", "0"], ["`0`"], False),
    ("lora", ["--rank", "-1"], ["`-1`"], False),
    ("lora", ["--rank", "65"], ["`65`"], False),  # the tiny preset's width is 64
    ("lora", ["--rank", "1", "--rank", "100"], ["`100`"], False),
    ("lora", ["--rank", "two"], ["'two'"], True),
    ("bench", ["--repetitions", "0"], ["--repetitions"], True),
    ("bench", ["--repetitions", "-3"], ["--repetitions"], True),
    ("bench", ["--repetitions", "many"], ["--repetitions"], True),
    ("bench", ["--out", "a_folder"], ["a_folder"], True),
    ("bench", ["--out", "a_file/bench.json"], ["a_file"], False),
    ("bench", ["--out", "a_file/deeper/bench.json"], ["a_file"], False),
] + [(c, ["--bogus"], ["--bogus"], True) for c in COMMANDS]


@pytest.mark.parametrize(
    "command, args, names, usage",
    OPTION_DAMAGES,
    ids=[" ".join([d[0], *d[1]]) for d in OPTION_DAMAGES],
)
def test_commands_refuse_bad_options(work, command, args, names, usage):
    tiny = str(PROJECT_ROOT / "configs" / "tiny.json")
    _invoke(work, [command, "--config", tiny, *args], command=command, names=names, usage=usage)


def test_every_command_of_the_group_has_cases():
    # Read from the group itself: a new command without cases fails here.
    assert set(main.commands) == set(COMMAND_ARGS)
    assert {c for c, *_ in OPTION_DAMAGES} == set(main.commands)


# ----------------------------------------------------------------------------
# Library: config files and values


@SETTINGS
@given(damage=damaged_config())
def test_load_config_refuses_damaged_files(tmp_path_factory, damage):
    kind, content, names = damage
    path = _place(tmp_path_factory.mktemp("cfg"), content)
    names = [str(path) if n == "<path>" else n for n in names]
    _tried(entry_point="config.load_config")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\n" not in message, message
    assert any(n in message for n in names), (names, message)


@pytest.mark.parametrize(
    "changes, name",
    [
        ({"bogus": 1}, "bogus"),
        ({"batch_size": 0}, "batch_size"),
        ({"learning_rate": math.nan}, "learning_rate"),
        ({"temperature": math.inf}, "temperature"),
        ({"num_layers": 1.5}, "num_layers"),
    ],
)
def test_config_replace_refuses_bad_values(changes, name):
    _tried(entry_point="config.Config.replace")
    with pytest.raises(ConfigError, match=f"`{name}`"):
        Config.tiny().replace(**changes)


# ----------------------------------------------------------------------------
# Library: arrays (the model, the data pipeline, training, the labs)


@pytest.fixture(scope="module")
def small():
    """`(model, corpus, splits)` of the SMALL config (32 examples)."""
    model = build(SMALL, key=jax.random.key(0))
    corpus = generate(SMALL, np.arange(32))
    return model, corpus, {"train": np.arange(16), "heldout": np.arange(16, 32)}


def _with_token(corpus: Corpus, value: int, *, vocab=None) -> Corpus:
    """A copy of `corpus` whose first prompt symbol is `value` in every row."""
    tokens = corpus.tokens.copy()
    tokens[:, 1] = value
    return Corpus(corpus.ids, tokens, corpus.prompt_len, vocab=vocab)


_forward = nnx.jit(lambda model, tokens: model(tokens))


# Defect: a sequence longer than the model's `max_len` gave all-NaN logits.
@pytest.mark.parametrize("length", [MAX_LEN, MAX_LEN + 1])
def test_model_refuses_a_sequence_longer_than_max_len(small, length):
    model, _, _ = small
    tokens = jnp.ones((2, length), jnp.int32)
    _tried(entry_point="model.Transformer")
    if length <= MAX_LEN:
        logits = _forward(model, tokens)
        assert logits.shape == (2, length, VOCAB)
        assert bool(jnp.all(jnp.isfinite(logits)))
        return
    pattern = rf"length `{length}`.*`max_len` `{MAX_LEN}`"
    with pytest.raises(ValueError, match=pattern):
        _forward(model, tokens)  # under jit: refused while tracing (static shapes)
    with pytest.raises(ValueError, match=pattern):
        model(tokens)  # eager


# Defect: out-of-vocabulary ids gave NaN silently.
BOUNDARY = [-1, 0, VOCAB - 1, VOCAB]


def _refused(value: int) -> bool:
    return not 0 <= value < VOCAB


def _oov_pattern(value: int) -> str:
    return rf"`{value}`.*vocabulary of size `{VOCAB}`"


@pytest.mark.parametrize("value", BOUNDARY)
def test_corpus_refuses_out_of_vocabulary_tokens(small, value):
    _, corpus, _ = small
    _tried(entry_point="data.Corpus")
    if _refused(value):
        with pytest.raises(ValueError, match=_oov_pattern(value)):
            _with_token(corpus, value, vocab=VOCAB)
    else:
        assert np.all(_with_token(corpus, value, vocab=VOCAB).tokens[:, 1] == value)


@pytest.mark.parametrize("value", BOUNDARY)
def test_batches_refuse_out_of_vocabulary_tokens(small, value):
    _, corpus, splits = small
    bad = _with_token(corpus, value)
    _tried(entry_point="data.batches")
    run = lambda: batches(  # noqa: E731
        bad, splits["train"], splits["heldout"], 4, jax.random.key(1), 2, vocab=VOCAB
    )
    if _refused(value):
        with pytest.raises(ValueError, match=_oov_pattern(value)):
            run()
    else:
        assert np.all(next(run())["tokens"][:, 1] == value)


@pytest.mark.parametrize("value", BOUNDARY)
def test_fit_refuses_out_of_vocabulary_tokens(small, value):
    model, corpus, splits = small
    bad = _with_token(corpus, value)
    _tried(entry_point="train.fit")

    def run():
        return fit(
            model,
            sft_lab.loss_fn,
            SMALL,
            bad,
            splits["train"],
            splits["heldout"],
            steps=1,
            key=jax.random.key(2),
            objective="sft",
        )

    if _refused(value):
        with pytest.raises(ValueError, match=_oov_pattern(value)):
            run()
    else:
        _, history = run()
        assert len(history["loss"]) == 1 and math.isfinite(history["loss"][0])


@pytest.mark.parametrize("value", BOUNDARY)
def test_model_refuses_out_of_vocabulary_tokens_it_can_see(small, value):
    model, corpus, _ = small
    tokens = jnp.asarray(_with_token(corpus, value).tokens[:2])
    _tried(entry_point="model.Transformer")
    if _refused(value):
        with pytest.raises(ValueError, match=_oov_pattern(value)):
            model(tokens)
    else:
        assert bool(jnp.all(jnp.isfinite(model(tokens))))


@pytest.mark.parametrize("value", [-1, VOCAB])
def test_evaluate_and_parity_refuse_out_of_vocabulary_tokens(small, value):
    model, corpus, splits = small
    bad = _with_token(corpus, value)
    _tried(entry_point="train.evaluate")
    with pytest.raises(ValueError, match=_oov_pattern(value)):
        evaluate(model, bad, splits["heldout"])
    _tried(entry_point="parity.run_parity")
    with pytest.raises(ValueError, match=_oov_pattern(value)):
        parity.run_parity(SMALL, bad.tokens[:2], np.float32, key=jax.random.key(3))


# Defect: empty id sets raised ZeroDivisionError.
def test_empty_id_sets_are_refused(small):
    model, corpus, splits = small
    empty = np.zeros((0,), np.int32)
    _tried(entry_point="data.batches")
    with pytest.raises(ValueError, match="`ids`"):
        batches(corpus, empty, splits["heldout"], 4, jax.random.key(4), 2)
    _tried(entry_point="train.fit")
    with pytest.raises(ValueError, match="`train_ids`"):
        fit(
            model,
            sft_lab.loss_fn,
            SMALL,
            corpus,
            empty,
            splits["heldout"],
            steps=1,
            key=jax.random.key(5),
            objective="sft",
        )
    _tried(entry_point="train.evaluate")
    with pytest.raises(ValueError, match="`ids`"):
        evaluate(model, corpus, empty)


def _cases(small):
    """`(entry point, call, pattern)`: one damaged input each."""
    model, corpus, splits = small
    train, held = splits["train"], splits["heldout"]
    t, n = corpus.tokens, corpus.prompt_len
    key = jax.random.key
    labels = jnp.zeros((4, 6), jnp.int32)
    logits = jnp.zeros((4, 6, VOCAB), jnp.float32)
    mask = jnp.ones((4, 6), bool)
    losses = jnp.ones((4, 6), jnp.float32)
    emb = jnp.ones((4, 8), jnp.float32)
    fit_kw = dict(key=key(6), objective="sft")
    return [
        ("data.generate", lambda: generate(SMALL, np.array([], np.int32)), "`ids`"),
        ("data.generate", lambda: generate(SMALL, np.array([3, -1])), "`-1`"),
        ("data.generate", lambda: generate(SMALL, np.zeros((2, 2), np.int32)), r"`\(2, 2\)`"),
        ("data.generate", lambda: generate(SMALL, np.array([0.5, 1.0])), "`float64`"),
        ("data.generate", lambda: generate(SMALL, np.arange(4), task="copy"), "`copy`"),
        ("data.Corpus", lambda: Corpus(corpus.ids[:3], t, n), "`ids`"),
        ("data.Corpus", lambda: Corpus(corpus.ids, t[:, 0], n), "`tokens`"),
        ("data.Corpus", lambda: Corpus(corpus.ids, t.astype(np.float32), n), "`float32`"),
        ("data.Corpus", lambda: Corpus(corpus.ids[::-1], t, n), "`ids`"),
        ("data.Corpus", lambda: Corpus(corpus.ids, t, np.full_like(n, 6)), "`prompt_len`"),
        ("data.Corpus", lambda: Corpus(corpus.ids, t, np.zeros_like(n)), "`prompt_len`"),
        ("data.Corpus.take", lambda: corpus.take(np.array([0, 999])), "`999`"),
        ("data.batches", lambda: batches(corpus, train, held, 0, key(7), 2), "`batch_size`"),
        ("data.batches", lambda: batches(corpus, train, held, -2, key(8), 2), "`batch_size`"),
        ("data.batches", lambda: batches(corpus, train, held, 4, key(9), 0), "`steps`"),
        ("data.batches", lambda: batches(corpus, train, held, 4, key(10), -1), "`steps`"),
        ("data.batches", lambda: batches(corpus, np.array([1, 99]), held, 4, key(11), 1), "`99`"),
        ("data.batches", lambda: batches(corpus, held[:2], held, 4, key(12), 1), str(held[0])),
        (
            "data.batches",
            lambda: batches(Corpus(corpus.ids, t, n), train, held, 4, key(13), 1),
            "`vocab`",
        ),
        (
            "train.fit",
            lambda: fit(model, sft_lab.loss_fn, SMALL, corpus, train, held, steps=0, **fit_kw),
            "`steps`",
        ),
        (
            "train.fit",
            lambda: fit(model, sft_lab.loss_fn, SMALL, corpus, held, held, steps=1, **fit_kw),
            str(held[0]),
        ),
        ("train.evaluate", lambda: evaluate(model, corpus, np.array([999])), "`999`"),
        ("model.Transformer", lambda: model(jnp.ones((13,), jnp.int32)), r"`\(13,\)`"),
        (
            "model.Transformer",
            lambda: model(
                jnp.ones((1, 4), jnp.int32), positions=jnp.array([[0, 1, 2, 13]], jnp.int32)
            ),
            r"`13`.*`max_len` `13`",
        ),
        (
            "model.Transformer",
            lambda: model(jnp.ones((2, 4), jnp.int32), segment_ids=jnp.ones((2, 3), jnp.int32)),
            r"`segment_ids` has shape `\(2, 3\)`",
        ),
        ("mlm.mlm_loss", lambda: mlm.mlm_loss(logits, labels, mask.astype(jnp.int32)), "`int32`"),
        ("mlm.mlm_loss", lambda: mlm.mlm_loss(logits, labels, mask[:, :1]), r"`\(4, 1\)`"),
        ("sft.sft_loss", lambda: sft_lab.sft_loss(logits, labels, mask[:1]), r"`\(1, 6\)`"),
        ("sft.pack", lambda: sft_lab.pack(t, n[:3], 26), "`prompt_len`"),
        ("sft.pack", lambda: sft_lab.pack(t[0], n, 26), "`tokens`"),
        ("sft.pack", lambda: sft_lab.pack(t, n, 0), "`length`"),
        ("contrastive.info_nce", lambda: contrastive.info_nce(emb, emb[:3], 0.1), r"`\(3, 8\)`"),
        ("contrastive.info_nce", lambda: contrastive.info_nce(emb, emb, 0.0), "`temperature`"),
        ("contrastive.info_nce", lambda: contrastive.info_nce(emb, emb, math.nan), "`temperature`"),
        ("lora.adapted_model", lambda: lora.adapted_model(SMALL, model, 0, key=key(14)), "`0`"),
        ("lora.adapted_model", lambda: lora.adapted_model(SMALL, model, 9, key=key(15)), "`9`"),
        (
            "dpo.make_pairs",
            lambda: dpo.make_pairs(_with_token(corpus, VOCAB).tokens, n, 16, key(16)),
            _oov_pattern(VOCAB),
        ),
        (
            "dpo.make_pairs",
            lambda: dpo.make_pairs(t, np.zeros_like(n), 16, key(17)),
            "`prompt_len`",
        ),
        ("dpo.make_pairs", lambda: dpo.make_pairs(t, n[:3], 16, key(18)), "`prompt_len`"),
        (
            "dpo.check_pairs",
            lambda: dpo.check_pairs(dpo.Pairs(t[:2], t[2:4], n[:2])),
            "pair `0`",
        ),
        (
            "reductions.per_token_mean",
            lambda: reductions.per_token_mean(losses, mask[:, :1]),
            r"`\(4, 1\)`",
        ),
        (
            "reductions.per_sequence_mean",
            lambda: reductions.per_sequence_mean(losses, mask.astype(jnp.float32)),
            "`float32`",
        ),
        ("heldout.audit", lambda: heldout.audit(Ledger(), corpus, corpus, n=0), "`n`"),
        ("heldout.audit", lambda: heldout.audit(Ledger(), corpus, corpus, n=-2), "`n`"),
        (
            "parity.run_parity",
            lambda: parity.run_parity(SMALL, np.ones((2, 14), np.int32), np.float32, key=key(19)),
            r"`14`.*`max_len` `13`",
        ),
    ]


def test_library_entry_points_refuse_damaged_arrays(small):
    for entry_point, call, pattern in _cases(small):
        _tried(entry_point=entry_point)
        with pytest.raises(ValueError, match=pattern):
            call()


# ----------------------------------------------------------------------------
# Library: checkpoints


@pytest.fixture(scope="module")
def saved(small, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    checkpoint.save(root / "good", small[0])
    return root


def _damage_checkpoint(root: Path, kind: str) -> Path:
    path = root / kind
    if kind == "missing":
        return path
    if kind == "a_file":
        path.write_text("{}\n", encoding="utf-8")
        return path
    if kind == "empty":
        path.mkdir()
        return path
    if kind == "junk":
        path.mkdir()
        (path / "params.bin").write_bytes(b"\xff\x00" * 8)
        return path
    shutil.copytree(root / "good", path)
    if kind == "metadata_not_json":
        (path / "_METADATA").write_bytes(b"{\xff")
    elif kind == "metadata_truncated":
        text = (path / "_METADATA").read_bytes()
        (path / "_METADATA").write_bytes(text[: len(text) // 2])
    elif kind == "arrays_removed":
        shutil.rmtree(path / "ocdbt.process_0")
        shutil.rmtree(path / "d", ignore_errors=True)
        (path / "manifest.ocdbt").unlink(missing_ok=True)
    return path


CHECKPOINT_DAMAGES = [
    "missing",
    "a_file",
    "empty",
    "junk",
    "metadata_not_json",
    "metadata_truncated",
    "arrays_removed",
]


def test_restore_refuses_damaged_checkpoints(small, saved):
    model = small[0]
    for kind in CHECKPOINT_DAMAGES:
        path = _damage_checkpoint(saved, kind)
        _tried(entry_point="checkpoint.restore")
        with pytest.raises(checkpoint.CheckpointError) as err:
            checkpoint.restore(path, model)
        assert isinstance(err.value, ValueError)
        assert str(path.absolute()) in str(err.value), (kind, str(err.value))
        assert "\n" not in str(err.value), (kind, str(err.value))


def test_restore_refuses_a_checkpoint_of_another_architecture(saved):
    # Shapes only (no arrays): the refusal must come before any array is read.
    wider = nnx.eval_shape(lambda: Transformer(VOCAB, MAX_LEN, 16, 1, 1, rngs=nnx.Rngs(20)))
    _tried(entry_point="checkpoint.restore")
    with pytest.raises(checkpoint.CheckpointError, match=r"`\(16,\)`.*`\(8,\)`"):
        checkpoint.restore(saved / "good", wider)
