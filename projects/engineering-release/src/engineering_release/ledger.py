"""The release log: append-only JSON lines, each entry carrying the hash of the previous.

An entry is `{"seq", "kind", "prev", "body", "hash"}` where `hash` is the
sha256 of the canonical JSON of the other four fields and `prev` is the hash
of the entry before (64 zeros for the first). Changing any byte of an entry
changes its hash, which breaks the next entry's `prev`; reordering breaks
`seq` and `prev`; deleting an entry in the middle breaks `prev`. Deleting
the LAST entries leaves a valid shorter chain: that is caught by the anchor
(length and head hash) kept in the registry, see `registry`.

Kinds and bodies:
  `approve`   `{"approval": <signed approval>}`
  `release`   `{"model_id", "approval": <hash of an approve entry of that model>,
               "previous_model_id"}`
  `rollback`  `{"model_id", "to": <hash of an earlier release or rollback entry>,
               "approval": <that entry's approval>, "previous_model_id"}`
A rollback is a new entry pointing at a release that happened, never a deletion.

`append` rewrites the whole file through a scratch file and one atomic
rename, so after a crash the log is the old one or the new one, never a torn
line. It holds the state's lock (`durable.locked` on `lock` next to the log)
from reading the log to the rename, so two writers never both extend the
same log, and it returns only after the file and its directory are synced.
`read` refuses a line that is not a well-formed entry, naming the line and
the field, so that no later step meets a malformed entry.
"""

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from engineering_release import durable
from engineering_release.config import canonical_json, shown

GENESIS = "0" * 64
KINDS = ("approve", "release", "rollback")


class LedgerError(ValueError):
    """A log that is malformed or broken, or an entry that may not be appended."""


def entry_hash(entry: dict) -> str:
    """The sha256 of the canonical JSON of `seq`, `kind`, `prev` and `body`."""
    return hashlib.sha256(
        canonical_json({k: entry[k] for k in ("seq", "kind", "prev", "body")})
    ).hexdigest()


def make_entry(entries: list[dict], kind: str, body: dict) -> dict:
    """The entry that follows `entries`: next `seq`, `prev` = last hash, own hash.

    `seq` is `len(entries)`; `prev` is `GENESIS` (64 zeros) for the first entry;
    `hash` is `entry_hash` of the other four fields [claim:entry-links-and-seals].
    """
    if kind not in KINDS:
        raise LedgerError(f"Unknown entry kind `{kind}`; one of {list(KINDS)}.")
    # --- exercise stage 3: Link the entry to the last hash, then seal it with its own. ---
    entry = {
        "seq": len(entries),
        "kind": kind,
        "prev": entries[-1]["hash"] if entries else GENESIS,
        "body": body,
    }
    entry["hash"] = entry_hash(entry)
    return entry
    # --- end exercise ---


def verify_chain(entries: list[dict]) -> list[str]:
    """Every break in the chain, as sentences naming the entry; empty when intact.

    For each entry `i`, in this order, one sentence per failed check (ids are
    12-digit prefixes):
        `seq` != i -> "Entry <i> has seq `<seq>`: reordered or removed."
            [claim:chain-seq-check]
        `prev` != the previous entry's RECORDED `hash` (GENESIS for entry 0) ->
            "Entry <i> points at `<prev>`, but the entry before it hashes to `<hash>`:
            an entry was edited, removed or reordered." [claim:chain-prev-check]
        `hash` != `entry_hash(entry)` -> "Entry <i> (<kind>) was edited: it hashes to
            `<actual>`, not to its recorded `<hash>`." [claim:chain-hash-check]
    So an entry edited but not re-sealed gives one sentence (its own); edited and
    re-sealed, one sentence about the NEXT entry's link [claim:chain-one-sentence-per-break].
    """
    problems = []
    # --- exercise stage 3: Check each entry's seq, its link, and its own hash. ---
    prev = GENESIS
    for i, entry in enumerate(entries):
        if entry.get("seq") != i:
            problems.append(f"Entry {i} has seq `{entry.get('seq')}`: reordered or removed.")
        if entry.get("prev") != prev:
            problems.append(
                f"Entry {i} points at `{str(entry.get('prev'))[:12]}`, but the entry before "
                f"it hashes to `{prev[:12]}`: an entry was edited, removed or reordered."
            )
        actual = entry_hash(entry)
        if entry.get("hash") != actual:
            problems.append(
                f"Entry {i} ({entry.get('kind')}) was edited: it hashes to `{actual[:12]}`, "
                f"not to its recorded `{str(entry.get('hash'))[:12]}`."
            )
        prev = entry.get("hash", "")
    # --- end exercise ---
    return problems


_APPROVAL_TEXT = ("model_id", "evaluation_id", "policy_sha256", "key_id", "signer", "signed_at")
_BODY_TEXT = {"approve": (), "release": ("model_id", "approval"), "rollback": ("model_id", "to")}


def entry_problem(entry: object) -> str | None:
    """What makes `entry` not a well-formed log entry (types and fields only; the
    chain and the references are checked by `verify_chain` and `check_references`)."""
    if not isinstance(entry, dict):
        return f"is JSON of type `{type(entry).__name__}`, not an entry object"
    missing = [k for k in ("seq", "kind", "prev", "body", "hash") if k not in entry]
    if missing:
        return f"lacks the field(s) {missing}"
    unknown = sorted(set(entry) - {"seq", "kind", "prev", "body", "hash"})
    if unknown:
        return f"has unknown field(s) {unknown}"
    if type(entry["seq"]) is not int or entry["seq"] < 0:
        return f"has `seq` `{entry['seq']!r}`, not a count"
    if entry["kind"] not in KINDS:
        return f"has `kind` `{entry['kind']!r}`, not one of {list(KINDS)}"
    for name in ("prev", "hash"):
        if not isinstance(entry[name], str):
            return f"has a `{name}` that is not text"
    body = entry["body"]
    if not isinstance(body, dict):
        return "has a `body` that is not an object"
    for name in _BODY_TEXT[entry["kind"]]:
        if not isinstance(body.get(name), str):
            return f"has a body without the text field `{name}`"
    if entry["kind"] == "approve":
        approval = body.get("approval")
        if not isinstance(approval, dict):
            return "has a body without the object `approval`"
        for name in (*_APPROVAL_TEXT, "signature"):
            if not isinstance(approval.get(name), str):
                return f"has an approval without the text field `{name}`"
        if not isinstance(approval.get("policy"), dict):
            return "has an approval without the object `policy`"
    else:
        if not isinstance(body.get("approval"), str):
            return "has a body without the text field `approval`"
        previous = body.get("previous_model_id", 0)
        if previous is not None and not isinstance(previous, str):
            return "has a body without `previous_model_id` (text, or null for none)"
    return None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"`{name}` is not a JSON number")


def read(path: str | Path) -> list[dict]:
    """The entries of the log at `path` (none if the file does not exist).

    Raises `LedgerError` naming the line when the file is not UTF-8 JSON lines
    of well-formed entries."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise LedgerError(f"Cannot read the log `{path}`: {err.strerror}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise LedgerError(f"Line {line} of the log `{path}` is not UTF-8 text.") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # The end of the last line.
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            raise LedgerError(
                f"Line {number} of the log `{path}` is not JSON (a torn or edited line)."
            ) from None
        problem = entry_problem(entry)
        if problem is not None:
            raise LedgerError(f"Line {number} of the log `{path}` {problem}.")
        entries.append(entry)
    return entries


def append(
    path: str | Path,
    kind: str,
    body: dict,
    *,
    crashpoint: Callable[[str], None] = lambda name: None,
) -> dict:
    """Appends one entry atomically and durably and returns it, holding the state's
    lock throughout; refuses to extend a broken log."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with durable.locked(path.parent / durable.LOCK_FILE):
        entries = read(path)
        problems = verify_chain(entries)
        if problems:
            raise LedgerError("The log is broken; nothing appended. " + " ".join(problems))
        check_references(entries, kind, body)
        entry = make_entry(entries, kind, body)
        text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in [*entries, entry])
        tmp = scratch_path(path)
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            crashpoint("ledger-written")
            os.fsync(f.fileno())
        crashpoint("ledger-synced")
        os.replace(tmp, path)  # The commit point.
        durable.fsync_dir(path.parent)
        crashpoint("ledger-committed")
    return entry


def scratch_path(path: str | Path) -> Path:
    """The scratch file `append` writes before its rename (only under the lock)."""
    path = Path(path)
    return path.with_name(path.name + ".tmp")


def by_hash(entries: list[dict]) -> dict[str, dict]:
    return {e["hash"]: e for e in entries}


def serving(entries: list[dict]) -> dict | None:
    """The latest release or rollback entry: what should be serving."""
    for entry in reversed(entries):
        if entry["kind"] in ("release", "rollback"):
            return entry
    return None


def serving_model(entries: list[dict]) -> str | None:
    head = serving(entries)
    return None if head is None else head["body"]["model_id"]


def previous_model(entries: list[dict]) -> str | None:
    head = serving(entries)
    return None if head is None else head["body"]["previous_model_id"]


def approvals(entries: list[dict], model_id: str) -> list[dict]:
    """The approve entries of `model_id`, oldest first."""
    return [
        e
        for e in entries
        if e["kind"] == "approve" and e["body"]["approval"]["model_id"] == model_id
    ]


def release_body(entries: list[dict], approve_entry: dict) -> dict:
    return {
        "model_id": approve_entry["body"]["approval"]["model_id"],
        "approval": approve_entry["hash"],
        "previous_model_id": serving_model(entries),
    }


def rollback_body(entries: list[dict], target: dict) -> dict:
    return {
        "model_id": target["body"]["model_id"],
        "to": target["hash"],
        "approval": target["body"]["approval"],
        "previous_model_id": serving_model(entries),
    }


def rollback_target(entries: list[dict], to: str | None = None) -> dict:
    """The release a rollback returns to: the entry whose hash starts with `to`, or
    by default the latest release of the model that served before the current one."""
    releases = [e for e in entries if e["kind"] in ("release", "rollback")]
    if not releases:
        raise LedgerError("Nothing was ever released; there is nothing to roll back to.")
    if to is not None:
        found = [e for e in releases if e["hash"].startswith(to.lower())] if len(to) >= 8 else []
        if len(found) != 1:
            raise LedgerError(
                f"`{shown(to)}` names no single earlier release or rollback entry of the log."
            )
        return found[0]
    previous = previous_model(entries)
    if previous is None:
        raise LedgerError("The current release is the first; there is no previous release.")
    return [e for e in releases if e["body"]["model_id"] == previous][-1]


def check_references(entries: list[dict], kind: str, body: dict) -> None:
    """Refuses an entry whose references do not resolve to earlier entries of the right kind."""
    known = by_hash(entries)
    if kind == "release":
        target = known.get(body.get("approval"))
        if target is None or target["kind"] != "approve":
            raise LedgerError("A release must point at an earlier approve entry.")
        if target["body"]["approval"]["model_id"] != body.get("model_id"):
            raise LedgerError(
                f"The approval `{body.get('approval', '')[:12]}` is for model "
                f"`{target['body']['approval']['model_id'][:12]}`, not `{body['model_id'][:12]}`."
            )
    elif kind == "rollback":
        target = known.get(body.get("to"))
        if target is None or target["kind"] not in ("release", "rollback"):
            raise LedgerError("A rollback must point at an earlier release entry.")
        if target["body"]["model_id"] != body.get("model_id") or target["body"][
            "approval"
        ] != body.get("approval"):
            raise LedgerError("A rollback must carry the model and approval of its target.")
    if kind in ("release", "rollback") and body.get("previous_model_id") != serving_model(entries):
        raise LedgerError(
            f"`previous_model_id` must be the model serving now (`{serving_model(entries)}`)."
        )


def verify_references(entries: list[dict]) -> list[str]:
    """Every entry whose references do not resolve within the entries before it."""
    problems = []
    for i, entry in enumerate(entries):
        try:
            check_references(entries[:i], entry["kind"], entry["body"])
        except (LedgerError, KeyError, TypeError) as err:
            problems.append(f"Entry {i} ({entry.get('kind')}): {err}")
    return problems
