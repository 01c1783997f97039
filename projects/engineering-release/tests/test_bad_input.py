"""Bad input, for every command of the CLI and every library entry point a learner
calls with a file, an array or a config.

The promise: a damaged input (a missing, empty, truncated, non-UTF-8 or non-JSON
file, JSON of the wrong type, a missing or unknown field, a field of the wrong
type, NaN or infinity, a size or range out of bounds, an id that names nothing)
is refused by the CLI with exit code 2 (bad input) or 1 (a refusal), one
`Error:` line naming the file, field or value, no traceback, and nothing
written (the state folder's file names and bytes are compared before and
after); the library raises a `ValueError` (or the package's subclass of it)
whose message names the field or value.

The cases are drawn by hypothesis (the damage kind, the field, the value;
derandomized, no database) over one copy of the session's released state
(approve A, approve B, release A), which every case must leave as it found
it. The module writes `evidence/bad_input.json` (the count of damaged inputs
tried, tracebacks seen, the commands and entry points covered), and its last
test checks that every command of the click group has cases.
"""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engineering_release import checkpoint, data, evaluation, ledger, model, release, signing
from engineering_release.cli import main
from engineering_release.config import canonical_json, load_policy, load_train_config, shown
from engineering_release.store import Store, StoreError, tree_digest

PROJECT = Path(__file__).resolve().parents[1]
TINY = json.loads((PROJECT / "configs" / "tiny.json").read_text())
POLICY = json.loads((PROJECT / "configs" / "policy.json").read_text())
NAN, INF = float("nan"), float("inf")


def cases(n: int):
    return settings(max_examples=n, derandomize=True, deadline=None, database=None)


TALLY: dict = {"cases": 0, "tracebacks": 0, "commands": set(), "entry_points": set()}


@pytest.fixture(scope="module", autouse=True)
def _evidence():
    yield
    out = Path(os.environ.get("EVIDENCE_DIR", PROJECT / "evidence"))
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "cases": TALLY["cases"],
        "tracebacks": TALLY["tracebacks"],
        "commands": sorted(TALLY["commands"]),
        "entry_points": sorted(TALLY["entry_points"]),
    }
    (out / "bad_input.json").write_text(json.dumps(record, indent=1) + "\n")


@dataclass
class World:
    root: Path  # the release state: approve A, approve B, release A
    inputs: Path  # damaged input files are written here, outside the state
    models: dict
    evaluations: dict
    release_a: str  # the hash of the release entry
    pem: Path

    def run(self, *args: str) -> list[str]:
        return ["--root", str(self.root), *args]


@pytest.fixture(scope="module")
def world(released_template, tmp_path_factory):
    template, models, evaluations = released_template
    base = tmp_path_factory.mktemp("bad-input")
    root = base / "release"
    shutil.copytree(template, root)
    (base / "inputs").mkdir()
    result = CliRunner().invoke(main, ["--root", str(root), "verify"])
    assert result.exit_code == 0, result.output  # A sound state to damage.
    entries = ledger.read(root / "ledger.jsonl")
    assert [e["kind"] for e in entries] == ["approve", "approve", "release"]
    return World(
        root, base / "inputs", models, evaluations, entries[2]["hash"], root / "keys/approver.pem"
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in sorted(folder.rglob("*"))
    }


def refused(args: list[str], names: list[str], *, folder: Path, command: str, codes=(1, 2)):
    """Runs the CLI on `args` and checks the promise; returns the output."""
    before = snapshot(folder)
    result = CliRunner().invoke(main, args)
    after = snapshot(folder)
    out = result.output
    crashed = "Traceback" in out or not (
        result.exception is None or isinstance(result.exception, SystemExit)
    )
    TALLY["cases"] += 1
    TALLY["tracebacks"] += int(crashed)
    TALLY["commands"].add(command)
    assert not crashed, (repr(result.exception), out[-2000:])
    assert result.exit_code in codes, (result.exit_code, out[-2000:])
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out[-2000:]
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert any(n in line for n in names for line in errors + problems), (names, out[-2000:])
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"written by a refused command: {changed}"
    return out


def raises(entry_point: str, call, names: list[str], error=ValueError) -> str:
    TALLY["cases"] += 1
    TALLY["entry_points"].add(entry_point)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert any(n in message for n in names), (names, message)
    return message


# DAMAGED FILES ---------------------------------------------------------------

GENERIC = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "non-json",
    "json-list",
    "json-number",
    "json-string",
    "json-null",
]
WRONG_TYPE = st.sampled_from(["3", [], {}, None, True])


def generic_bytes(kind: str, valid: bytes) -> bytes | None:
    return {
        "missing": None,
        "empty": b"",
        "truncated": valid[: len(valid) // 2],
        "non-utf8": b"\xff\xfe" + valid,
        "non-json": b"{this is not JSON\n",
        "json-list": b"[1, 2]\n",
        "json-number": b"42\n",
        "json-string": b'"text"\n',
        "json-null": b"null\n",
    }[kind]


def put(path: Path, content: bytes | None) -> None:
    if content is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(content)


def ints_outside(lo: int, hi: int):
    return st.one_of(st.integers(max_value=lo - 1), st.integers(min_value=hi + 1))


def floats_outside(lo: float, hi: float):
    """Floats at or beyond the bounds of an open or closed range, NaN and infinities."""
    return st.one_of(
        st.floats(max_value=lo, exclude_max=False, allow_nan=False),
        st.floats(min_value=hi, exclude_min=True, allow_nan=False),
        st.sampled_from([NAN, INF, -INF]),
    )


TRAIN_BAD = {
    "seed": st.one_of(ints_outside(0, 2**32 - 1), WRONG_TYPE, st.just(1.5)),
    "split_seed": st.one_of(ints_outside(0, 2**32 - 1), WRONG_TYPE),
    "test_fraction": st.one_of(floats_outside(0.0, 0.5), st.just(0.5), WRONG_TYPE),
    "hidden_size": st.one_of(ints_outside(1, 1024), WRONG_TYPE, st.just(32.5)),
    "learning_rate": st.one_of(floats_outside(0.0, 1.0), WRONG_TYPE),
    "batch_size": st.one_of(ints_outside(1, 1024), WRONG_TYPE),
    "num_epochs": st.one_of(ints_outside(1, 1000), WRONG_TYPE),
    "golden_count": st.one_of(ints_outside(1, 256), WRONG_TYPE),
}
POLICY_BAD = {
    "name": st.one_of(st.just(""), st.text(min_size=101, max_size=110), st.sampled_from([5, None])),
    "split_seed": st.one_of(ints_outside(0, 2**32 - 1), WRONG_TYPE),
    "test_fraction": st.one_of(floats_outside(0.0, 0.5), st.just(0.5)),
    "min_accuracy": st.one_of(floats_outside(-1e-9, 1.0), WRONG_TYPE),
    "min_class_recall": st.one_of(floats_outside(-1e-9, 1.0), WRONG_TYPE),
    "approval_valid_days": st.one_of(floats_outside(0.0, 3650.0), WRONG_TYPE),
}


def config_damages(bad: dict):
    """`(kind, field, value)`: a generic damage of the file, a bad value of one
    field, or an unknown field."""
    return st.one_of(
        st.sampled_from(GENERIC).map(lambda k: ("generic", k, None)),
        st.sampled_from(sorted(bad)).flatmap(lambda f: bad[f].map(lambda v: ("field", f, v))),
        st.sampled_from(["bogus", "hidden", "seeds"]).map(lambda f: ("unknown", f, 1)),
    )


def write_config(damage, valid: dict, path: Path) -> list[str]:
    """Writes the damaged config to `path`; returns what the message must name."""
    kind, field, value = damage
    if kind == "generic":
        put(path, generic_bytes(field, json.dumps(valid, indent=1).encode()))
        return [path.name]
    path.write_text(json.dumps({**valid, field: value}))
    return [f"`{field}`"]


@cases(40)
@given(damage=config_damages(TRAIN_BAD))
def test_register_and_load_train_config_refuse_a_damaged_config(world, damage):
    path = world.inputs / "train.json"
    names = write_config(damage, TINY, path)
    raises("config.load_train_config", lambda: load_train_config(path), names)
    args = world.run("register", "--config", str(path))
    refused(args, names, folder=world.root, command="register", codes=(2,))


@cases(30)
@given(damage=config_damages(POLICY_BAD))
def test_set_policy_and_load_policy_refuse_a_damaged_policy(world, damage):
    path = world.inputs / "policy.json"
    names = write_config(damage, POLICY, path)
    raises("config.load_policy", lambda: load_policy(path), names)
    args = world.run("set-policy", str(path))
    refused(args, names, folder=world.root, command="set-policy", codes=(2,))


def test_a_policy_that_fails_its_own_check_is_refused(world):
    path = world.inputs / "policy.json"
    path.write_text(json.dumps({**POLICY, "min_accuracy": 0.5, "min_class_recall": 0.9}))
    names = ["`min_class_recall`"]
    raises("config.load_policy", lambda: load_policy(path), names)
    refused(world.run("set-policy", str(path)), names, folder=world.root, command="set-policy")
    refused(
        world.run("set-policy", str(world.inputs)),
        ["is a directory"],
        folder=world.root,
        command="set-policy",
    )


# DAMAGED STATE FILES ---------------------------------------------------------


def _ledger_lines(world) -> list[dict]:
    return [json.loads(line) for line in (world.root / "ledger.jsonl").read_text().splitlines()]


def _dump(entries: list) -> bytes:
    return "".join(
        (e if isinstance(e, str) else json.dumps(e, sort_keys=True)) + "\n" for e in entries
    ).encode()


def _edited(entries: list[dict], line: int, path: tuple, value) -> list:
    out = json.loads(json.dumps(entries))
    target = out[line]
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


LEDGER_SHAPE = [
    # (label, line index, path into the entry, new value; KeyError deletes)
    ("no seq", 1, ("seq",), KeyError),
    ("no kind", 1, ("kind",), KeyError),
    ("no prev", 1, ("prev",), KeyError),
    ("no body", 1, ("body",), KeyError),
    ("no hash", 1, ("hash",), KeyError),
    ("unknown field", 1, ("extra",), 1),
    ("seq as text", 1, ("seq",), "1"),
    ("negative seq", 1, ("seq",), -1),
    ("unknown kind", 1, ("kind",), "bogus"),
    ("prev a number", 1, ("prev",), 5),
    ("body a list", 1, ("body",), []),
    ("approval a number", 1, ("body", "approval"), 5),
    ("signature a number", 1, ("body", "approval", "signature"), 5),
    ("policy a list", 1, ("body", "approval", "policy"), []),
    ("release model a number", 2, ("body", "model_id"), 5),
    ("previous model a number", 2, ("body", "previous_model_id"), 5),
    ("NaN in a policy", 1, ("body", "approval", "policy", "min_accuracy"), NAN),
]


def ledger_damage(world, label: str) -> tuple[bytes | None, list[str]]:
    """The damaged log's bytes (None: deleted) and what a message must name."""
    entries = _ledger_lines(world)
    raw = _dump(entries)
    lines = raw.split(b"\n")
    name = ["ledger.jsonl"]
    if label == "truncated":
        cut = len(lines[0]) + 1 + len(lines[1]) // 2  # Inside the second line.
        return raw[:cut], name
    if label == "non-utf8":
        return lines[0] + b"\n" + lines[1][:40] + b"\xff\xfe" + lines[1][40:] + b"\n", name
    if label in ("non-json", "json-list", "json-number", "json-null"):
        line = generic_bytes(label, b"").strip().decode()
        return _dump([entries[0], line, entries[2]]), name
    if label == "missing":
        return None, ["anchored 3 log entries, but the log holds 0"]
    if label == "empty":
        return b"", ["anchored 3 log entries, but the log holds 0"]
    if label == "seq out of range":
        return _dump(_edited(entries, 1, ("seq",), 99)), ["Entry 1 has seq `99`"]
    if label == "edited body":
        edited = _edited(entries, 2, ("body", "model_id"), world.models[1])
        return _dump(edited), ["Entry 2 (release) was edited"]
    for shape_label, line, path, value in LEDGER_SHAPE:
        if shape_label == label:
            return _dump(_edited(entries, line, path, value)), name
    raise KeyError(label)


LEDGER_READ = ["truncated", "non-utf8", "non-json", "json-list", "json-number", "json-null"]
LEDGER_READ += [label for label, *_ in LEDGER_SHAPE]
LEDGER_RECORD = ["missing", "empty", "seq out of range", "edited body"]


def registry_damage(world, label: str) -> tuple[bytes, list[str]]:
    raw = (world.root / "registry.db").read_bytes()
    content = {
        "garbage": b"this is not a database\n" * 200,
        "non-utf8": b"\xff\xfe\x00\x01" * 1024,
        "truncated": raw[: len(raw) // 2],
        "empty": b"",
    }[label]
    return content, ["registry.db"]


def policy_damage(world, damage) -> tuple[bytes, list[str]]:
    scratch = world.inputs / "state-policy.json"
    names = write_config(damage, POLICY, scratch)
    return scratch.read_bytes(), (names if damage[0] != "generic" else ["policy.json"])


KEYRING_DAMAGE = [
    "missing",
    "empty",
    "truncated",
    "non-utf8",
    "non-json",
    "json-list",
    "json-null",
    "entry a list",
    "entry without public_key",
    "entry with an unknown field",
    "public_key a number",
    "public_key not base64",
    "public_key too short",
    "not_after not a time",
]


def keyring_damage(world, label: str) -> tuple[bytes | None, list[str]]:
    raw = (world.root / "keys" / "trusted.json").read_bytes()
    ring = json.loads(raw)
    kid = sorted(ring)[0]
    names = ["trusted.json"]
    if label in GENERIC:
        if label == "missing":
            names = ["not in the trusted keyring"]
        return generic_bytes(label, raw), names
    entry = dict(ring[kid])
    if label == "entry a list":
        entry = [1]
    elif label == "entry without public_key":
        del entry["public_key"]
    elif label == "entry with an unknown field":
        entry["comment"] = "x"
    elif label == "public_key a number":
        entry["public_key"] = 5
    elif label == "public_key not base64":
        entry["public_key"] = "@@not base64@@"
    elif label == "public_key too short":
        entry["public_key"] = "AAAA"
    elif label == "not_after not a time":
        entry["not_after"] = "next year"
    return json.dumps({**ring, kid: entry}).encode(), names


def valid_args(world, command: str) -> list[str]:
    m, e = world.models, world.evaluations
    return {
        "register": ["register", "--config", str(PROJECT / "configs" / "tiny.json")],
        "evaluate": ["evaluate", m[1]],
        "approve": ["approve", m[1], e[1], "--key", str(world.pem)],
        "release": ["release", m[1]],
        "rollback": ["rollback", "--to", world.release_a[:12]],
        "status": ["status"],
        "verify": ["verify"],
        "set-policy": ["set-policy", str(PROJECT / "configs" / "policy.json")],
        "keygen": ["keygen", "fresh-key"],
    }[command]


# Which state files each command reads before it writes, and which damages it refuses:
# every command refuses a log it cannot read; those that rely on the record (that it
# verifies against the registry's anchor) also refuse a log that lost or changed entries.
READS = {
    "register": {"ledger.jsonl": LEDGER_READ, "registry.db": None},
    "evaluate": {"ledger.jsonl": LEDGER_READ, "registry.db": None, "policy.json": None},
    "approve": {
        "ledger.jsonl": LEDGER_READ + LEDGER_RECORD,
        "registry.db": None,
        "policy.json": None,
        "keys/trusted.json": KEYRING_DAMAGE,
    },
    "release": {
        "ledger.jsonl": LEDGER_READ + LEDGER_RECORD,
        "registry.db": None,
        "policy.json": None,
        "keys/trusted.json": KEYRING_DAMAGE,
    },
    "rollback": {"ledger.jsonl": LEDGER_READ, "registry.db": None},
    "status": {"ledger.jsonl": LEDGER_READ + LEDGER_RECORD, "registry.db": None},
    "verify": {
        "ledger.jsonl": LEDGER_READ + LEDGER_RECORD,
        "registry.db": None,
        "policy.json": None,
        "keys/trusted.json": KEYRING_DAMAGE,
    },
    "set-policy": {"ledger.jsonl": LEDGER_READ, "registry.db": None},
    "keygen": {"keys/trusted.json": [k for k in KEYRING_DAMAGE if k != "missing"]},
}


def damage_of(command: str, file: str):
    labels = READS[command][file]
    if file == "registry.db":
        return st.sampled_from(["garbage", "non-utf8", "truncated", "empty"])
    if file == "policy.json":
        return config_damages(POLICY_BAD).filter(lambda d: d[1] != "missing")
    return st.sampled_from(labels)


state_damages = st.sampled_from(sorted(READS)).flatmap(
    lambda c: st.sampled_from(sorted(READS[c])).flatmap(
        lambda f: st.tuples(st.just(c), st.just(f), damage_of(c, f))
    )
)


@cases(90)
@given(case=state_damages)
def test_every_command_refuses_damaged_state_files(world, case):
    command, file, damage = case
    target = world.root / file
    original = target.read_bytes() if target.exists() else None
    content, names = {
        "ledger.jsonl": ledger_damage,
        "registry.db": registry_damage,
        "policy.json": policy_damage,
        "keys/trusted.json": keyring_damage,
    }[file](world, damage)
    put(target, content)
    try:
        refused(world.run(*valid_args(world, command)), names, folder=world.root, command=command)
    finally:
        put(target, original)


@cases(25)
@given(label=st.sampled_from(LEDGER_READ))
def test_ledger_read_refuses_a_damaged_log(world, label):
    content, _ = ledger_damage(world, label)
    path = world.inputs / "ledger.jsonl"
    put(path, content)
    raises("ledger.read", lambda: ledger.read(path), ["Line 2 of the log", "Line 3 of the log"])


@cases(15)
@given(label=st.sampled_from([k for k in KEYRING_DAMAGE if k != "missing"]))
def test_read_keyring_refuses_a_damaged_keyring(world, label):
    content, _ = keyring_damage(world, label)
    keys = world.inputs / "keys"
    keys.mkdir(exist_ok=True)
    put(keys / "trusted.json", content)
    raises("signing.read_keyring", lambda: signing.read_keyring(keys), ["trusted.json"])


# IDS AND OPTIONS ---------------------------------------------------------------

BAD_IDS = st.one_of(
    st.sampled_from(
        [
            "",
            "   ",
            "not-an-id",
            "1234567",
            "0" * 8,
            "f" * 64,
            "F" * 65,
            "../" * 22,
            "a\nb",
            "é" * 9,
        ]
    ),
    st.text(alphabet="0123456789abcdefg-/ \n\t", max_size=70),
)


def _names_an_id(world, value: str) -> bool:
    text = value.strip().lower()
    ids = [*world.models.values(), *world.evaluations.values()]
    return len(text) >= 8 and any(i.startswith(text) for i in ids)


@cases(40)
@given(
    value=BAD_IDS,
    where=st.sampled_from(["evaluate", "approve-model", "approve-eval", "release", "rollback"]),
)
def test_ids_that_name_nothing_are_refused(world, value, where):
    assume(not _names_an_id(world, value))
    m, e = world.models, world.evaluations
    key = ["--key", str(world.pem)]
    args = {  # After `--`, a value that starts with `-` is an argument too.
        "evaluate": ["evaluate", "--", value],
        "approve-model": ["approve", *key, "--", value, e[0]],
        "approve-eval": ["approve", *key, "--", m[0], value],
        "release": ["release", "--", value],
        "rollback": ["rollback", f"--to={value}"],
    }[where]
    refused(world.run(*args), [f"`{shown(value)}`"], folder=world.root, command=args[0])


def test_ids_of_the_wrong_object_or_state_are_refused(world):
    m, e, pem = world.models, world.evaluations, str(world.pem)
    for args, names in [
        (["evaluate", e[0]], [f"`{e[0][:12]}` is in the store but not registered"]),
        (["approve", m[1], e[0], "--key", pem], ["judged model"]),
        (["approve", m[1], e[0]], ["judged model"]),  # No default key is created either.
        (["approve", e[0], m[0], "--key", pem], [f"`{m[0][:12]}` is not an evaluation report"]),
        (["release", e[0]], ["No approval of this model"]),
        (["release", m[0]], ["already the serving release"]),
        (["rollback"], ["there is no previous release"]),
        (["rollback", "--to", world.release_a], ["the one serving now"]),
    ]:
        refused(world.run(*args), names, folder=world.root, command=args[0], codes=(1,))


def _pem_damage(world, label: str) -> tuple[Path, list[str]]:
    path = world.inputs / f"key-{label.replace(' ', '-')}.pem"
    valid = world.pem.read_bytes()
    if label == "missing":
        path.unlink(missing_ok=True)
        return path, ["No key file"]
    if label == "a directory":
        return world.inputs, ["is a directory"]
    if label == "EC P-256 key":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.derive_private_key(12345, ec.SECP256R1())
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path, ["is not an Ed25519 private key"]
    content = {
        "empty": b"",
        "truncated": valid[: len(valid) // 2],
        "non-utf8": b"\xff\xfe" + valid,
        "not PEM": b"hello\n",
        "body edited": valid.replace(valid[40:44], b"!!!!"),
    }[label]
    path.write_bytes(content)
    return path, [path.name]


PEM_DAMAGE = ["missing", "a directory", "EC P-256 key", "empty", "truncated", "non-utf8", "not PEM"]
PEM_DAMAGE.append("body edited")


@cases(16)
@given(label=st.sampled_from(PEM_DAMAGE))
def test_approve_and_load_private_refuse_a_damaged_key(world, label):
    path, names = _pem_damage(world, label)
    m, e = world.models, world.evaluations
    args = world.run("approve", m[1], e[1], "--key", str(path))
    refused(args, names + ["--key"], folder=world.root, command="approve")
    if label not in ("missing", "a directory"):
        raises(
            "signing.load_private",
            lambda: signing.load_private(path),
            names,
            signing.SignatureRefused,
        )


def test_approve_with_an_untrusted_key_is_refused(world, tmp_path):
    _, foreign = signing.generate_key(tmp_path / "keys", "mallory", trust=False)
    args = world.run("approve", world.models[1], world.evaluations[1], "--key", str(foreign))
    refused(args, ["not in the trusted keyring"], folder=world.root, command="approve", codes=(1,))


def _bad_floats(lo: float, hi: float):
    return st.one_of(
        st.floats(max_value=lo, exclude_max=True, allow_nan=False).map(repr),
        st.floats(min_value=hi, exclude_min=True, allow_nan=False).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "NaN", "ten", ""]),
    )


def _bad_ints(lo: int, hi: int):
    return st.one_of(ints_outside(lo, hi).map(str), st.sampled_from(["1.5", "x", "", "1e3", "nan"]))


OPTIONS = {
    ("register", "--seed"): _bad_ints(0, 2**32 - 1),
    ("keygen", "--valid-days"): _bad_floats(0.0, 36_500.0),
    ("release", "--timeout"): _bad_floats(0.1, 3600.0),
    ("rollback", "--timeout"): _bad_floats(0.1, 3600.0),
    ("serve", "--port"): _bad_ints(0, 65535),
    ("bench", "--switches"): _bad_ints(2, 100),
    ("bench", "--clients"): _bad_ints(1, 32),
    ("bench", "--verify-entries"): _bad_ints(2, 10_000),
}


@cases(45)
@given(case=st.sampled_from(sorted(OPTIONS)).flatmap(lambda k: st.tuples(st.just(k), OPTIONS[k])))
def test_option_values_out_of_range_are_refused(world, case):
    (command, option), value = case
    positional = {
        "register": ["--config", str(PROJECT / "configs" / "tiny.json")],
        "keygen": ["fresh-key"],
        "release": [world.models[1]],
        "rollback": [],
        "serve": [],
        "bench": ["--out", str(world.inputs / "bench.json")],
    }[command]
    args = world.run(command, *positional, f"{option}={value}")
    refused(args, [option], folder=world.root, command=command, codes=(2,))


def test_keygen_valid_days_zero_is_refused(world):
    args = world.run("keygen", "fresh-key", "--valid-days", "0")
    refused(args, ["--valid-days"], folder=world.root, command="keygen", codes=(2,))


@cases(20)
@given(
    name=st.one_of(
        st.sampled_from(["", "a/b", "a.b", "../x", "é", "key name", "a\nb", "-", "_-_"]),
        st.text(max_size=12).filter(
            lambda s: not (s and s.replace("-", "").replace("_", "").isalnum() and s.isascii())
        ),
    )
)
def test_keygen_refuses_bad_names(world, name):
    assume(not name.startswith("-") or name == "-")
    args = world.run("keygen", name)
    refused(args, ["Key name"], folder=world.root, command="keygen", codes=(2,))
    if name:
        raises(
            "signing.generate_key",
            lambda: signing.generate_key(world.inputs / "keys", name),
            ["Key name"],
            signing.SignatureRefused,
        )


def test_keygen_refuses_an_existing_name_and_bad_validity(world):
    refused(
        world.run("keygen", "approver"), ["already exists"], folder=world.root, command="keygen"
    )
    for days in (NAN, INF, 0.0, -1.0, 1e9):
        raises(
            "signing.generate_key",
            lambda d=days: signing.generate_key(world.inputs / "keys", "k", valid_days=d),
            ["valid_days"],
            signing.SignatureRefused,
        )


def test_unknown_options_and_bad_roots_are_refused(world):
    afile = world.inputs / "a-file"
    afile.write_text("not a directory\n")
    for command in ("status", "verify"):
        args = world.run(command, "--bogus")
        refused(args, ["--bogus"], folder=world.root, command=command, codes=(2,))
        refused(["--root", str(afile), command], ["a-file"], folder=world.inputs, command=command)
        refused(
            ["--root", str(afile / "sub"), command],
            ["a-file"],
            folder=world.inputs,
            command=command,
        )
    for args in (["serve"], ["keygen", "fresh-key"]):
        refused(
            ["--root", str(afile / "sub"), *args], ["a-file"], folder=world.inputs, command=args[0]
        )


def test_bench_refuses_an_unusable_out_before_it_runs(world):
    afile = world.inputs / "a-file"
    afile.write_text("not a directory\n")
    for out, names in [
        (world.inputs / "bench.txt", ["bench.txt"]),
        (world.inputs / "bench.png", ["bench.png"]),
        (afile / "bench.json", ["a-file"]),
        (world.inputs, ["is a directory"]),
    ]:
        refused(["bench", "--out", str(out)], names, folder=world.inputs, command="bench")


# LIBRARY ENTRY POINTS WITH ARRAYS, REPORTS AND APPROVALS -------------------------


class_ids = st.integers(0, 9)


@cases(30)
@given(
    damage=st.sampled_from(
        [
            "empty",
            "float dtype",
            "2-D",
            "length mismatch",
            "id too big",
            "negative id",
            "absent class",
        ]
    ),
    n=st.integers(10, 40),
    seed=st.integers(0, 2**16),
)
def test_metrics_from_predictions_refuses_bad_arrays(damage, n, seed):
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(10), rng.integers(0, 10, n - 10)])
    predictions = rng.integers(0, 10, n)
    names = ["`predictions`"]
    if damage == "empty":
        predictions, labels = predictions[:0], labels[:0]
    elif damage == "float dtype":
        predictions = predictions.astype(np.float32)
    elif damage == "2-D":
        predictions = predictions.reshape(1, -1)
    elif damage == "length mismatch":
        predictions = predictions[:-1]
    elif damage == "id too big":
        predictions[seed % n] = 10 + seed % 5
    elif damage == "negative id":
        predictions[seed % n] = -1 - seed % 5
    elif damage == "absent class":
        labels = np.where(labels == seed % 10, (seed + 1) % 10, labels)
        names = ["`labels`"]
    raises(
        "evaluation.metrics_from_predictions",
        lambda: evaluation.metrics_from_predictions(predictions, labels),
        names,
    )


def _report(world) -> dict:
    store = Store(world.root / "store")
    return evaluation.load_report(store, world.evaluations[0])


REPORT_DAMAGE = {
    "not an object": lambda r: [r],
    "no model_id": lambda r: {k: v for k, v in r.items() if k != "model_id"},
    "no predictions": lambda r: {k: v for k, v in r.items() if k != "predictions"},
    "no metrics": lambda r: {k: v for k, v in r.items() if k != "metrics"},
    "data a list": lambda r: {**r, "data": []},
    "metrics a list": lambda r: {**r, "metrics": [1]},
    "predictions text": lambda r: {**r, "predictions": "0123"},
    "prediction a float": lambda r: {**r, "predictions": [0.5, *r["predictions"][1:]]},
    "prediction NaN": lambda r: {**r, "predictions": [NAN, *r["predictions"][1:]]},
    "prediction out of range": lambda r: {**r, "predictions": [12, *r["predictions"][1:]]},
    "ids with text": lambda r: {**r, "ids": ["0", *r["ids"][1:]]},
    "accuracy NaN": lambda r: {**r, "metrics": {**r["metrics"], "accuracy": NAN}},
    "no predictions at all": lambda r: {**r, "predictions": [], "ids": []},
}
REPORT_NAMES = {
    "not an object": ["JSON object"],
    "no model_id": ["`model_id`"],
    "no predictions": ["`predictions`"],
    "no metrics": ["`metrics`"],
    "data a list": ["`data`"],
    "metrics a list": ["`metrics`"],
    "predictions text": ["`predictions`"],
    "prediction a float": ["`predictions`"],
    "prediction NaN": ["`predictions`"],
    "prediction out of range": ["`predictions`"],
    "ids with text": ["`ids`"],
    "accuracy NaN": ["`accuracy`"],
    "no predictions at all": ["sample IDs"],
}


@cases(20)
@given(label=st.sampled_from(sorted(REPORT_DAMAGE)))
def test_verify_report_refuses_a_malformed_report(world, label):
    from engineering_release.config import Policy

    damaged = REPORT_DAMAGE[label](_report(world))
    raises(
        "evaluation.verify_report",
        lambda: evaluation.verify_report(damaged, model_id=world.models[0], policy=Policy()),
        REPORT_NAMES[label],
        evaluation.EvaluationMismatch,
    )


def _approval(world) -> dict:
    return ledger.read(world.root / "ledger.jsonl")[0]["body"]["approval"]


APPROVAL_FIELDS = ["model_id", "evaluation_id", "policy_sha256", "key_id", "signer", "signed_at"]
APPROVAL_FIELDS += ["signature", "policy"]


@cases(30)
@given(
    field=st.sampled_from(APPROVAL_FIELDS),
    how=st.sampled_from(["missing", "a number", "a list", "null"]),
)
def test_verify_approval_refuses_missing_and_mistyped_fields(world, field, how):
    approval = dict(_approval(world))
    if how == "missing":
        del approval[field]
    else:
        approval[field] = {"a number": 5, "a list": [], "null": None}[how]
    ring = signing.read_keyring(world.root / "keys")
    raises(
        "signing.verify_approval",
        lambda: signing.verify_approval(approval, ring),
        [f"`{field}`"],
        signing.SignatureRefused,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("signed_at", "yesterday"),
        ("signed_at", "2024-13-01T00:00:00Z"),
        ("signature", "@@@not base64@@@"),
        ("policy", {"min_accuracy": NAN}),
    ],
)
def test_verify_approval_refuses_malformed_values(world, field, value):
    approval = {**_approval(world), field: value}
    ring = signing.read_keyring(world.root / "keys")
    raises(
        "signing.verify_approval",
        lambda: signing.verify_approval(approval, ring),
        [f"`{field}`"],
        signing.SignatureRefused,
    )


@cases(20)
@given(
    seed=st.one_of(ints_outside(0, 2**32 - 1), st.sampled_from([1.5, "0", None, True])),
    fraction=st.one_of(floats_outside(0.0, 0.5), st.just(0.5), st.sampled_from(["0.2", None])),
    which=st.sampled_from(["seed", "fraction"]),
)
def test_data_splits_refuse_bad_arguments(seed, fraction, which):
    if which == "seed":
        call, names = (lambda: data.heldout_set(seed, 0.2)), ["`split_seed`"]
    else:
        call, names = (lambda: data.heldout_set(0, fraction)), ["`test_fraction`"]
    raises("data.heldout_set", call, names)


@cases(25)
@given(
    damage=st.sampled_from(
        ["x NaN", "x inf", "x 1-D", "x empty", "x 63 features", "x text", "no head/bias"]
        + ["hidden/kernel 3-D", "head/kernel NaN", "head/bias too long"]
    ),
    row=st.integers(0, 15),
)
def test_forward_numpy_refuses_bad_arrays_and_parameters(world, damage, row):
    artifact = checkpoint.read_artifact(Store(world.root / "store").get(world.models[0]))
    params = dict(artifact.params)
    x = artifact.golden_inputs.astype(np.float64)
    names = ["`x`"]
    if damage == "x NaN":
        x[row, row] = NAN
    elif damage == "x inf":
        x[row, 0] = INF
    elif damage == "x 1-D":
        x = x[row]
    elif damage == "x empty":
        x = x[:0]
    elif damage == "x 63 features":
        x = x[:, :63]
    elif damage == "x text":
        x = x.astype(str)
    else:
        name = damage.removeprefix("no ").split()[0]
        names = [f"`{name}`"]
        if damage == "no head/bias":
            del params["head/bias"]
        elif damage == "hidden/kernel 3-D":
            params[name] = params[name][None]
        elif damage == "head/kernel NaN":
            params[name] = params[name].copy()
            params[name][row % params[name].shape[0], 0] = NAN
        elif damage == "head/bias too long":
            params[name] = np.concatenate([params[name], params[name][:1]])
    raises("model.forward_numpy", lambda: model.forward_numpy(params, x), names)


# MODEL ARTIFACTS AND THE STORE -------------------------------------------------


def _leaf(path: str, header: dict | str, payload: bytes) -> bytes:
    text = header if isinstance(header, str) else canonical_json(header).decode()
    return checkpoint.MAGIC + text.encode() + b"\n" + payload


ARTIFACT_DAMAGE = [
    "leaf without header line",
    "leaf header not JSON",
    "leaf header without shape",
    "leaf header with an unknown field",
    "leaf dtype object",
    "leaf dtype unknown",
    "leaf negative shape",
    "leaf shape text",
    "leaf payload truncated",
    "leaf payload too long",
    "leaf NaN",
    "leaf inf",
    "manifest not JSON",
    "manifest without leaves",
    "manifest leaves a dict",
    "manifest lists a missing leaf",
    "two manifests",
    "duplicate leaf",
    "golden inputs wrong width",
    "architecture unknown",
    "hidden zero",
    "hidden text",
    "no files",
    "not a directory",
]


def _damaged_artifact(world, label: str, work: Path) -> tuple[Path, list[str]]:
    source = Store(world.root / "store").get(world.models[0])
    if work.is_dir():
        shutil.rmtree(work)
    work.unlink(missing_ok=True)
    shutil.copytree(source, work)
    for p in work.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    leaf = work / "head.bias.leaf"
    raw = leaf.read_bytes()
    end = raw.index(b"\n", len(checkpoint.MAGIC))
    header = json.loads(raw[len(checkpoint.MAGIC) : end])
    payload = raw[end + 1 :]
    manifest = json.loads((work / "model.json").read_text())
    names = ["head.bias.leaf"]
    if label == "leaf without header line":
        leaf.write_bytes(checkpoint.MAGIC + b'{"dtype": "<f4"')
    elif label == "leaf header not JSON":
        leaf.write_bytes(_leaf("x", "{dtype: <f4}", payload))
    elif label == "leaf header without shape":
        leaf.write_bytes(_leaf("x", {"dtype": "<f4", "path": "head/bias"}, payload))
    elif label == "leaf header with an unknown field":
        leaf.write_bytes(_leaf("x", {**header, "order": "C"}, payload))
    elif label == "leaf dtype object":
        leaf.write_bytes(_leaf("x", {**header, "dtype": "|O"}, payload))
    elif label == "leaf dtype unknown":
        leaf.write_bytes(_leaf("x", {**header, "dtype": "<q9"}, payload))
    elif label == "leaf negative shape":
        leaf.write_bytes(_leaf("x", {**header, "shape": [-10]}, payload))
    elif label == "leaf shape text":
        leaf.write_bytes(_leaf("x", {**header, "shape": "10"}, payload))
    elif label == "leaf payload truncated":
        leaf.write_bytes(_leaf("x", header, payload[:-3]))
    elif label == "leaf payload too long":
        leaf.write_bytes(_leaf("x", header, payload + payload[:4]))
    elif label in ("leaf NaN", "leaf inf"):
        values = np.frombuffer(payload, "<f4").copy()
        values[3] = NAN if label == "leaf NaN" else INF
        leaf.write_bytes(_leaf("x", header, values.tobytes()))
    elif label == "manifest not JSON":
        (work / "model.json").write_bytes(b"{not json")
        names = ["model.json"]
    elif label == "manifest without leaves":
        del manifest["leaves"]
        (work / "model.json").write_bytes(canonical_json(manifest))
        names = ["`leaves`"]
    elif label == "manifest leaves a dict":
        manifest["leaves"] = {}
        (work / "model.json").write_bytes(canonical_json(manifest))
        names = ["`leaves`"]
    elif label == "manifest lists a missing leaf":
        manifest["leaves"] = sorted([*manifest["leaves"], "head/extra"])
        (work / "model.json").write_bytes(canonical_json(manifest))
        names = ["head/extra"]
    elif label == "two manifests":
        shutil.copy(work / "model.json", work / "copy.json")
        names = ["two manifests"]
    elif label == "duplicate leaf":
        shutil.copy(leaf, work / "again.leaf")
        names = ["head/bias"]
    elif label == "golden inputs wrong width":
        golden = np.zeros((4, 63), np.float32)
        (work / "golden.inputs.leaf").write_bytes(checkpoint.leaf_bytes("golden/inputs", golden))
        names = ["golden"]
    elif label == "architecture unknown":
        manifest["architecture"]["kind"] = "cnn"
        (work / "model.json").write_bytes(canonical_json(manifest))
        names = ["`cnn`"]
    elif label in ("hidden zero", "hidden text"):
        manifest["architecture"]["hidden"] = 0 if label == "hidden zero" else "32"
        (work / "model.json").write_bytes(canonical_json(manifest))
        names = ["`hidden`"]
    elif label == "no files":
        shutil.rmtree(work)
        work.mkdir()
        names = ["manifest"]
    elif label == "not a directory":
        shutil.rmtree(work)
        work.write_text("a file\n")
        names = [work.name]
    return work, names


@cases(35)
@given(label=st.sampled_from(ARTIFACT_DAMAGE))
def test_model_artifacts_that_do_not_fit_are_refused(world, label):
    work, names = _damaged_artifact(world, label, world.inputs / "artifact")
    raises(
        "checkpoint.load_model",
        lambda: checkpoint.load_model(work),
        names,
        checkpoint.ArtifactError,
    )
    # Registering it through the library stores nothing and registers nothing.
    state = release.State(world.root)
    before = snapshot(world.root)
    raises("release.register", lambda: release.register(state, work), [work.name], StoreError)
    assert snapshot(world.root) == before


def test_store_refuses_what_is_not_a_plain_directory(world, tmp_path):
    store = Store(tmp_path / "store")
    (tmp_path / "a-file").write_text("x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "data").write_text("x")
    (linked / "link").symlink_to(linked / "data")
    for target, names in [
        (tmp_path / "missing", ["missing"]),
        (tmp_path / "a-file", ["a-file"]),
        (linked, ["link"]),
    ]:
        raises("store.tree_digest", lambda t=target: tree_digest(t), names, StoreError)
        raises("store.Store.put", lambda t=target: store.put(t), names, StoreError)
    assert not (tmp_path / "store" / "objects").exists() or not list(
        (tmp_path / "store" / "objects").iterdir()
    )


# COVERAGE --------------------------------------------------------------------


def test_every_command_of_the_group_has_cases():
    missing = sorted(set(main.commands) - TALLY["commands"])
    assert not missing, f"commands without bad-input cases: {missing}"
    assert TALLY["tracebacks"] == 0
    assert TALLY["cases"] >= 300 and len(TALLY["entry_points"]) >= 12, TALLY
