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
line.
"""

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from engineering_release.config import canonical_json

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
    """The entry that follows `entries`: next `seq`, `prev` = last hash, own hash."""
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
    """Every break in the chain, as sentences naming the entry; empty when intact."""
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


def read(path: str | Path) -> list[dict]:
    """The entries of the log at `path` (none if the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise LedgerError(f"Line {number} of `{path.name}` is not JSON.") from None
        if not isinstance(entry, dict) or not {"seq", "kind", "prev", "body"} <= set(entry):
            raise LedgerError(f"Line {number} of `{path.name}` is not a log entry.")
        entries.append(entry)
    return entries


def append(
    path: str | Path,
    kind: str,
    body: dict,
    *,
    crashpoint: Callable[[str], None] = lambda name: None,
) -> dict:
    """Appends one entry atomically and returns it; refuses to extend a broken log."""
    path = Path(path)
    entries = read(path)
    problems = verify_chain(entries)
    if problems:
        raise LedgerError("The log is broken; nothing appended. " + " ".join(problems))
    check_references(entries, kind, body)
    entry = make_entry(entries, kind, body)
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in [*entries, entry])
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        crashpoint("ledger-written")
        os.fsync(f.fileno())
    crashpoint("ledger-synced")
    os.replace(tmp, path)  # The commit point.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    crashpoint("ledger-committed")
    return entry


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
                f"`{to}` names no single earlier release or rollback entry of the log."
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
