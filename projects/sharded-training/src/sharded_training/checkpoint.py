"""Full-state checkpoints with Orbax's `CheckpointManager` (async saves).

A checkpoint step holds three items:
  - `state`: params, optimizer state, step and the PRNG key (as `uint32` key data;
    Orbax stores arrays, not typed keys), written by Orbax in the background;
  - `data`: the Grain iterator state, one `process_<i>-of-<n>.json` per process;
  - `meta`: the step, the config digest and the process count, as JSON.

Orbax writes a step into a temporary directory and renames it when every
process is done, so a kill during the write leaves no committed step. A kill
later (e.g. while old steps are being deleted) or damage on disk can still
leave a committed step with items missing; `find_restorable` therefore checks
every item and the metadata of each step, newest first, moves a bad step aside
(under `rejected/`, so Orbax cannot reuse its number) and falls back to the
previous good one, saying so.
"""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

from sharded_training.config import Config

STATE, DATA, META = "state", "data", "meta"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run; the message says why."""


@dataclass(frozen=True)
class StepCheck:
    step: int
    ok: bool
    reason: str  # Empty when ok.


def manager(directory: Path, config: Config, *, async_save: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.max_to_keep,
        enable_async_checkpointing=async_save,
        create=True,
    )
    return ocp.CheckpointManager(
        Path(directory).absolute(), options=options, item_names=(STATE, DATA, META)
    )


def save_args(state_arrays: Any, iterator: Any, meta: dict) -> ocp.args.Composite:
    items = {STATE: ocp.args.StandardSave(state_arrays), META: ocp.args.JsonSave(meta)}
    if iterator is not None:
        items[DATA] = grain.checkpoint.CheckpointSave(iterator)
    return ocp.args.Composite(**items)


def restore_args(abstract_state: Any, iterator: Any) -> ocp.args.Composite:
    items = {STATE: ocp.args.StandardRestore(abstract_state), META: ocp.args.JsonRestore()}
    if iterator is not None:
        items[DATA] = grain.checkpoint.CheckpointRestore(iterator)
    return ocp.args.Composite(**items)


def committed_steps(directory: Path) -> list[int]:
    """Committed step directories (plain integer names), newest first; Orbax's
    temporary directories of unfinished saves are not steps."""
    if not directory.is_dir():
        return []
    return sorted((int(p.name) for p in directory.iterdir() if p.name.isdigit()), reverse=True)


def check_step(directory: Path, step: int, config: Config, process_count: int, data: bool):
    """Every item present and the metadata consistent; raises `CheckpointError` for a
    checkpoint of another config (that is a user error, not damage)
    [claim:check-step-other-config-raises].

    Cases (`problems` collects one phrase each; the reason joins them with "; "):
      `_CHECKPOINT_METADATA` (Orbax's step file) missing -> a problem
        [claim:check-step-orbax-metadata].
      `state/_METADATA` missing, or not valid JSON (a truncated write) -> a problem
        whose phrase names the item in backticks, `` `state` `` [claim:check-step-state-item].
      with `data`: `data/process_<i>-of-<n>.json` missing or not valid JSON, for any
        `i < process_count` -> a problem naming `` `data` `` [claim:check-step-data-item];
        without `data`, unchecked [claim:check-step-data-unchecked-without-data].
      an intact step -> `ok`, reason "" [claim:check-step-intact-ok].
    """
    root = directory / str(step)
    problems = []
    # --- exercise stage 3: Reject a step whose metadata, state or process data is unreadable. ---
    if not (root / "_CHECKPOINT_METADATA").is_file():
        problems.append("`_CHECKPOINT_METADATA` is missing")
    state_meta = root / STATE / "_METADATA"
    try:
        json.loads(state_meta.read_text())
    except (OSError, ValueError):
        problems.append(f"item `{STATE}` is missing or its `_METADATA` is unreadable")
    if data:
        for index in range(process_count):
            name = f"process_{index}-of-{process_count}.json"
            try:
                json.loads((root / DATA / name).read_text())
            except (OSError, ValueError):
                problems.append(f"item `{DATA}` lacks a readable `{name}`")
    # --- end exercise ---
    try:
        meta = json.loads((root / META / "metadata").read_text())
    except (OSError, ValueError):
        meta = None
        problems.append(f"item `{META}` is missing or unreadable")
    if meta is not None:
        if meta.get("config_sha256") != config.digest():
            saved = meta.get("config", {})
            ours = config.model_dump(mode="json")
            diffs = ", ".join(
                f"`{k}` {saved.get(k)!r} there vs {ours.get(k)!r} here"
                for k in sorted(set(saved) | set(ours))
                if saved.get(k) != ours.get(k)
            )
            raise CheckpointError(
                f"The checkpoint at `{root}` was written by another config (config sha256 "
                f"`{str(meta.get('config_sha256'))[:12]}`, this run `{config.digest()[:12]}`"
                f"{': ' + diffs if diffs else ''}); use a new workdir or the config it was "
                f"written with."
            )
        if meta.get("step") != step:
            problems.append(f"its metadata says step `{meta.get('step')}`, not `{step}`")
        if meta.get("process_count") != process_count:
            raise CheckpointError(
                f"The checkpoint at `{root}` was written by `{meta.get('process_count')}` "
                f"processes, but this run has `{process_count}`; relaunch with the same count."
            )
    return StepCheck(step, not problems, "; ".join(problems))


def find_restorable(
    directory: Path, config: Config, process_count: int, *, primary: bool, data: bool = True
) -> tuple[int | None, list[StepCheck]]:
    """The newest good step (or None) and the checks of every newer, rejected step.

    The primary process moves rejected steps to `<directory>/../rejected/`; the
    caller must hold the other processes at a barrier until it has.
    """
    checks = []
    for step in committed_steps(directory):
        check = check_step(directory, step, config, process_count, data)
        checks.append(check)
        if check.ok:
            return step, checks
        if primary:
            target = directory.parent / "rejected" / f"step_{step}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(directory / str(step)), str(target))
    return None, checks


def to_arrays(state: Any) -> Any:
    """The state with its typed PRNG key replaced by the raw `uint32` key data."""
    return state._replace(key=jax.random.key_data(state.key))


def from_arrays(arrays: Any, like: Any) -> Any:
    return arrays._replace(
        key=jax.random.wrap_key_data(arrays.key, impl=jax.random.key_impl(like.key))
    )
