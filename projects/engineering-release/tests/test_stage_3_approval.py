"""Stage 3: approval and rollback.

Approvals are Ed25519 signatures over (model id, evaluation id, policy); the
release log is hash-chained; a rollback is a new entry; the registry's
aliases follow the log. Independent checks: OpenSSL verifies our signatures
from the public key alone, and the chain is recomputed here with hashlib.
Changed conditions: two keys and two models; an edited, reordered, deleted
and truncated log; an alias moved behind the log's back.
"""

import base64
import datetime as dt
import hashlib
import json
import shutil
import subprocess

import pytest
from conftest import fresh_state
from cryptography.hazmat.primitives import serialization

from engineering_release import evaluation, ledger, registry, release, signing
from engineering_release.config import Policy


def approval_for(state, model_id: str, pem, **kw) -> dict:
    evaluation_id, _ = evaluation.evaluate(state.store, model_id, state.policy())
    return signing.sign_approval(
        signing.load_private(pem),
        model_id=model_id,
        evaluation_id=evaluation_id,
        policy=state.policy(),
        signer=pem.stem,
        **kw,
    )


# --- In memory: the chain, the registry check and the signature, against references ---


def _reference_hash(entry: dict) -> str:
    body = {k: entry[k] for k in ("seq", "kind", "prev", "body")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _reference_chain(bodies: list[tuple[str, dict]]) -> list[dict]:
    out, prev = [], "0" * 64
    for i, (kind, body) in enumerate(bodies):
        entry = {"seq": i, "kind": kind, "prev": prev, "body": body}
        entry["hash"] = _reference_hash(entry)
        out.append(entry)
        prev = entry["hash"]
    return out


A, B, C = "a" * 64, "b" * 64, "c" * 64
BODIES = [
    ("approve", {"approval": {"model_id": A}}),
    ("approve", {"approval": {"model_id": B}}),
    ("release", {"model_id": A, "approval": "x", "previous_model_id": None}),
    ("release", {"model_id": B, "approval": "y", "previous_model_id": A}),
]


@pytest.mark.claims("entry-links-and-seals", "hash-chained-log")
def test_make_entry_links_and_seals_like_the_reference():
    """make_entry builds the 4-entry chain a hashlib reference builds; unknown kinds are refused."""
    reference = _reference_chain(BODIES)
    built: list[dict] = []
    for kind, body in BODIES:
        built.append(ledger.make_entry(built, kind, body))
    assert built == reference
    with pytest.raises(ledger.LedgerError, match="Unknown entry kind `delete`"):
        ledger.make_entry(built, "delete", {})


@pytest.mark.claims(
    "chain-seq-check",
    "chain-prev-check",
    "chain-hash-check",
    "chain-one-sentence-per-break",
    "hash-chained-log",
)
def test_verify_chain_names_each_break_exactly():
    """verify_chain names exactly one break for each edited, re-sealed or re-numbered entry, hashes
    from hashlib."""
    chain = _reference_chain(BODIES)
    assert ledger.verify_chain(chain) == []
    orders = set()
    for k in range(len(chain)):
        for value in ("edited", "other", 7):
            edited = json.loads(json.dumps(chain))
            edited[k]["body"]["note"] = value
            actual, recorded = _reference_hash(edited[k]), chain[k]["hash"]
            orders.add(recorded < actual)
            assert ledger.verify_chain(edited) == [
                f"Entry {k} ({chain[k]['kind']}) was edited: it hashes to `{actual[:12]}`, "
                f"not to its recorded `{recorded[:12]}`."
            ]
            if k + 1 < len(chain):  # edited and re-sealed: only the next link can tell
                edited[k]["hash"] = actual
                assert ledger.verify_chain(edited) == [
                    f"Entry {k + 1} points at `{recorded[:12]}`, but the entry before it "
                    f"hashes to `{actual[:12]}`: an entry was edited, removed or reordered."
                ]
    assert orders == {True, False}  # recorded hashes below and above the actual ones
    last = len(chain) - 1
    for seq in (last - 1, last + 1):  # a seq too small and too large, re-sealed
        edited = json.loads(json.dumps(chain))
        edited[last]["seq"] = seq
        edited[last]["hash"] = _reference_hash(edited[last])
        assert ledger.verify_chain(edited) == [
            f"Entry {last} has seq `{seq}`: reordered or removed."
        ]


class _Version:
    def __init__(self, model_id):
        self.tags = {"model_id": model_id}


class _FakeRegistry:
    """The two registry calls `registry.state` makes, over plain values."""

    def __init__(self, champion, previous, length, head):
        self.aliases = {"champion": champion, "previous": previous}
        self.tags = {"ledger.length": str(length), "ledger.head": head}

    def get_registered_model(self, name):
        assert name == registry.MODEL_NAME
        return type("Model", (), {"tags": self.tags})()

    def get_model_version_by_alias(self, name, alias):
        from mlflow.exceptions import MlflowException

        if self.aliases[alias] is None:
            raise MlflowException(f"no alias {alias}")
        return _Version(self.aliases[alias])


@pytest.mark.claims(
    "registry-check-deleted-entries",
    "registry-check-changed-entry",
    "registry-check-stale-keys",
    "registry-check-lag-is-stale-only",
    "registry-anchor-catches-deleted-tail",
)
def test_registry_check_names_every_disagreement():
    """registry.check lists, in order, every stale alias, lost entry and moved anchor of a fake
    registry."""
    chain = _reference_chain(BODIES)
    h = [e["hash"] for e in chain]
    assert registry.check(_FakeRegistry(B, A, 4, h[3]), chain) == []
    # The registry lags (log one entry longer): not lost history, only stale aliases.
    assert registry.check(_FakeRegistry(A, None, 3, h[2]), chain) == [
        f"The registry's `champion` is `{A[:12]}`, the log says `{B[:12]}`.",
        f"The registry's `previous` is `None`, the log says `{A[:12]}`.",
        "The registry's `ledger.length` is `3`, the log says `4`.",
        f"The registry's `ledger.head` is `{h[2][:12]}`, the log says `{h[3][:12]}`.",
    ]
    assert registry.check(_FakeRegistry(B, A, 5, h[3]), chain) == [
        "The registry anchored 5 log entries, but the log holds 4: committed entries were deleted.",
        "The registry's `ledger.length` is `5`, the log says `4`.",
    ]
    for head in ("f" * 64, "0" * 63 + "1"):  # an anchor above and below the entry's hash
        assert registry.check(_FakeRegistry(B, A, 4, head), chain) == [
            f"Log entry 3 does not hash to the registry's anchor `{head[:12]}`: a committed "
            "entry was changed.",
            f"The registry's `ledger.head` is `{head[:12]}`, the log says `{h[3][:12]}`.",
        ]
    for moved in (A, C):  # the champion moved to a smaller and to a larger id
        assert registry.check(_FakeRegistry(moved, A, 4, h[3]), chain) == [
            f"The registry's `champion` is `{moved[:12]}`, the log says `{B[:12]}`."
        ]


# A log written by hand: each approval has its own evaluation id and signing date,
# so the rollback target's approval, evaluation and age tell which release it is.
NOW = dt.datetime(2026, 6, 30, 12, 0, 0, tzinfo=dt.UTC)
SIGNED = {
    "a1": "2026-03-01T12:00:00Z",
    "a2": "2026-05-01T12:00:00Z",
    "a3": "2026-06-25T12:00:00Z",
    "b1": "2026-04-01T12:00:00Z",
    "b2": "2026-06-10T12:00:00Z",
    "c1": "2026-05-15T12:00:00Z",
}
MODEL_OF = {"a": A, "b": B, "c": C}


def _hand_approval(tag: str) -> dict:
    """A well-formed approval body for the tag's model (the log does not check signatures)."""
    return {
        "model_id": MODEL_OF[tag[0]],
        "evaluation_id": hashlib.sha256(f"evaluation {tag}".encode()).hexdigest(),
        "policy": {"min_accuracy": 0.8},
        "policy_sha256": "d" * 64,
        "key_id": "0123456789abcdef",
        "signer": "alice",
        "signed_at": SIGNED[tag],
        "signature": "c2lnbmF0dXJl",
    }


def _hand_log(steps: list[tuple[str, str]]) -> tuple[list[dict], dict[str, str]]:
    """The log of `steps`, built with the hashlib reference: `("approve", tag)`,
    `("release", tag)` (with that approval), `("rollback", seq)` (to that entry). The
    serving model is tracked here, by hand. Returns the entries and tag -> approve hash."""
    entries: list[dict] = []
    approve_hash: dict[str, str] = {}
    serving = None
    for kind, arg in steps:
        if kind == "approve":
            body = {"approval": _hand_approval(arg)}
        elif kind == "release":
            body = {
                "model_id": MODEL_OF[arg[0]],
                "approval": approve_hash[arg],
                "previous_model_id": serving,
            }
        else:
            to = entries[arg]
            body = {
                "model_id": to["body"]["model_id"],
                "to": to["hash"],
                "approval": to["body"]["approval"],
                "previous_model_id": serving,
            }
        entry = {
            "seq": len(entries),
            "kind": kind,
            "prev": entries[-1]["hash"] if entries else "0" * 64,
            "body": body,
        }
        entry["hash"] = _reference_hash(entry)
        entries.append(entry)
        if kind == "approve":
            approve_hash[arg] = entry["hash"]
        else:
            serving = body["model_id"]
    return entries, approve_hash


# (steps, seq of A's LATEST release or rollback entry, its approval's tag, that approval's
# age in days at NOW): counted by hand from the steps. B or C serves last, A before it.
ROLLBACK_LOGS = {
    "A released once": (
        [("approve", "a1"), ("approve", "b1"), ("release", "a1"), ("release", "b1")],
        2,
        "a1",
        121.0,
    ),
    "A released twice, B between, C last": (
        [
            ("approve", "a1"),
            ("release", "a1"),
            ("approve", "b1"),
            ("release", "b1"),
            ("approve", "a2"),
            ("release", "a2"),
            ("approve", "c1"),
            ("release", "c1"),
        ],
        5,
        "a2",
        60.0,
    ),
    "A released 3 times, B, C and a rollback to B between": (
        [
            ("approve", "a1"),
            ("release", "a1"),
            ("approve", "b1"),
            ("release", "b1"),
            ("approve", "a2"),
            ("release", "a2"),
            ("approve", "c1"),
            ("release", "c1"),
            ("rollback", 3),
            ("approve", "a3"),
            ("release", "a3"),
            ("release", "c1"),
        ],
        10,
        "a3",
        5.0,
    ),
    "A's latest entry a rollback to its 2nd release": (
        [
            ("approve", "a1"),
            ("release", "a1"),
            ("approve", "b1"),
            ("release", "b1"),
            ("approve", "a2"),
            ("release", "a2"),
            ("approve", "b2"),
            ("release", "b2"),
            ("rollback", 5),
            ("approve", "c1"),
            ("release", "c1"),
        ],
        8,
        "a2",
        60.0,
    ),
}


@pytest.mark.claims("rollback-is-a-new-entry")
@pytest.mark.parametrize("case", list(ROLLBACK_LOGS))
def test_default_rollback_returns_to_the_previous_models_latest_release(case, tmp_path, evidence):
    """The default rollback target is the LATEST release or rollback entry of the model that served
    before the current one (its approval, evaluation and age), in logs written by hand where that
    model was released once, twice and three times with other releases between."""
    steps, seq, tag, age_days = ROLLBACK_LOGS[case]
    entries, approve_hash = _hand_log(steps)
    head_model = entries[-1]["body"]["model_id"]
    assert head_model != A and entries[-1]["body"]["previous_model_id"] == A  # the premise
    a_entries = [e["seq"] for e in entries if e["kind"] != "approve" and e["body"]["model_id"] == A]
    assert a_entries[-1] == seq  # the hand count agrees with the log as written
    target = ledger.rollback_target(entries)
    approves = {e["hash"]: e for e in entries if e["kind"] == "approve"}
    approval = approves.get(target["body"]["approval"], {"body": {"approval": {}}})["body"][
        "approval"
    ]
    signed_at = approval.get("signed_at")
    observed = {
        "target_seq": target["seq"],
        "target_kind": target["kind"],
        "target_is_the_entry_written": target == entries[seq],
        "model_id": target["body"]["model_id"][:12],
        "approval_is_tags": target["body"]["approval"] == approve_hash[tag],
        "evaluation_id": str(approval.get("evaluation_id"))[:12],
        "age_days": (
            (NOW - dt.datetime.strptime(signed_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC))
            / dt.timedelta(days=1)
            if signed_at
            else None
        ),
        "releases_of_a": a_entries,
    }
    expected_eval = hashlib.sha256(f"evaluation {tag}".encode()).hexdigest()
    ok = (
        observed["target_seq"] == seq
        and observed["target_kind"] == steps[seq][0]
        and observed["target_is_the_entry_written"]
        and target["body"]["model_id"] == A
        and observed["approval_is_tags"]
        and approval.get("evaluation_id") == expected_eval
        and observed["age_days"] == age_days
    )
    # The rollback entry that follows carries that target, and is accepted by the log.
    body = ledger.rollback_body(entries, target)
    expected_body = {
        "model_id": A,
        "to": entries[seq]["hash"],
        "approval": approve_hash[tag],
        "previous_model_id": head_model,
    }
    observed["rollback_body_fields_equal"] = {k: body.get(k) == v for k, v in expected_body.items()}
    ok &= body == expected_body
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
    entry = ledger.append(path, "rollback", body)
    after = ledger.read(path)
    ok &= (
        entry["seq"] == len(entries)
        and entry["prev"] == entries[-1]["hash"]
        and ledger.serving_model(after) == A
        and ledger.previous_model(after) == head_model
        and after[:-1] == entries
    )
    assert evidence.record(
        "default rollback target: the previous model's latest release entry",
        case,
        observed,
        {"target_seq": seq, "approval": tag, "age_days": age_days},
        ok,
    ), observed


def _keyring(private, not_before: str, not_after: str) -> dict:
    public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    kid = hashlib.sha256(public).hexdigest()[:16]
    entry = {"name": "k", "not_before": not_before, "not_after": not_after}
    return {kid: {**entry, "public_key": base64.b64encode(public).decode()}}


@pytest.mark.claims(
    "ed25519-approvals",
    "approval-fields-and-signature",
    "approval-key-window-inclusive",
    "approval-policy-digest",
    "approval-signature-verifies",
)
def test_signature_covers_the_fields_and_the_key_window_is_inclusive():
    """The signature verifies over the documented JSON fields, a key is valid at both window ends,
    edits are refused."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    at = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    policy = Policy()
    approval = signing.sign_approval(
        private, model_id=A, evaluation_id=B, policy=policy, signer="alice", signed_at=at
    )
    assert approval["signed_at"] == "2026-03-04T05:06:07Z"
    fields = ("model_id", "evaluation_id", "policy", "policy_sha256", "key_id", "signer")
    payload = json.dumps(
        {k: approval[k] for k in (*fields, "signed_at")}, sort_keys=True, separators=(",", ":")
    ).encode()
    private.public_key().verify(base64.b64decode(approval["signature"]), payload)
    ring = _keyring(private, "2026-03-04T05:06:07Z", "2026-03-04T05:06:07Z")
    signing.verify_approval(approval, ring)  # signed at both ends of the window at once
    for nb, na in (
        ("2026-03-04T05:06:08Z", "2026-04-01T00:00:00Z"),
        ("2026-01-01T00:00:00Z", "2026-03-04T05:06:06Z"),
    ):
        with pytest.raises(signing.SignatureRefused, match="expired or not yet valid"):
            signing.verify_approval(approval, _keyring(private, nb, na))
    ring = _keyring(private, "2026-01-01T00:00:00Z", "2026-12-31T00:00:00Z")
    # The recorded policy digest below and above the policy's own (and the policy edited).
    edited = {**approval, "policy": {**approval["policy"], "min_accuracy": 0.5}}
    for forged in (
        {**approval, "policy_sha256": "0" * 64},
        {**approval, "policy_sha256": "f" * 64},
        edited,
    ):
        with pytest.raises(signing.SignatureRefused, match="`policy_sha256` does not match"):
            signing.verify_approval(forged, ring)
    with pytest.raises(signing.SignatureRefused, match="signature does not verify with key"):
        signing.verify_approval({**approval, "signer": "mallory"}, ring)


@pytest.fixture
def state(registry_template, tmp_path):
    template, models = registry_template
    return fresh_state(template, tmp_path), models


@pytest.mark.claims("ed25519-approvals", "approval-signature-verifies")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the `openssl` command line")
def test_openssl_verifies_our_signatures(state, tmp_path, evidence):
    """OpenSSL accepts each of two keys' signatures on the approval payload and rejects it with the
    model id changed."""
    state, models = state
    for name, seed in (("alice", 0), ("bob", 1)):
        _, pem = signing.generate_key(state.keys, name)
        approval = approval_for(state, models[seed], pem)
        public = (
            signing.load_private(pem)
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        (tmp_path / "pub.pem").write_bytes(public)
        (tmp_path / "sig").write_bytes(base64.b64decode(approval["signature"]))
        results = {}
        for label, payload in (
            ("as signed", signing.approval_payload(approval)),
            (
                "model id changed",
                signing.approval_payload({**approval, "model_id": models[1 - seed]}),
            ),
        ):
            (tmp_path / "payload").write_bytes(payload)
            out = subprocess.run(
                [
                    "openssl",
                    "pkeyutl",
                    "-verify",
                    "-pubin",
                    "-inkey",
                    "pub.pem",
                    "-rawin",
                    "-in",
                    "payload",
                    "-sigfile",
                    "sig",
                ],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                check=False,
            )
            results[label] = out.returncode
        signing.verify_approval(approval, signing.read_keyring(state.keys))
        ok = results == {"as signed": 0, "model id changed": 1}
        assert evidence.record(
            "openssl verifies the Ed25519 approval",
            f"key {name}, seed {seed}",
            {"openssl_exit": results},
            {"as signed": 0, "changed": 1},
            ok,
        )


@pytest.mark.claims(
    "ed25519-approvals",
    "approval-key-in-keyring",
    "approval-policy-digest",
    "approval-signature-verifies",
)
def test_refused_approvals(state, evidence):
    """Foreign or expired keys and edited model, evaluation or policy are refused; a refused approve
    appends nothing."""
    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    _, foreign = signing.generate_key(state.keys, "mallory", trust=False)
    long_ago = signing.now_utc() - dt.timedelta(days=400)
    _, expired = signing.generate_key(state.keys, "retired", valid_days=30, not_before=long_ago)
    ring = signing.read_keyring(state.keys)
    good = approval_for(state, models[0], pem)
    signing.verify_approval(good, ring)
    cases = {
        "foreign key": (approval_for(state, models[0], foreign), "not in the trusted keyring"),
        "expired key": (approval_for(state, models[0], expired), "expired"),
        "model id edited": ({**good, "model_id": models[1]}, "does not verify"),
        "evaluation id edited": ({**good, "evaluation_id": "0" * 64}, "does not verify"),
        "policy edited": (
            {**good, "policy": {**good["policy"], "min_accuracy": 0.1}},
            "policy_sha256",
        ),
    }
    for label, (approval, message) in cases.items():
        with pytest.raises(signing.SignatureRefused, match=message) as info:
            signing.verify_approval(approval, ring)
        evidence.record("approval refused", label, {"message": str(info.value)}, None, True)
    # Through the command path: nothing is appended when refused.
    eval_a, _ = evaluation.evaluate(state.store, models[0], state.policy())
    before = state.ledger_path.read_bytes() if state.ledger_path.exists() else b""
    with pytest.raises(release.ReleaseRefused, match="judged model"):
        release.approve(state, models[1], eval_a, pem, "alice")  # A's evaluation for B.
    with pytest.raises(release.ReleaseRefused, match="not in the trusted keyring"):
        release.approve(state, models[0], eval_a, foreign, "mallory")
    after = state.ledger_path.read_bytes() if state.ledger_path.exists() else b""
    assert evidence.record(
        "refused approvals change nothing",
        "other model; foreign key",
        {"log_bytes_before": len(before), "after": len(after)},
        None,
        before == after,
    )


def _chain_reference(lines: list[str]) -> list[str]:
    """Recomputes each entry's hash the plain way, for comparison with the module."""
    out, prev = [], "0" * 64
    for line in lines:
        entry = json.loads(line)
        body = {k: entry[k] for k in ("seq", "kind", "prev", "body")}
        digest = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        out.append("ok" if entry["prev"] == prev and entry["hash"] == digest else "broken")
        prev = entry["hash"]
    return out


def _build_log(state, models, pem) -> list[dict]:
    """approve A, approve B, release A, release B, rollback to A, release B."""
    entries_of = state.entries
    a = release.approve(
        state,
        models[0],
        evaluation.evaluate(state.store, models[0], state.policy())[0],
        pem,
        "alice",
    )
    b = release.approve(
        state,
        models[1],
        evaluation.evaluate(state.store, models[1], state.policy())[0],
        pem,
        "alice",
    )
    rel_a = ledger.append(state.ledger_path, "release", ledger.release_body(entries_of(), a))
    ledger.append(state.ledger_path, "release", ledger.release_body(entries_of(), b))
    ledger.append(state.ledger_path, "rollback", ledger.rollback_body(entries_of(), rel_a))
    ledger.append(state.ledger_path, "release", ledger.release_body(entries_of(), b))
    registry.sync(state.client, entries_of())
    return entries_of()


@pytest.mark.claims("hash-chained-log")
def test_chain_detects_edits_reorders_and_deletions(state, evidence):
    """An edited, re-hashed, reordered, mid-deleted or truncated log on disk is reported, as a
    hashlib recount agrees."""
    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    entries = _build_log(state, models, pem)
    lines = state.ledger_path.read_text().splitlines()
    assert ledger.verify_chain(entries) == [] and ledger.verify_references(entries) == []
    assert _chain_reference(lines) == ["ok"] * 6
    assert registry.check(state.client, entries) == []

    def damaged(how: str) -> list[str]:
        out = list(lines)
        if how == "edit":
            entry = json.loads(out[3])
            entry["body"]["model_id"] = models[0]
            out[3] = json.dumps(entry, sort_keys=True)
        elif how == "edit-and-rehash":  # Only the next entry's `prev` can tell.
            entry = json.loads(out[3])
            entry["body"]["model_id"] = models[0]
            entry["hash"] = ledger.entry_hash(entry)
            out[3] = json.dumps(entry, sort_keys=True)
        elif how == "reorder":
            out[3], out[4] = out[4], out[3]
        elif how == "delete-middle":
            del out[2]
        elif how == "delete-last":
            del out[-1]
        return out

    for how in ("edit", "edit-and-rehash", "reorder", "delete-middle", "delete-last"):
        out = damaged(how)
        state.ledger_path.write_text("\n".join(out) + "\n")
        found = ledger.verify_chain(state.entries()) + registry.check(state.client, state.entries())
        reference = _chain_reference(out)
        detected_by_reference = "broken" in reference or len(out) < 6
        assert evidence.record(
            "damaged log detected",
            how,
            {"problems": found, "reference": reference},
            None,
            bool(found) and detected_by_reference,
        )
    state.ledger_path.write_text("\n".join(lines) + "\n")
    assert ledger.verify_chain(state.entries()) == []


@pytest.mark.claims("rollback-is-a-new-entry")
def test_rollback_is_a_new_entry_pointing_at_an_approved_release(state, evidence):
    """A rollback appends one entry pointing at A's release; entries pointing at the wrong kind of
    entry are refused."""
    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    entries = _build_log(state, models, pem)  # ... ends with B serving, A before it.
    before = state.ledger_path.read_bytes()
    target = ledger.rollback_target(entries)
    entry = ledger.append(state.ledger_path, "rollback", ledger.rollback_body(entries, target))
    registry.sync(state.client, state.entries())
    after = state.entries()
    ok = (
        state.ledger_path.read_bytes().startswith(before)
        and len(after) == len(entries) + 1
        and entry["body"]["to"] == target["hash"]
        and target["body"]["model_id"] == models[0]
        and ledger.serving_model(after) == models[0]
        and ledger.previous_model(after) == models[1]
    )
    assert evidence.record(
        "rollback appends, never deletes",
        "after release B",
        {"to": entry["body"]["to"], "entries": len(after)},
        None,
        ok,
    )
    approve_hash = entries[0]["hash"]
    with pytest.raises(ledger.LedgerError, match="earlier release"):
        ledger.append(
            state.ledger_path,
            "rollback",
            {**ledger.rollback_body(after, target), "to": approve_hash},
        )
    with pytest.raises(ledger.LedgerError, match="approve entry"):
        ledger.append(
            state.ledger_path,
            "release",
            {"model_id": models[1], "approval": "0" * 64, "previous_model_id": models[0]},
        )
    assert state.entries() == after, "refused entries are not appended"


@pytest.mark.claims("registry-aliases-follow-the-log", "registry-anchor-catches-deleted-tail")
def test_registry_aliases_follow_the_log(state, evidence):
    """MLflow aliases, read by a separate client, match the log; a moved alias is reported, a
    truncated log refused."""
    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    entries = _build_log(state, models, pem)
    from mlflow import MlflowClient

    independent = MlflowClient(
        tracking_uri=f"sqlite:///{state.root / 'registry.db'}",
        registry_uri=f"sqlite:///{state.root / 'registry.db'}",
    )
    champion = independent.get_model_version_by_alias(registry.MODEL_NAME, "champion")
    previous = independent.get_model_version_by_alias(registry.MODEL_NAME, "previous")
    ok = (
        champion.tags["model_id"] == entries[-1]["body"]["model_id"]
        and previous.tags["model_id"] == entries[-1]["body"]["previous_model_id"]
    )
    assert evidence.record(
        "aliases equal the log's serving and previous models",
        "after 4 releases and a rollback",
        {"champion": champion.version, "previous": previous.version},
        None,
        ok,
    )
    # An alias moved behind the log's back is reported, and sync moves it back.
    independent.set_registered_model_alias(registry.MODEL_NAME, "champion", previous.version)
    problems = registry.check(state.client, entries)
    assert problems and "champion" in problems[0]
    registry.sync(state.client, entries)
    assert registry.check(state.client, entries) == []
    # A truncated log is lost history: refused, never "synced" backwards.
    with pytest.raises(registry.RegistryError, match="lost entries"):
        registry.sync(state.client, entries[:-1])
    evidence.record(
        "moved alias reported and restored; truncation refused",
        "champion moved",
        {"problems": problems},
        None,
        True,
    )


@pytest.mark.claims("ed25519-approvals", "approval-fields-and-signature")
def test_policy_is_part_of_what_is_signed(state, evidence):
    """The approval holds the policy and its sha256, which differs for another min_accuracy."""
    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    approval = approval_for(state, models[0], pem)
    assert approval["policy"] == Policy().to_dict()
    assert approval["policy_sha256"] == Policy().sha256() != Policy(min_accuracy=0.95).sha256()
    evidence.record(
        "policy bound by its digest",
        "default vs min_accuracy 0.95",
        {"policy_sha256": approval["policy_sha256"]},
        None,
        True,
    )


def _perturbed(value):
    """`value` with one leaf changed (a JSON value of the same shape)."""
    if isinstance(value, dict):
        key = sorted(value)[0]
        return {**value, key: _perturbed(value[key])}
    if isinstance(value, list):
        return [_perturbed(value[0]), *value[1:]] if value else [0]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1")
    return 0


def _tamperings(obj_dir):
    """`(label, file, tampered bytes)`: one field of one file changed at a time, for
    every file of a stored object: each JSON file field by field, each leaf file's
    magic line, header fields and array bytes."""
    from engineering_release import checkpoint
    from engineering_release.config import canonical_json

    for path in sorted(p for p in obj_dir.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        if raw.startswith(checkpoint.MAGIC):
            end = raw.index(b"\n", len(checkpoint.MAGIC))
            header = json.loads(raw[len(checkpoint.MAGIC) : end])
            yield f"{path.name}: magic", path, b"ERLEAF2\n" + raw[len(checkpoint.MAGIC) :]
            for name in sorted(header):
                changed = canonical_json({**header, name: _perturbed(header[name])})
                yield f"{path.name}: {name}", path, checkpoint.MAGIC + changed + raw[end:]
            payload = bytearray(raw)
            payload[end + 1] ^= 0x01
            yield f"{path.name}: array bytes", path, bytes(payload)
        else:
            document = json.loads(raw)
            for name in sorted(document):
                changed = {**document, name: _perturbed(document[name])}
                yield f"{path.name}: {name}", path, canonical_json(changed) + b"\n"


@pytest.mark.claims("store-refuses-tampered-objects")
def test_approve_refuses_tampered_objects_field_by_field(state, evidence):
    """The approve command refuses any one changed field of the model or report objects, and
    approves them intact."""
    from click.testing import CliRunner

    from engineering_release.cli import main

    state, models = state
    _, pem = signing.generate_key(state.keys, "alice")
    eval_a, _ = evaluation.evaluate(state.store, models[0], state.policy())
    args = ["--root", str(state.root), "approve", models[0], eval_a, "--key", str(pem)]
    refused, kinds = {}, {"model": models[0], "evaluation": eval_a}
    for kind, object_id in kinds.items():
        for label, path, tampered in _tamperings(state.store.objects / object_id):
            original = path.read_bytes()
            assert tampered != original, label
            path.chmod(0o644)
            path.write_bytes(tampered)
            try:
                result = CliRunner().invoke(main, args)
            finally:
                path.write_bytes(original)
                path.chmod(0o444)
            refused[f"{kind} {label}"] = (
                result.exit_code in (1, 2)
                and f"Object `{object_id[:12]}` is tampered" in result.output
                and (result.exception is None or isinstance(result.exception, SystemExit))
            )
            assert not state.ledger_path.exists(), f"{kind} {label}: an entry was appended"
    # The negative control: the same command on the untouched objects approves.
    result = CliRunner().invoke(main, args)
    approved = result.exit_code == 0 and len(state.entries()) == 1
    fields = {kind: sum(k.startswith(kind) for k in refused) for kind in kinds}
    assert evidence.record(
        "approve refuses every tampered field of the objects it binds",
        "model: magic, header fields, array bytes of each leaf; manifest and report fields",
        {"refused": refused, "fields": fields, "untouched_approved": approved},
        None,
        all(refused.values()) and approved and fields["model"] > 20 and fields["evaluation"] >= 8,
    ), [k for k, ok in refused.items() if not ok]


@pytest.mark.parametrize("length", [7, 8, 64])
def test_a_rollback_target_named_by_prefix_needs_8_hex_digits(length, evidence):
    """The README: ids may be abbreviated to a unique prefix of at least 8 hex digits. A
    prefix one digit short is refused even when it is unique in the log; 8 digits, upper
    or lower case, and the whole hash name the entry."""
    steps = ROLLBACK_LOGS["A released twice, B between, C last"][0]
    entries, _ = _hand_log(steps)
    releases = [e for e in entries if e["kind"] in ("release", "rollback")]
    target = releases[1]
    prefix = target["hash"][:length]
    # The premise: the prefix is unique among the log's releases, so only its length decides.
    assert [e["hash"].startswith(prefix) for e in releases].count(True) == 1
    outcomes = {}
    for shown_as in (prefix, prefix.upper()):
        try:
            outcomes[shown_as == prefix] = ledger.rollback_target(entries, shown_as)["seq"]
        except ledger.LedgerError:
            outcomes[shown_as == prefix] = "refused"
    expected = target["seq"] if length >= 8 else "refused"
    ok = outcomes == {True: expected, False: expected}
    evidence.record(
        "rollback target by hash prefix",
        f"{length} hex digits, lower and upper case",
        outcomes,
        {"expected": expected},
        ok,
    )
    assert ok, outcomes
