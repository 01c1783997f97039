"""Faults injected on purpose, and damage done to a checkpoint on purpose.

A fault is `KIND@STEP`: the job injects it right after step `STEP` completed
(and was counted), announcing it first with a `{"event": "fault", ...}` line
that the supervisor keeps as ground truth for drills but never reads to
diagnose. The kinds:

- `exception`: an uncaught `RuntimeError`; the job exits with status 1.
- `kill`: the job SIGKILLs itself (a preemption, the OOM killer).
- `memory`: the job allocates and touches memory 32 MB past
  `memory_limit_mb`, then keeps stepping (a leak).
- `hang`: the training loop takes the reporter's lock and deadlocks: no step,
  no heartbeat.
- `stall`: the training loop waits forever outside the lock: heartbeats go on,
  the step does not move.
- `slow`: every later step takes `4 * batch_size / min_examples_per_s`
  seconds, a quarter of the stated rate.
- `kill-during-save`: SIGKILL right after the checkpoint of `STEP` was
  requested, while Orbax is still writing it.
"""

import mmap
import os
import signal
import sys
import threading
import time
from typing import NamedTuple

import numpy as np

from workload_operations.config import Config

FAULTS = ("exception", "kill", "memory", "hang", "stall", "slow", "kill-during-save")
# The faults a drill injects (kill-during-save belongs to the recovery checks).
DRILL_FAULTS = ("exception", "kill", "memory", "hang", "stall", "slow")


class FaultError(ValueError):
    """A fault specification that cannot be used; the message says why."""


class Fault(NamedTuple):
    kind: str
    step: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}"


def parse(text: str) -> Fault:
    """`KIND@STEP` -> `Fault`; raises `FaultError` naming the bad part."""
    kind, sep, step = text.partition("@")
    if kind not in FAULTS:
        raise FaultError(
            f"Unknown fault `{kind}`; choose one of {', '.join(f'`{f}`' for f in FAULTS)}."
        )
    if not sep:
        step = "10"
    if not step.isdigit() or int(step) < 1:
        raise FaultError(f"The step of fault `{text}` must be a positive integer, not `{step}`.")
    return Fault(kind, int(step))


def check(fault: Fault, config: Config) -> None:
    """Refuses a fault that this config cannot show (it would never fire or be seen)."""
    if fault.step >= config.num_steps:
        raise FaultError(
            f"Fault `{fault}` fires after step {fault.step}, but the run has only "
            f"`num_steps` = `{config.num_steps}`; choose an earlier step."
        )
    if fault.kind == "kill-during-save" and (
        config.checkpoint_every == 0 or fault.step % config.checkpoint_every
    ):
        raise FaultError(
            f"Fault `{fault}` needs a checkpoint at step {fault.step}, but "
            f"`checkpoint_every` = `{config.checkpoint_every}`; use a multiple of it."
        )
    if fault.kind == "slow" and slow_delay_s(config) * 2 > config.stall_timeout_s:
        raise FaultError(
            f"A slow step of this config takes {slow_delay_s(config):g} s, too close to "
            f"`stall_timeout_s` = `{config.stall_timeout_s}` to tell slow from stalled."
        )


def slow_delay_s(config: Config) -> float:
    """Per-step delay of the `slow` fault: a quarter of the stated rate."""
    return 4.0 * config.batch_size / config.min_examples_per_s


class Injector:
    """Fires one fault inside the job; the training loop calls its hooks."""

    def __init__(self, fault: Fault | None, config: Config, observer=None, emit=None):
        self.fault = fault
        self.config = config
        self.observer = observer
        self.emit = emit or (lambda record: None)
        self.extra_delay_s = 0.0
        self._hoard: list[mmap.mmap] = []

    def _announce(self) -> None:
        self.emit(
            {
                "event": "fault",
                "kind": self.fault.kind,
                "step": self.fault.step,
                "t": time.monotonic(),
            }
        )

    def after_step(self, step: int) -> None:
        if self.fault is None or step != self.fault.step or self.fault.kind == "kill-during-save":
            return
        kind = self.fault.kind
        if self.observer is not None:
            # The last progress before the fault, written now rather than at the next
            # reporter tick, so that every incident can show where the job was.
            self.observer.emit(self.observer.heartbeat())
        self._announce()
        if kind == "memory":
            # Just past the limit (the group's other members count too), every page
            # touched so that the memory is resident, not just reserved.
            size_mb = max(self.config.memory_limit_mb - resident_mb(), 0.0) + 32.0
            self._hoard.append(resident_block(int(size_mb * 2**20)))
        if kind == "exception":
            raise RuntimeError(f"Injected fault at step {step}: the training step failed.")
        if kind == "kill":
            _kill_self()
        if kind == "hang":
            lock = self.observer.lock if self.observer is not None else threading.Lock()
            lock.acquire()
            threading.Event().wait()  # Holds the reporter's lock forever: a deadlock.
        elif kind == "stall":
            while True:
                time.sleep(1.0)
        elif kind == "slow":
            self.extra_delay_s = slow_delay_s(self.config)

    def after_save(self, step: int) -> None:
        if self.fault is not None and self.fault == ("kill-during-save", step):
            self._announce()
            _kill_self()

    def delay(self) -> None:
        if self.extra_delay_s:
            time.sleep(self.extra_delay_s)


def resident_block(size: int) -> mmap.mmap:
    """`size` bytes of anonymous memory, every page resident when this returns.

    Not a NumPy array: NumPy advises the kernel to back a large array with huge
    pages, and where the kernel then compacts memory to find them (transparent
    huge pages with `defrag` = `madvise`, a common default), touching a few hundred
    MB can take seconds, longer than `stall_timeout_s` on a loaded machine, so the
    job would read as stalled before its memory passed the limit. A plain mapping,
    populated by the kernel in one call where Linux offers `MAP_POPULATE`, takes
    about 0.3 s per GB."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    block = mmap.mmap(-1, size, flags=flags)
    np.frombuffer(block, np.uint8)[:: mmap.PAGESIZE] = 1  # One write per page: resident.
    return block


def resident_mb() -> float:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _kill_self() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def corrupt_step(workdir, step: int) -> list[str]:
    """Bit rot in a committed step: flips bytes in the middle of every array data
    file (OCDBT `d/` files) of its `state` item. Returns the files changed."""
    from pathlib import Path

    from workload_operations import checkpoint

    root = checkpoint.checkpoint_dir(Path(workdir)) / str(step) / checkpoint.STATE
    changed = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.parent.name == "d":
            blob = bytearray(path.read_bytes())
            for i in range(len(blob) // 2, min(len(blob), len(blob) // 2 + 8)):
                blob[i] ^= 0xFF
            path.write_bytes(bytes(blob))
            changed.append(str(path))
    return changed


def degrade_step(workdir, step: int, config: Config, scale: float = 0.5) -> dict:
    """A degraded artifact that passes its checksums: restores `step`, scales the
    output layer `w2` by `scale`, writes it back as the same step and regenerates
    the checksums in both its `meta` item and the ledger's request record. The
    held-out evaluation recorded at save time is left as it was."""
    import shutil
    from pathlib import Path

    import orbax.checkpoint as ocp

    from workload_operations import checkpoint, data, train

    workdir = Path(workdir)
    dataset = data.make_dataset(config)
    like = train.create_train_state(config)
    arrays, iterator, meta = checkpoint.restore(
        workdir, step, train.abstract_state(like), data.iterator(config, dataset)
    )
    state = train.TrainState(*arrays)
    params = {**state.params, "w2": state.params["w2"] * scale}
    degraded = state._replace(params=params)
    sums = checkpoint.checksums(degraded)
    meta = {**meta, "checksums": sums}
    shutil.rmtree(checkpoint.checkpoint_dir(workdir) / str(step))
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True)
    with ocp.CheckpointManager(
        checkpoint.checkpoint_dir(workdir),
        options=options,
        item_names=(checkpoint.STATE, checkpoint.DATA, checkpoint.META),
    ) as mngr:
        mngr.save(step, args=checkpoint.save_args(degraded, iterator, meta))
    ledger = checkpoint.Ledger(workdir)
    records = ledger.read("requested")
    for record in records:
        if int(record["step"]) == step:
            record["checksums"] = sums
    ledger.rewrite("requested", records)
    return {"step": step, "scale": scale, "checksums": sums}
