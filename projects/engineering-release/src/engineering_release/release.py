"""The release state and its procedures: register, evaluate, approve, release,
rollback, status, verify.

State lives in one directory (default `runs/release/`):

    store/          content-addressed objects: models and evaluation reports
    ledger.jsonl    the hash-chained release log (the record)
    registry.db     the MLflow Model Registry (SQLite): versions, tags, aliases
    keys/           signing keys (`<name>.pem`) and the keyring `trusted.json`
    policy.json     the policy in force
    host.json       written by a running serving host: its port and pid
    lock            the state's lock (`durable`): one command at a time changes the state

A release: the promotion gate (signature, bound evaluation, thresholds) ->
readiness (the serving host's candidate server, or an in-process self-test
when no host runs) -> COMMIT (one atomic rename of the log) -> registry
aliases follow the log -> traffic switch. Nothing before the commit changes
the record; everything after it is derived from the record and is redone by
`recover` (every command runs it first), so a release killed at any moment
ends as the old release or the new one.

Every procedure here holds the state's lock (`State.lock`, reentrant) from
its first read to its last write, so commands run one at a time on a state
and none acts on what another is about to change; a success is reported
only after it is on disk. A procedure that fails leaves nothing behind: a
model or report it stored for a registration that then failed is removed.

`crashpoint(name)` kills the process with SIGKILL when the environment
variable `ENGINEERING_RELEASE_CRASH_AT` equals `name`: the tests use it to
kill a release at chosen moments. `CRASH_POINTS` lists them in order.
"""

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pydantic

from engineering_release import durable, evaluation, ledger, registry, signing
from engineering_release.config import ConfigError, Policy, canonical_json, load_policy
from engineering_release.store import Store, StoreError, TamperedObject

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
    store: Store = field(init=False)

    def __post_init__(self) -> None:
        # Absolute: the registry records each model's source as a file URI, and a
        # command's working directory must not change what the state means.
        self.root = Path(self.root).resolve()
        self.store = Store(self.root / "store")
        self._client = None

    def lock(self, on_wait=None):
        """The state's exclusive lock, as a context manager (see `durable.locked`)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StateError(
                f"Cannot use `{self.root}` as the release state: {err.strerror}."
            ) from None
        return durable.locked(self.root / durable.LOCK_FILE, on_wait)

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


# REGISTER, EVALUATE, APPROVE -------------------------------------------------


def _stored_new(state: State, object_id: str, existed: bool, store_and_record):
    """Runs `store_and_record()`; if it fails, removes `object_id` unless it was
    stored before (a registration that failed leaves no half state)."""
    try:
        return store_and_record()
    except BaseException:
        if not existed:
            state.store.discard(object_id)
        raise


def register(state: State, model_dir: Path) -> tuple[str, str]:
    """Stores the model directory and registers it; returns `(model_id, version)`.
    Refuses a directory that is not a readable model artifact, storing nothing."""
    from engineering_release import checkpoint, store

    try:
        checkpoint.load_model(model_dir)
    except (checkpoint.ArtifactError, OSError) as err:
        raise StoreError(f"`{model_dir}` is not a model artifact: {err}") from None
    with state.lock():
        model_id = store.tree_digest(model_dir)
        existed = state.store.has(model_id)

        def store_and_register() -> tuple[str, str]:
            stored = state.store.put(model_dir)
            uri = (state.store.objects / stored).as_uri()
            return stored, registry.register(state.client, stored, uri)

        return _stored_new(state, model_id, existed, store_and_register)


def evaluate(state: State, model_id: str) -> tuple[str, dict]:
    """Evaluates the registered `model_id` under the policy in force, stores the
    report and tags the registry version with it; returns `(evaluation_id, report)`."""
    with state.lock():
        model_id = state.store.resolve(model_id)
        if registry.version_of(state.client, model_id) is None:
            raise ReleaseRefused(f"Model `{model_id[:12]}` is in the store but not registered.")
        before = set(state.store.ids())
        evaluation_id, report = evaluation.evaluate(state.store, model_id, state.policy())
        existed = evaluation_id in before
        _stored_new(
            state,
            evaluation_id,
            existed,
            lambda: registry.tag_evaluation(state.client, model_id, evaluation_id),
        )
        return evaluation_id, report


def check_approvable(state: State, model_id: str, evaluation_id: str) -> tuple[str, str]:
    """The full ids, once the record verifies, both objects still hash to their ids,
    and the evaluation proves its claims for the model under the policy in force;
    raises `ReleaseRefused` with the reason otherwise."""
    with state.lock():
        entries = state.entries()
        problems = ledger.verify_chain(entries) + registry.check(state.client, entries)
        if problems:
            raise ReleaseRefused(
                "Not approved: the record does not verify; fix it first: " + " ".join(problems)
            )
        policy = state.policy()
        try:
            model_id = state.store.resolve(model_id)
            evaluation_id = state.store.resolve(evaluation_id)
            state.store.get(model_id)  # The model's bytes, not only its name.
            report = evaluation.load_report(state.store, evaluation_id)
            evaluation.verify_report(report, model_id=model_id, policy=policy)
        except (StoreError, evaluation.EvaluationMismatch) as err:
            raise ReleaseRefused(f"Not approved: {err}") from None
        return model_id, evaluation_id


def approve(state: State, model_id: str, evaluation_id: str, key_path: Path, signer: str) -> dict:
    """Verifies the record, both objects and the evaluation for `model_id` under the
    policy in force, signs, and appends an approve entry. Refuses (changing
    nothing) on any mismatch."""
    with state.lock():
        model_id, evaluation_id = check_approvable(state, model_id, evaluation_id)
        policy = state.policy()
        private = signing.load_private(key_path)
        approval = signing.sign_approval(
            private, model_id=model_id, evaluation_id=evaluation_id, policy=policy, signer=signer
        )
        try:
            signing.verify_approval(approval, signing.read_keyring(state.keys))
        except signing.SignatureRefused as err:
            raise ReleaseRefused(f"Not approved: {err}") from None
        entry = ledger.append(state.ledger_path, "approve", {"approval": approval})
        registry.sync(state.client, state.entries())
        return entry


# RELEASE AND ROLLBACK --------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    model_id: str
    previous_model_id: str | None
    entry: dict
    readiness: dict
    switched: dict | None
    timings: dict


def _readiness(state: State, model_id: str, host, timeout_s: float) -> dict:
    from engineering_release import gates

    if host is None:
        try:
            _, check = gates.prepare_candidate(state.store.root, model_id)
        except (StoreError, ValueError) as err:
            raise ReleaseRefused(f"The candidate never became ready: {err}") from None
        if not check["passed"]:
            raise ReleaseRefused(f"The candidate's golden self-test failed: {check}.")
        return {"where": "in-process (no serving host)", **check}
    staged = host.stage(model_id)
    if staged["status"] == "ready" and staged["model_id"] == model_id and staged.get("port"):
        return {"where": f"host candidate on port {staged['port']}", "status": "ready"}
    try:
        body = host.wait_ready(staged["port"], timeout_s)
    except RuntimeError as err:
        host.discard(model_id)
        raise ReleaseRefused(f"Traffic stays on the previous release: {err}.") from None
    return {"where": f"host candidate on port {staged['port']}", **body}


def _promote(
    state: State,
    kind: str,
    model_id: str,
    approve_entry: dict | None,
    body_of,
    readiness_timeout_s: float,
) -> Outcome:
    from engineering_release import gates, serve

    crashpoint("release-start")
    t0 = time.perf_counter()
    entries = state.entries()
    problems = ledger.verify_chain(entries) + registry.check(state.client, entries)
    if problems:
        raise ReleaseRefused("The record does not verify; fix it first: " + " ".join(problems))
    try:
        passed = gates.promotion_gate(
            state.store,
            entries,
            signing.read_keyring(state.keys),
            state.policy(),
            model_id,
            approve_entry=approve_entry,
        )
    except gates.GateRefused as err:
        raise ReleaseRefused(str(err)) from None
    crashpoint("gates-passed")
    t1 = time.perf_counter()
    host = serve.find_host(state.host_file)
    try:
        ready = _readiness(state, passed.model_id, host, readiness_timeout_s)
        crashpoint("candidate-ready")
        t2 = time.perf_counter()
        previous = ledger.serving_model(entries)
        entry = ledger.append(
            state.ledger_path, kind, body_of(entries, passed), crashpoint=crashpoint
        )
        registry.sync(state.client, state.entries(), crashpoint=crashpoint)
        crashpoint("registry-synced")
        t3 = time.perf_counter()
        switched = None
        if host is not None:
            switched = host.switch(passed.model_id)
        crashpoint("switched")
    finally:
        if host is not None:
            host.close()
    t4 = time.perf_counter()
    return Outcome(
        kind,
        passed.model_id,
        previous,
        entry,
        ready,
        switched,
        {"gates_s": t1 - t0, "readiness_s": t2 - t1, "commit_s": t3 - t2, "switch_s": t4 - t3},
    )


def release(state: State, model_id: str, *, readiness_timeout_s: float = 120.0) -> Outcome:
    """Releases `model_id`: gates, readiness, commit, registry, switch."""
    with state.lock():
        return _release(state, model_id, readiness_timeout_s)


def _release(state: State, model_id: str, readiness_timeout_s: float) -> Outcome:
    def body(entries: list[dict], passed) -> dict:
        return ledger.release_body(entries, passed.approve_entry)

    model_id = state.store.resolve(model_id)  # StoreError names an unknown id.
    if ledger.serving_model(state.entries()) == model_id:
        raise ReleaseRefused(f"Model `{model_id[:12]}` is already the serving release.")
    return _promote(state, "release", model_id, None, body, readiness_timeout_s)


def rollback(state: State, to: str | None = None, *, readiness_timeout_s: float = 120.0) -> Outcome:
    """A new log entry returning to an earlier release (default: the previous one),
    through the same gates as a release, with that release's approval."""
    with state.lock():
        return _rollback(state, to, readiness_timeout_s)


def _rollback(state: State, to: str | None, readiness_timeout_s: float) -> Outcome:
    entries = state.entries()
    try:
        target = ledger.rollback_target(entries, to)
    except ledger.LedgerError as err:
        raise ReleaseRefused(f"Rollback refused: {err}") from None
    if target["body"]["model_id"] == ledger.serving_model(entries):
        raise ReleaseRefused("That release is the one serving now.")
    approve_entry = ledger.by_hash(entries)[target["body"]["approval"]]

    def body(entries: list[dict], passed) -> dict:
        return ledger.rollback_body(entries, target)

    return _promote(
        state, "rollback", target["body"]["model_id"], approve_entry, body, readiness_timeout_s
    )


# STATUS AND VERIFY -----------------------------------------------------------


def status(state: State) -> dict:
    """What serves, what served before, and what the registry and a running host say."""
    with state.lock():
        return _status(state)


def _status(state: State) -> dict:
    from engineering_release import serve

    entries = state.entries()
    problems = ledger.verify_chain(entries) or registry.check(state.client, entries)
    if problems:
        raise ledger.LedgerError(
            f"The record does not verify ({problems[0]}); it cannot say what serves. "
            f"`verify` lists every problem."
        )
    out = {
        "log_entries": len(entries),
        "serving": ledger.serving_model(entries),
        "previous": ledger.previous_model(entries),
        "registry": registry.state(state.client),
        "objects": len(state.store.ids()),
        "host": None,
    }
    host = serve.find_host(state.host_file)
    if host is not None:
        try:
            snap = host.state()
            out["host"] = {
                "port": host.port,
                "serving": snap["serving"],
                "candidates": list(snap["candidates"]),
            }
        finally:
            host.close()
    return out


def verify(state: State, *, host_wait_s: float = 30.0) -> list[str]:
    """Every problem with the record, as sentences; empty when it all holds:
    the log's chain and references, every approval's signature, every stored
    object's digest, every released model's bound evaluation, the registry
    against the log, and (if a host runs) what it serves."""
    with state.lock():
        return _verify(state, host_wait_s)


def _verify(state: State, host_wait_s: float) -> list[str]:
    from engineering_release import serve

    problems: list[str] = []
    try:
        state.policy()
    except ConfigError as err:
        problems.append(f"The policy in force cannot be read: {err}")
    entries = state.entries()
    problems += ledger.verify_chain(entries)
    problems += ledger.verify_references(entries)
    keyring = signing.read_keyring(state.keys)
    for obj in state.store.ids():
        try:
            state.store.get(obj)
        except TamperedObject as err:
            problems.append(str(err))
    verified_evaluations: set[tuple[str, str]] = set()
    for entry in entries:
        if entry["kind"] != "approve":
            continue
        approval = entry["body"]["approval"]
        try:
            signing.verify_approval(approval, keyring)
        except (signing.SignatureRefused, KeyError, ValueError) as err:
            problems.append(f"Entry {entry['seq']}: {err}")
        pair = (approval["model_id"], approval["evaluation_id"])
        if pair in verified_evaluations:
            continue
        verified_evaluations.add(pair)
        for obj in pair:
            if not state.store.has(obj):
                problems.append(
                    f"Entry {entry['seq']} names object `{obj[:12]}`, not in the store."
                )
        try:
            policy = Policy.model_validate(approval["policy"])
        except pydantic.ValidationError as err:
            field = ".".join(str(p) for p in err.errors()[0]["loc"]) or "(policy)"
            problems.append(
                f"Entry {entry['seq']}: the approval's policy field `{field}` is invalid."
            )
            continue
        try:
            report = evaluation.load_report(state.store, approval["evaluation_id"])
            evaluation.verify_report(report, model_id=approval["model_id"], policy=policy)
        except (evaluation.EvaluationMismatch, StoreError) as err:
            problems.append(f"Entry {entry['seq']}: evaluation refused: {err}")
    problems += registry.check(state.client, entries)
    host = serve.find_host(state.host_file)
    if host is not None and not ledger.verify_chain(entries):
        want = ledger.serving_model(entries)
        try:
            deadline = time.monotonic() + host_wait_s
            serving = host.state()["serving"]
            while serving != want and time.monotonic() < deadline:  # The host follows the log.
                time.sleep(0.1)
                serving = host.state()["serving"]
            if serving != want:
                problems.append(
                    f"The serving host serves `{str(serving)[:12]}`, "
                    f"the log says `{str(want)[:12]}`."
                )
        finally:
            host.close()
    return problems
