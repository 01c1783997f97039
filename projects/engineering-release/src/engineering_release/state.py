"""The release state: its directory, its lock, recovery, and the crash points.

State lives in one directory (default `runs/release/`):

    store/          content-addressed objects: models and evaluation reports
    ledger.jsonl    the hash-chained release log (the record)
    registry.db     the MLflow Model Registry (SQLite): versions, tags, aliases
    keys/           signing keys (`<name>.pem`) and the keyring `trusted.json`
    policy.json     the policy in force
    host.json       written by a running serving host: its port and pid
    lock            the state's lock (`durable`): one commit at a time changes the state

`recover` finishes what a killed command left; every command runs it first.

`crashpoint(name)` kills the process with SIGKILL when the environment
variable `ENGINEERING_RELEASE_CRASH_AT` equals `name`: the tests use it to
kill a release at chosen moments. `CRASH_POINTS` lists them in order.
"""

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from engineering_release import durable, ledger, registry
from engineering_release.config import Policy, canonical_json, load_policy
from engineering_release.store import Store

DEFAULT_ROOT = Path("runs") / "release"
CRASH_ENV = "ENGINEERING_RELEASE_CRASH_AT"
CRASH_POINTS = (
    "release-start",
    "gates-passed",
    "candidate-ready",
    "ledger-written",
    "ledger-synced",
    "ledger-committed",
    "alias-previous",
    "alias-champion",
    "registry-synced",
    "switched",
)


def crashpoint(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class ReleaseRefused(ValueError):
    """A command refused with its reason; nothing was changed."""


class StateError(ValueError):
    """A state directory that cannot be used (its path names a file, or is unwritable)."""


@dataclass
class State:
    root: Path
    # Called once when a command must wait for the lock (the command line says so).
    on_wait: object = field(default=None, repr=False)
    store: Store = field(init=False)

    def __post_init__(self) -> None:
        # Absolute: the registry records each model's source as a file URI, and a
        # command's working directory must not change what the state means.
        self.root = Path(self.root).resolve()
        self.store = Store(self.root / "store")
        self._client = None

    def lock(self, on_wait=None):
        """The state's exclusive lock, as a context manager (see `durable.locked`);
        `on_wait` defaults to the state's own."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StateError(
                f"Cannot use `{self.root}` as the release state: {err.strerror}."
            ) from None
        return durable.locked(self.root / durable.LOCK_FILE, on_wait or self.on_wait)

    @property
    def ledger_path(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def host_file(self) -> Path:
        return self.root / "host.json"

    @property
    def client(self):
        if self._client is None:
            self._client = registry.connect(self.root / "registry.db")
        return self._client

    def policy(self) -> Policy:
        path = self.root / "policy.json"
        if not path.exists():
            return Policy()
        return load_policy(path)

    def set_policy(self, policy: Policy) -> None:
        with self.lock():
            text = canonical_json(policy.to_dict()) + b"\n"
            durable.write_atomic(self.root / "policy.json", text)

    def entries(self) -> list[dict]:
        return ledger.read(self.ledger_path)


def recover(state: State) -> list[str]:
    """Finishes what a killed command left: sweeps store scratch, and moves the
    registry forward to a log that is ahead of it. Returns what it did."""
    with state.lock():
        done = []
        swept = state.store.sweep_scratch()
        if swept:
            done.append(f"removed {swept} unfinished store cop{'y' if swept == 1 else 'ies'}")
        tmp = ledger.scratch_path(state.ledger_path)
        if tmp.exists():
            tmp.unlink()
            done.append("removed an uncommitted log write")
        entries = state.entries()
        if ledger.verify_chain(entries):
            return done  # A broken log is for `verify` to report, not for recovery to touch.
        if registry.check(state.client, entries):
            try:
                registry.sync(state.client, entries)
                done.append(f"moved the registry to the log ({len(entries)} entries)")
            except registry.RegistryError:
                pass  # Lost or rewritten entries: `verify` reports them.
        return done
