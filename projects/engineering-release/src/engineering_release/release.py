"""The release state's procedures: register, evaluate, approve, release,
rollback, status, verify (release and rollback live in `promotion`, the state,
its lock and recovery in `state`; both are re-exported here).

Every procedure holds the state's lock (`State.lock`, reentrant) for its
commit only: the reads that decide a change, the checks that must hold when
it is written, the write and its fsync. What takes seconds runs before,
unlocked: training (in the command line), a model's held-out predictions for
an evaluation, the checks and the signature of an approval, a candidate's
readiness. Under the lock, what that work assumed is checked again: the
policy it used is the one in force, the record still verifies, and, when the
log has grown meanwhile, a release's gates pass on the log as it is now (else
the release is refused and its candidate discarded). So a concurrent change is
never lost and never overwritten: it is seen, and the later command is
refused with the reason or goes on from it. A success is reported only after
it is on disk. A procedure that fails leaves nothing behind: a model or report
it stored for a registration that then failed is removed.
"""

import time
from pathlib import Path

import pydantic

from engineering_release import evaluation, ledger, registry, signing
from engineering_release.config import ConfigError, Policy
from engineering_release.promotion import Outcome, release, rollback
from engineering_release.state import (
    CRASH_ENV,
    CRASH_POINTS,
    DEFAULT_ROOT,
    ReleaseRefused,
    State,
    StateError,
    crashpoint,
    recover,
)
from engineering_release.store import StoreError, TamperedObject

__all__ = [
    "CRASH_ENV",
    "CRASH_POINTS",
    "DEFAULT_ROOT",
    "Outcome",
    "ReleaseRefused",
    "State",
    "StateError",
    "StoreError",
    "approve",
    "check_approvable",
    "crashpoint",
    "evaluate",
    "recover",
    "register",
    "release",
    "rollback",
    "status",
    "verify",
]


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
    report and tags the registry version with it; returns `(evaluation_id, report)`.

    The predictions run unlocked (the store's objects never change); under the
    lock the model must be registered and the policy the same as the one
    evaluated under, else `ReleaseRefused` and nothing is stored."""
    from engineering_release import data

    model_id = state.store.resolve(model_id)
    with state.lock():  # Briefly: a model that is not registered is refused first.
        _registered(state, model_id)
    policy = state.policy()
    model_dir = state.store.get(model_id)
    examples = data.heldout_set(policy.split_seed, policy.test_fraction)
    predictions = evaluation.predict_heldout(model_dir, examples)
    report = evaluation.build_report(model_id, predictions, policy)
    with state.lock():
        _registered(state, model_id)
        _same_policy(state, policy, "evaluating")
        before = set(state.store.ids())
        evaluation_id = evaluation.store_report(state.store, report)
        existed = evaluation_id in before
        _stored_new(
            state,
            evaluation_id,
            existed,
            lambda: registry.tag_evaluation(state.client, model_id, evaluation_id),
        )
        return evaluation_id, report


def _registered(state: State, model_id: str) -> None:
    """Refuses a model that is not registered (call under the lock: the registry)."""
    if registry.version_of(state.client, model_id) is None:
        raise ReleaseRefused(f"Model `{model_id[:12]}` is in the store but not registered.")


def _same_policy(state: State, policy: Policy, doing: str) -> None:
    """Refuses when the policy in force is no longer `policy` (changed while `doing`)."""
    if state.policy().to_dict() != policy.to_dict():
        raise ReleaseRefused(
            f"The policy in force changed while {doing}; nothing was written. Run the "
            "command again."
        )


def _record_problems(state: State) -> list[str]:
    """The log's and the registry's problems (call under the lock)."""
    entries = state.entries()
    return ledger.verify_chain(entries) + registry.check(state.client, entries)


def check_approvable(state: State, model_id: str, evaluation_id: str) -> tuple[str, str]:
    """The full ids, once the record verifies, both objects still hash to their ids,
    and the evaluation proves its claims for the model under the policy in force;
    raises `ReleaseRefused` with the reason otherwise."""
    model_id, evaluation_id, _ = _approvable(state, model_id, evaluation_id)
    return model_id, evaluation_id


def _approvable(state: State, model_id: str, evaluation_id: str) -> tuple[str, str, Policy]:
    """`check_approvable` and the policy it checked under. The record is checked
    under the lock; the objects and the evaluation (which may rerun the model's
    predictions) after it, unlocked."""
    with state.lock():
        problems = _record_problems(state)
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
    return model_id, evaluation_id, policy


def approve(state: State, model_id: str, evaluation_id: str, key_path: Path, signer: str) -> dict:
    """Verifies the record, both objects and the evaluation for `model_id` under the
    policy in force, signs, and appends an approve entry. Refuses (changing
    nothing) on any mismatch.

    The checks and the signature run unlocked; under the lock the record must
    still verify, the policy be the one signed, and the key trusted by the
    keyring as it is then, before the entry is appended."""
    model_id, evaluation_id, policy = _approvable(state, model_id, evaluation_id)
    private = signing.load_private(key_path)
    approval = signing.sign_approval(
        private, model_id=model_id, evaluation_id=evaluation_id, policy=policy, signer=signer
    )
    with state.lock():
        problems = _record_problems(state)
        if problems:
            raise ReleaseRefused(
                "Not approved: the record does not verify; fix it first: " + " ".join(problems)
            )
        _same_policy(state, policy, "approving")
        try:
            signing.verify_approval(approval, signing.read_keyring(state.keys))
        except signing.SignatureRefused as err:
            raise ReleaseRefused(f"Not approved: {err}") from None
        entry = ledger.append(state.ledger_path, "approve", {"approval": approval})
        registry.sync(state.client, state.entries())
        return entry


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
