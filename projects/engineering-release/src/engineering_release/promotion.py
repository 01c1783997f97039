"""Release and rollback: the promotion gate, readiness, commit, registry, switch.

A release: the promotion gate (signature, bound evaluation, thresholds) ->
readiness (the serving host's candidate server, or an in-process self-test
when no host runs) -> COMMIT (one atomic rename of the log) -> registry
aliases follow the log -> traffic switch. Nothing before the commit changes
the record; everything after it is derived from the record and is redone by
`recover` (every command runs it first), so a release killed at any moment
ends as the old release or the new one. A rollback is a release of an earlier
release's model, with that release's approval.

The gates run under the state's lock; readiness (a candidate takes seconds to
load) runs without it; the commit, the registry and the switch run under it
again, so switches follow the log's order. When the log grew while the
candidate got ready, the decision and the gates are made again on it, and a
refusal then discards the candidate.
"""

import time
from dataclasses import dataclass

from engineering_release import ledger, registry, signing
from engineering_release.state import ReleaseRefused, State, crashpoint
from engineering_release.store import StoreError


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


def _gate(state: State, decide):
    """Under the lock: the record verifies, `decide(entries)` names what to promote
    (`(model_id, approve_entry, body_of)`, or refuses), and it passes the
    promotion gate. Returns `(entries, passed, body_of)`."""
    from engineering_release import gates

    entries = state.entries()
    problems = ledger.verify_chain(entries) + registry.check(state.client, entries)
    if problems:
        raise ReleaseRefused("The record does not verify; fix it first: " + " ".join(problems))
    model_id, approve_entry, body_of = decide(entries)
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
    return entries, passed, body_of


def _promote(state: State, kind: str, decide, readiness_timeout_s: float) -> Outcome:
    """Gates (locked), readiness (unlocked: a candidate takes seconds to load), then
    the commit, the registry and the switch (locked, so switches follow the log's
    order). When the log grew while the candidate got ready, the decision and the
    gates are made again on it; a refusal then discards the candidate."""
    from engineering_release import serve

    crashpoint("release-start")
    t0 = time.perf_counter()
    with state.lock():
        entries, passed, body_of = _gate(state, decide)
    crashpoint("gates-passed")
    t1 = time.perf_counter()
    host = serve.find_host(state.host_file)
    try:
        ready = _readiness(state, passed.model_id, host, readiness_timeout_s)
        crashpoint("candidate-ready")
        t2 = time.perf_counter()
        with state.lock():
            if state.entries() != entries:
                readied = passed.model_id
                try:
                    entries, passed, body_of = _gate(state, decide)
                    if passed.model_id != readied:
                        raise ReleaseRefused(
                            f"The log changed while `{readied[:12]}` got ready; this "
                            f"{kind} now names `{passed.model_id[:12]}`. Run it again."
                        )
                except ReleaseRefused:
                    if host is not None:
                        host.discard(readied)
                    raise
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
    model_id = state.store.resolve(model_id)  # StoreError names an unknown id.

    def decide(entries: list[dict]):
        if ledger.serving_model(entries) == model_id:
            raise ReleaseRefused(f"Model `{model_id[:12]}` is already the serving release.")

        def body(entries: list[dict], passed) -> dict:
            return ledger.release_body(entries, passed.approve_entry)

        return model_id, None, body

    return _promote(state, "release", decide, readiness_timeout_s)


def rollback(state: State, to: str | None = None, *, readiness_timeout_s: float = 120.0) -> Outcome:
    """A new log entry returning to an earlier release (default: the previous one),
    through the same gates as a release, with that release's approval."""

    def decide(entries: list[dict]):
        try:
            target = ledger.rollback_target(entries, to)
        except ledger.LedgerError as err:
            raise ReleaseRefused(f"Rollback refused: {err}") from None
        if target["body"]["model_id"] == ledger.serving_model(entries):
            raise ReleaseRefused("That release is the one serving now.")
        approve_entry = ledger.by_hash(entries)[target["body"]["approval"]]

        def body(entries: list[dict], passed) -> dict:
            return ledger.rollback_body(entries, target)

        return target["body"]["model_id"], approve_entry, body

    return _promote(state, "rollback", decide, readiness_timeout_s)
