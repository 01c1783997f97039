"""Recovery points: requested, completed and accepted, kept apart.

A checkpoint step goes through three states, each written to its own ledger
file under `<workdir>/ledger/` by the process that knows it:

1. requested (`requested.jsonl`, by the job): `CheckpointManager.save` was
   called. The record holds what the state must reproduce: a SHA-256 per
   array, the SHA-256 of the Grain iterator state, and the held-out
   evaluation of the state being saved (loss bits, predictions digest).
2. completed (`completed.jsonl`, by the job): Orbax finished the background
   write and committed the step directory (it writes into a temporary
   directory and renames it only when every item is on disk).
3. accepted or rejected (`verdicts.jsonl`, by the verifier, a separate
   process): the step restored, its checksums and held-out evaluation
   recomputed and compared with the request (`verifier.judge`).

Continuation starts only from the latest accepted step (`latest_accepted`).
The Orbax items of a step: `state` (params, optimizer state, step),
`data` (the Grain iterator state) and `meta` (the request record, as JSON).
"""

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

STATE, DATA, META = "state", "data", "meta"
LEDGER_FILES = {
    "requested": "requested.jsonl",
    "completed": "completed.jsonl",
    "verdicts": "verdicts.jsonl",
}
# The fields every record of a ledger file holds, with their JSON types ("t" is
# added by `Ledger.append`); the verifier checks what else it reads from a request.
LEDGER_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "requested": {"step": int, "t": (int, float)},
    "completed": {"step": int, "t": (int, float)},
    "verdicts": {"step": int, "t": (int, float), "accepted": bool, "reasons": list},
}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message says why."""


def checkpoint_dir(workdir: Path) -> Path:
    return Path(workdir).absolute() / "checkpoints"


def manager(workdir: Path) -> ocp.CheckpointManager:
    """Async saves, every step kept (an accepted step must not be deleted under us)."""
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, create=True)
    return ocp.CheckpointManager(
        checkpoint_dir(workdir), options=options, item_names=(STATE, DATA, META)
    )


def checksums(tree: Any) -> dict[str, str]:
    """SHA-256 of every array's dtype, shape and bytes, keyed by its pytree path
    [claim:checksums-dtype-shape-bytes]."""
    sums = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        array = np.asarray(leaf)
        h = hashlib.sha256(f"{array.dtype}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
        sums[jax.tree_util.keystr(path)] = h.hexdigest()
    return sums


def data_state_digest(state: Any) -> str:
    """SHA-256 of a Grain iterator state (bytes or a JSON-able dict)
    [claim:data-state-digest]."""
    if isinstance(state, bytes):
        return hashlib.sha256(state).hexdigest()
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


class Ledger:
    """Append-only JSON lines, one file per state; each line is flushed and synced."""

    def __init__(self, workdir: Path):
        self.root = Path(workdir) / "ledger"

    def append(self, kind: str, record: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LEDGER_FILES[kind], "a", encoding="utf-8") as f:
            f.write(json.dumps({**record, "t": time.time()}) + "\n")
            f.flush()

    def read(self, kind: str) -> list[dict]:
        path = self.root / LEDGER_FILES[kind]
        if not path.exists():
            return []
        records = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise CheckpointError(
                f"`{path}` is not UTF-8 text (byte {err.start}); the ledger is damaged. "
                f"Move the workdir aside and start a new run."
            ) from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                # A line cut short by a kill is the last one; anything else is damage.
                if number != len(lines):
                    raise CheckpointError(
                        f"Line {number} of `{path}` is not JSON; the ledger is damaged. "
                        f"Move the workdir aside and start a new run."
                    ) from None
                continue
            problem = record_problem(record, LEDGER_FIELDS[kind])
            if not problem and record["step"] < 0:
                problem = f"has a negative `step` = `{record['step']}`"
            if problem:
                raise CheckpointError(
                    f"Line {number} of `{path}` {problem}; the ledger is damaged. "
                    f"Move the workdir aside and start a new run."
                )
            records.append(record)
        return records

    def by_step(self, kind: str) -> dict[int, dict]:
        """The last record of each step [claim:ledger-last-record-per-step]."""
        return {int(r["step"]): r for r in self.read(kind)}

    def rewrite(self, kind: str, records: list[dict]) -> None:
        path = self.root / LEDGER_FILES[kind]
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def record_problem(record: object, fields: dict[str, type | tuple[type, ...]]) -> str:
    """What is wrong with one ledger record, or `""`."""
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not a record"
    for name, kind in fields.items():
        if name not in record:
            return f"lacks the field `{name}`"
        value = record[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            return f"has `{name}` = `{json.dumps(value)[:40]}`, of the wrong type"
    return ""


def committed_steps(workdir: Path) -> list[int]:
    """Step directories Orbax committed (plain integer names), oldest first."""
    root = checkpoint_dir(workdir)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def is_committed(workdir: Path, step: int) -> bool:
    """Orbax renamed the step's temporary directory and wrote its commit metadata
    [claim:committed-needs-metadata]."""
    root = checkpoint_dir(workdir) / str(step)
    return root.is_dir() and (root / "_CHECKPOINT_METADATA").is_file()


def latest_accepted(workdir: Path) -> int | None:
    """The newest step whose latest verdict, given after its latest request, is
    `accepted` and whose directory is still committed [claim:latest-accepted-step];
    None if there is none [claim:latest-accepted-none]."""
    ledger = Ledger(workdir)
    # --- exercise stage 3: Newest step accepted after its request, still committed. ---
    requested = ledger.by_step("requested")
    verdicts = ledger.by_step("verdicts")
    accepted = [
        step
        for step, verdict in verdicts.items()
        if verdict["accepted"]
        and step in requested
        and verdict["t"] >= requested[step]["t"]  # judged after its latest request
        and is_committed(workdir, step)
    ]
    return max(accepted) if accepted else None
    # --- end exercise ---


def set_aside_after(workdir: Path, step: int | None) -> list[int]:
    """Moves every step directory newer than `step` (all of them for None), and any
    unfinished temporary directory, to `<workdir>/set-aside/`: the evidence is kept
    and Orbax can write those step numbers again. Returns the steps moved."""
    root = checkpoint_dir(workdir)
    if not root.is_dir():
        return []
    moved = []
    target_root = Path(workdir) / "set-aside"
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for path in sorted(root.iterdir()):
        newer = path.name.isdigit() and (step is None or int(path.name) > step)
        unfinished = not path.name.isdigit() and path.is_dir()
        if newer or unfinished:
            target_root.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(target_root / f"{path.name}-{stamp}"))
            if newer:
                moved.append(int(path.name))
    return moved


def save_args(arrays: Any, iterator: Any, meta: dict) -> ocp.args.Composite:
    return ocp.args.Composite(
        **{
            STATE: ocp.args.StandardSave(arrays),
            DATA: grain.checkpoint.CheckpointSave(iterator),
            META: ocp.args.JsonSave(meta),
        }
    )


def restore(workdir: Path, step: int, abstract_arrays: Any, iterator: Any) -> tuple[Any, Any, dict]:
    """(state arrays, restored iterator, meta) of a committed step."""
    # A synchronous manager: a restore needs no background thread to outlive it.
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=False)
    with ocp.CheckpointManager(
        checkpoint_dir(workdir), options=options, item_names=(STATE, DATA, META)
    ) as mngr:
        items = mngr.restore(
            step,
            args=ocp.args.Composite(
                **{
                    STATE: ocp.args.StandardRestore(abstract_arrays),
                    DATA: grain.checkpoint.CheckpointRestore(iterator),
                    META: ocp.args.JsonRestore(),
                }
            ),
        )
    return items[STATE], items[DATA], items[META]


class Recorder:
    """The job's side: requests saves and records when Orbax completed them."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.ledger = Ledger(workdir)
        self.manager = manager(workdir)
        self.pending: list[int] = []

    def request(self, step: int, arrays: Any, iterator: Any, heldout: dict) -> dict:
        record = {
            "step": step,
            "checksums": checksums(arrays),
            "data_state_sha256": data_state_digest(iterator.get_state()),
            "heldout": heldout,
        }
        self.ledger.append("requested", record)
        self.manager.save(step, args=save_args(arrays, iterator, record))
        self.pending.append(step)
        return record

    def poll(self, wait: bool = False) -> list[int]:
        """Records the pending steps Orbax has committed; `wait` blocks until all are.
        A step is committed when its directory got its final name (Orbax renames the
        temporary one last), whether or not a later save is still running."""
        if not self.pending:
            return []
        if wait:
            self.manager.wait_until_finished()
        done = [s for s in self.pending if is_committed(self.workdir, s)]
        for step in done:
            self.ledger.append("completed", {"step": step})
        self.pending = [s for s in self.pending if s not in done]
        return done

    def close(self) -> None:
        self.poll(wait=True)
        self.manager.close()
