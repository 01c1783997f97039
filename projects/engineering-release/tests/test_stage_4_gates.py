"""Stage 4: release gates.

Promotion needs a valid signature, a bound evaluation that passes the policy,
and a candidate server that is ready after its golden self-test; traffic
moves only then. Independent checks: the model that answers each request is
compared with the log, and its predictions with the NumPy float64 forward
pass of that model. Changed conditions: each gate failing in turn, a
candidate with wrong golden outputs and one that is never ready in time,
ten releases and rollbacks under load, and SIGKILL at ten seeded moments.
"""

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import fresh_state

from engineering_release import (
    checkpoint,
    data,
    evaluation,
    ledger,
    model,
    registry,
    release,
    signing,
)
from engineering_release.config import Policy
from engineering_release.loadgen import LoadGenerator
from engineering_release.serve import Host


def snapshot(state) -> tuple:
    return (state.ledger_path.read_bytes(), registry.state(state.client), state.store.ids())


def numpy_predictions(state, model_id: str, rows: np.ndarray) -> np.ndarray:
    artifact = checkpoint.read_artifact(state.store.get(model_id))
    return model.forward_numpy(artifact.params, rows).argmax(axis=1)


@pytest.fixture
def released(released_template, tmp_path):
    template, models, evaluations = released_template
    return fresh_state(template, tmp_path), models, evaluations


@pytest.fixture
def host(released):
    state = released[0]
    running = Host(state.root, reconcile_s=0.1).start(host_file=state.host_file)
    deadline = time.monotonic() + 120
    while running.active is None and time.monotonic() < deadline:  # Serves what the log says.
        time.sleep(0.05)
    yield running
    running.stop()
    state.host_file.unlink(missing_ok=True)


def register_and_approve(state, model_dir: Path, pem: Path, policy: Policy | None = None) -> str:
    model_id, _ = release.register(state, model_dir)
    policy = policy or state.policy()
    evaluation_id, _ = evaluation.evaluate(state.store, model_id, policy)
    approval = signing.sign_approval(
        signing.load_private(pem),
        model_id=model_id,
        evaluation_id=evaluation_id,
        policy=policy,
        signer="approver",
    )
    ledger.append(state.ledger_path, "approve", {"approval": approval})
    registry.sync(state.client, state.entries())
    return model_id


@pytest.mark.claims(
    "promotion-needs-signature-evaluation-thresholds",
    "gate-signature-refusal",
    "gate-policy-in-force",
    "gate-bound-evaluation-verified",
    "gate-thresholds",
)
def test_gates_refuse_and_change_nothing(released, tmp_path, evidence):
    """Each failing gate (unknown id, foreign key, other data, policy, threshold) gives every
    reason; nothing changes.

    Size: the final release of B rests on the `released_template` premise (seed 1
    passes the default policy with 15 errors to spare in all and 4 in class 8: none
    seen over rounding, about 1e-4 per model over training keys; see that fixture).
    The strict-threshold verdict needs model C (seed 2) to miss at least one of the
    359 digits: over 10,000 seeds at least 7 were missed (logit-normal fit: below
    1e-100). The gates themselves are deterministic. Power: the seeded bugs of
    these gates (a threshold checked against the wrong field, the signature not
    verified, the bound evaluation's metrics taken unverified) fail it, as
    seeded_bugs.toml lists. (sweep: evidence/size_sweep.json, the `size_sweep`
    script beside the tests)"""
    state, models, _ = released
    pem = state.keys / "approver.pem"
    from engineering_release import train
    from engineering_release.config import TrainConfig

    # Model C: stored and registered; each of its approvals fails exactly one gate.
    train.write_model(train.train(TrainConfig.tiny(seed=2)), tmp_path / "c")
    c, _ = release.register(state, tmp_path / "c")
    default, strict = Policy(), Policy(min_accuracy=0.999)
    eval_c, _ = evaluation.evaluate(state.store, c, default)
    eval_elsewhere, _ = evaluation.evaluate(state.store, c, Policy(split_seed=1))
    _, foreign = signing.generate_key(state.keys, "mallory", trust=False)
    approvals = {
        "foreign key": (foreign, eval_c, default),
        "report on another data set": (pem, eval_elsewhere, default),
        "threshold missed (strict policy)": (pem, eval_c, strict),
    }
    for key, evaluation_id, policy in approvals.values():
        approval = signing.sign_approval(
            signing.load_private(key),
            model_id=c,
            evaluation_id=evaluation_id,
            policy=policy,
            signer=key.stem,
        )
        ledger.append(state.ledger_path, "approve", {"approval": approval})
    registry.sync(state.client, state.entries())
    heldout = data.heldout_set(0, 0.2)
    accuracy = float(np.mean(numpy_predictions(state, c, heldout.images) == heldout.labels))

    before = snapshot(state)
    cases = [
        ("unknown id", default, "f" * 64, ["Unknown object id"]),
        (
            "C under the default policy",
            default,
            c,
            ["not in the trusted keyring", "data set", "another policy"],
        ),
        (
            "C under the strict policy",
            strict,
            c,
            ["not in the trusted keyring", "below the policy's 0.999"],
        ),
        (
            "B, approved under the default policy, with the strict one in force",
            strict,
            models[1],
            ["another policy"],
        ),
    ]
    for label, policy, model_id, messages in cases:
        state.set_policy(policy)
        with pytest.raises((release.ReleaseRefused, release.StoreError)) as info:
            release.release(state, model_id)
        found = [m for m in messages if m in str(info.value)]
        assert evidence.record(
            "gate refused with every reason",
            label,
            {"message": str(info.value)[:600], "expected": messages},
            None,
            found == messages,
        )
    state.set_policy(default)
    assert snapshot(state) == before, "a refused release changes nothing"
    # The threshold verdict agrees with an accuracy computed independently (NumPy).
    assert evidence.record(
        "threshold verdict vs NumPy accuracy",
        "min_accuracy 0.999",
        {"numpy_accuracy": accuracy},
        {"min_accuracy": 0.999},
        accuracy < 0.999,
    )
    # The same gates pass a sound approval: B under the policy it was approved under.
    assert release.release(state, models[1]).model_id == models[1]


@pytest.mark.claims(
    "candidate-ready-after-golden-self-test",
    "bad-candidate-keeps-previous-serving",
    "traffic-switches-only-to-ready",
)
def test_bad_candidates_leave_the_previous_release_serving(released, host, tmp_path, evidence):
    """A wrong-golden or never-ready candidate is refused while every request under load gets model
    A's NumPy answer."""
    state, models, _ = released
    pem = state.keys / "approver.pem"
    rows = data.heldout_set(0, 0.2).images[:32]
    # A model whose golden outputs are not its own: a sound evaluation, a failing self-test.
    source = checkpoint.read_artifact(state.store.get(models[1]))
    wrong = source.golden_logits.copy()
    wrong[0, wrong[0].argmin()] += 0.01  # Beyond the tolerance; no prediction changes.
    bad_dir = checkpoint.write_artifact(
        tmp_path / "bad",
        architecture=source.manifest["architecture"],
        params=source.params,
        golden_inputs=source.golden_inputs,
        golden_logits=wrong,
        training=source.manifest["training"],
    )
    bad = register_and_approve(state, bad_dir, pem)
    before = snapshot(state)
    load = LoadGenerator(host.port, clients=2, max_requests=5000, max_seconds=120, rows=rows)
    load.start()
    load.wait_for(20)
    with pytest.raises(release.ReleaseRefused, match="golden self-test failed") as golden:
        release.release(state, bad)
    with pytest.raises(release.ReleaseRefused, match="never became ready") as slow:
        release.release(state, models[1], readiness_timeout_s=0.001)
    count = len(load.samples)
    load.wait_for(count + 20)
    samples = load.stop()
    assert snapshot(state) == before
    served = {s.model_id for s in samples}
    failed = [s for s in samples if s.status != 200]
    reference = numpy_predictions(state, models[0], rows)
    wrong_answers = sum(int(s.prediction != reference[s.row]) for s in samples)
    ok = served == {models[0]} and not failed and wrong_answers == 0
    assert evidence.record(
        "previous release keeps serving",
        "golden mismatch; readiness timeout",
        {
            "requests": len(samples),
            "failed": len(failed),
            "served_by": sorted(m[:12] for m in served if m),
            "wrong_vs_numpy": wrong_answers,
            "golden": str(golden.value)[:300],
            "slow": str(slow.value)[:300],
        },
        None,
        ok,
    )


@pytest.mark.claims("switch-to-ready-retires-old")
def test_ten_releases_and_rollbacks_under_load_fail_nothing(released, host, evidence):
    """Ten releases and rollbacks under load fail no request; each answer matches its model's NumPy
    float64 prediction."""
    state, models, _ = released
    rows = data.heldout_set(0, 0.2).images[:64]
    reference = {m: numpy_predictions(state, m, rows) for m in models.values()}
    load = LoadGenerator(host.port, clients=2, max_requests=40_000, max_seconds=400, rows=rows)
    load.start()
    load.wait_for(20)
    operations = []
    for i in range(10):
        before = ledger.serving_model(state.entries())
        started = time.perf_counter()
        outcome = (
            release.release(state, models[1])
            if i % 4 == 0
            else release.rollback(state)
            if i % 2 == 1
            else release.rollback(
                state,
                to=[
                    e
                    for e in state.entries()
                    if e["body"].get("model_id") == models[1] and e["kind"] != "approve"
                ][-1]["hash"][:12],
            )
        )
        done = time.perf_counter()
        count = len(load.samples)
        load.wait_for(count + 10)
        after = [s for s in load.samples if s.start >= done]
        operations.append(
            {
                "op": outcome.kind,
                "from": before[:12],
                "to": outcome.model_id[:12],
                "seconds": done - started,
                "after_switch_served_by_new": all(s.model_id == outcome.model_id for s in after),
            }
        )
        assert outcome.previous_model_id == before and outcome.model_id != before
    samples = load.stop()
    failed = [s for s in samples if s.status != 200]
    wrong = sum(
        int(s.prediction != reference[s.model_id][s.row])
        for s in samples
        if s.model_id in reference
    )
    served = {s.model_id for s in samples}
    ok = (
        not failed
        and wrong == 0
        and served <= set(models.values())
        and all(o["after_switch_served_by_new"] for o in operations)
        and release.verify(state) == []
    )
    latencies = sorted(s.end - s.start for s in samples)
    assert evidence.record(
        "no failed request during 10 releases and rollbacks",
        "2 clients",
        {
            "requests": len(samples),
            "failed": len(failed),
            "wrong_vs_numpy": wrong,
            "operations": operations,
            "p99_s": latencies[int(0.99 * (len(latencies) - 1))],
        },
        {"failed": 0},
        ok,
    )


@pytest.mark.claims("sigkill-leaves-old-or-new")
def test_sigkill_at_seeded_moments_leaves_old_or_new(released_template, evidence):
    """SIGKILL at 10 seeded points of a release leaves the old or the new log intact, and recovery
    agrees with it."""
    template, models, _ = released_template
    old_log = (template / "ledger.jsonl").read_bytes()
    # Ten moments drawn by a seeded RNG: the same ten, in the same order, every run.
    points = random.Random(22).sample(release.CRASH_POINTS, 10)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("kill_worker.py")),
                str(template),
                models[1],
                tmp,
                *points,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs = [json.loads(line) for line in proc.stdout.splitlines()]
        assert sorted(r["point"] for r in runs) == sorted(points)
        for run in runs:
            # Every point lies on the release's path: a child that ends there was not killed.
            assert run["killed"], (
                f"the release ended (exit {run['exit']}) without reaching {run['point']!r}; "
                f"its stderr:\n{run['stderr_tail']}"
            )
            run["root"] = Path(run["root"])
            state = release.State(run["root"])
            raw = state.entries()  # Before any recovery: never a torn log.
            assert ledger.verify_chain(raw) == []
            serving = ledger.serving_model(raw)
            old = state.ledger_path.read_bytes() == old_log
            new = (
                len(raw) == len(old_log.splitlines()) + 1
                and serving == models[1]
                and state.ledger_path.read_bytes().startswith(old_log)
            )
            recovered = release.recover(state)
            problems = release.verify(state)
            champion = registry.state(state.client)["champion"]
            ok = (old != new) and problems == [] and champion == serving
            assert evidence.record(
                "SIGKILL leaves the old release or the new one",
                run["point"],
                {"state": "old" if old else "new", "recovered": recovered, "problems": problems},
                None,
                ok,
            )
        # From an old state, the release simply goes through again.
        first_old = next(r for r in runs if (r["root"] / "ledger.jsonl").read_bytes() == old_log)
        state = release.State(first_old["root"])
        outcome = release.release(state, models[1])
        assert outcome.model_id == models[1] and release.verify(state) == []


@pytest.mark.claims("gate-approval-of-another-model", "gate-refusal-lists-each-approval")
def test_an_approval_of_another_model_is_refused_naming_that_model(released, evidence):
    """B's approval offered for A is refused naming B's 12-character id prefix; offered for B, it
    passes."""
    from engineering_release import gates

    state, models, _ = released
    a, b = models[0], models[1]
    entries = state.entries()
    b_approval = ledger.approvals(entries, b)[-1]
    keyring = signing.read_keyring(state.keys)
    with pytest.raises(gates.GateRefused) as info:
        gates.promotion_gate(
            state.store, entries, keyring, state.policy(), a, approve_entry=b_approval
        )
    expected = "Approval is for model `" + b[0:12] + "`."
    # The refusal names the approval by its log entry's 12-character hash prefix.
    reason = "Approval `" + b_approval["hash"][0:12] + "`: " + expected
    assert evidence.record(
        "approval of another model refused",
        "B's approval for A",
        {"message": str(info.value)[:400], "reasons": info.value.reasons},
        {"expected": expected},
        expected in str(info.value) and info.value.reasons == [reason],
    )
    passed = gates.promotion_gate(
        state.store, entries, keyring, state.policy(), b, approve_entry=b_approval
    )
    # A passed gate names the three checks it stands on, in the order they ran.
    assert passed.model_id == b
    assert passed.checks == ["signature", "evaluation", "thresholds"]


@pytest.mark.claims("gate-approvals-newest-first")
def test_the_newest_passing_approval_is_the_one_released(released, evidence):
    """With two passing approvals of model B, the release names the newer one; with a
    third, newest, approval that fails (a key outside the keyring), the gate passes
    on the newer of the two passing ones, not the oldest."""
    from engineering_release import gates

    state, models, evaluations = released
    b = models[1]
    pem = state.keys / "approver.pem"
    release.approve(state, b, evaluations[1], pem, "approver")  # A second passing approval.
    older, newer = ledger.approvals(state.entries(), b)
    outcome = release.release(state, b)
    released_with = outcome.entry["body"]["approval"]
    _, foreign = signing.generate_key(state.keys, "mallory", trust=False)
    approval = signing.sign_approval(
        signing.load_private(foreign),
        model_id=b,
        evaluation_id=evaluations[1],
        policy=state.policy(),
        signer="mallory",
    )
    newest = ledger.append(state.ledger_path, "approve", {"approval": approval})
    entries = state.entries()
    passed = gates.promotion_gate(
        state.store, entries, signing.read_keyring(state.keys), state.policy(), b
    )
    observed = {
        "approvals_oldest_first": [e["hash"][:12] for e in ledger.approvals(entries, b)],
        "released_with": released_with[:12],
        "gate_passed_on_with_a_failing_newest": passed.approve_entry["hash"][:12],
    }
    assert evidence.record(
        "approvals are tried newest first",
        "two passing approvals of B; then a third, newest, by an untrusted key",
        observed,
        {"released_with": newer["hash"][:12], "then": newer["hash"][:12]},
        released_with == newer["hash"]
        and passed.approve_entry["hash"] == newer["hash"]
        and older["hash"] != newer["hash"] != newest["hash"],
    ), observed


@pytest.mark.claims("gate-evaluation-only-after-approval-checks", "gate-bound-evaluation-verified")
def test_the_bound_evaluation_is_judged_only_for_an_approval_that_passed_its_checks(
    released, evidence
):
    """Approvals of B bound to A's report (a report that never verifies for B): one
    that passes the signature, policy and age checks gets "Bound evaluation refused";
    one that fails any of them (signed under another policy, by a key outside the
    keyring, or past `approval_valid_days`) gets that check's sentence and not a word
    about the evaluation."""
    import datetime as dt

    from engineering_release import gates

    state, models, evaluations = released
    b = models[1]
    pem = state.keys / "approver.pem"
    _, foreign = signing.generate_key(state.keys, "mallory", trust=False)
    in_force, other = state.policy(), Policy(min_accuracy=0.5)
    cases = {
        "passes its checks": (pem, in_force, 0, "Bound evaluation refused"),
        "another policy": (pem, other, 0, "another policy than the one in force"),
        "untrusted key": (foreign, in_force, 0, "not in the trusted keyring"),
        "too old": (pem, in_force, 31, "days old"),
    }
    keyring = signing.read_keyring(state.keys)
    observed = {}
    for case, (key, policy, days, sentence) in cases.items():
        approval = signing.sign_approval(
            signing.load_private(key),
            model_id=b,
            evaluation_id=evaluations[0],  # A's report, not B's.
            policy=policy,
            signer=key.stem,
        )
        entry = ledger.append(state.ledger_path, "approve", {"approval": approval})
        now = signing.parse_iso(approval["signed_at"]) + dt.timedelta(days=days)
        with pytest.raises(gates.GateRefused) as info:
            gates.promotion_gate(
                state.store, state.entries(), keyring, in_force, b, approve_entry=entry, now=now
            )
        observed[case] = {
            "says_its_check": sentence in str(info.value),
            "bound_evaluation_judged": "Bound evaluation refused" in str(info.value),
            "reasons": info.value.reasons,
        }
    assert evidence.record(
        "the bound evaluation is judged only after the approval's own checks pass",
        "approvals of B bound to A's report",
        observed,
        None,
        all(o["says_its_check"] for o in observed.values())
        and observed["passes its checks"]["bound_evaluation_judged"]
        and not any(
            o["bound_evaluation_judged"] for c, o in observed.items() if c != "passes its checks"
        ),
    ), observed


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket that process `pid` holds, read
    from /proc by the test itself: the socket inodes among its open files, looked up
    in its network namespace's IPv4 and IPv6 tables (state 0A: listening)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # Closed since the listing.
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            host, port = local.split(":")
            raw = bytes.fromhex(host)  # 32-bit words in the host's (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return sorted(found)


@pytest.mark.claims("candidate-server-own-process")
def test_the_serving_candidate_is_its_own_process_on_127_0_0_1(released, host, evidence):
    """The candidate that serves the release (model A, started by the host) is a
    process other than the host's, running `engineering_release.candidate`, that
    holds one listening socket, on 127.0.0.1 at the port the host routes to, and
    none on another address; it answers `/readyz` and `/predict` there with model A.
    Read from the kernel's tables for that process (/proc), not from the server."""
    if not (Path("/proc/self/fd").is_dir() and Path("/proc/self/net/tcp").exists()):
        pytest.skip("reads a process's listening sockets from /proc, which this machine lacks")
    _, models, _ = released
    backend = host.active
    assert backend is not None, host.snapshot()
    pid = None if backend.proc is None else backend.proc.pid  # None: served in-process.
    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
    with httpx.Client(base_url=f"http://127.0.0.1:{backend.port}", timeout=30.0) as http:
        ready = http.get("/readyz")
        answer = http.post("/predict", json={"inputs": [[0.0] * data.NUM_FEATURES]})
    observed = {
        "host_pid": os.getpid(),
        "candidate_pid": pid,
        "running": pid is not None and backend.proc.poll() is None,
        "module": b"engineering_release.candidate" in command,
        "port": backend.port,
        "listening": _listening_sockets(pid) if pid else [],
        "readyz": ready.status_code,
        "answered_by": answer.json().get("model_id", "")[:12],
    }
    assert evidence.record(
        "the candidate server: its own process, listening on 127.0.0.1 only",
        "model A released, served through the host",
        observed,
        {"listening": [("127.0.0.1", backend.port)]},
        pid not in (None, os.getpid())
        and observed["running"]
        and observed["module"]
        and observed["listening"] == [("127.0.0.1", backend.port)]
        and ready.status_code == 200
        and answer.json()["model_id"] == models[0],
    ), observed


@pytest.mark.claims("gate-approval-age")
def test_approval_age_is_refused_one_second_past_the_limit(released, evidence):
    """B's approval passes the gate at exactly `approval_valid_days` old and is refused one second,
    or just under a day, past it, with its whole days in the sentence."""
    import datetime as dt

    from engineering_release import gates

    state, models, _ = released
    b = models[1]
    entries = state.entries()
    b_approval = ledger.approvals(entries, b)[-1]
    keyring = signing.read_keyring(state.keys)
    policy = state.policy()
    assert policy.approval_valid_days == 30
    signed_at = signing.parse_iso(b_approval["body"]["approval"]["signed_at"])
    limit_s = 30 * 24 * 3600  # Plain Python: the age allowed, in seconds, both ends included.
    for offset_s in (
        0,
        limit_s - 1,
        limit_s,
        limit_s + 1,
        limit_s + 24 * 3600 - 1,
        limit_s + 24 * 3600,
    ):
        now = signed_at + dt.timedelta(seconds=offset_s)
        should_pass = offset_s <= limit_s
        expected = f"Approval is {offset_s // 86400} days old; the policy allows 30."
        try:
            gates.promotion_gate(
                state.store, entries, keyring, policy, b, approve_entry=b_approval, now=now
            )
            message = None
        except gates.GateRefused as err:
            message = str(err)
        ok = message is None if should_pass else message is not None and expected in message
        assert evidence.record(
            "approval age against approval_valid_days",
            f"{offset_s} s after signing",
            {"message": message and message[:400]},
            {"limit_s": limit_s, "expected": None if should_pass else expected},
            ok,
        ), (offset_s, message)


class GoldenModel:
    """What `golden_check` reads of a loaded model: its stored golden inputs and logits."""

    def __init__(self, golden_logits: np.ndarray):
        self.graphdef = self.params = None
        self.artifact = type(
            "Golden",
            (),
            {
                "golden_inputs": np.zeros((len(golden_logits), 4), np.float32),
                "golden_logits": golden_logits,
            },
        )()


def golden_verdict(monkeypatch, golden: np.ndarray, served: np.ndarray, atol: float) -> dict:
    from engineering_release import gates, train

    monkeypatch.setattr(train, "predict", lambda graphdef, params, inputs: served)
    return gates.golden_check(GoldenModel(golden), atol=atol)


@pytest.mark.claims("golden-predictions-equal", "golden-logits-within-atol")
def test_golden_check_decides_each_condition_on_its_own(monkeypatch, evidence):
    """The golden self-test fails on a shape change either way, on one flipped prediction whose
    logits stay within atol, and on a logit off by just over atol; it reports the true max error."""
    atol = 1e-3
    rng = np.random.default_rng(7)
    golden = rng.normal(size=(6, 3)).astype(np.float64)
    golden[0] = [1.0, 1.0 + 0.4 * atol, -2.0]  # A near tie: column 1 wins by 0.4 atol.
    delta = np.zeros_like(golden)
    delta[2, 1], delta[4, 0] = 0.5 * atol, -0.75 * atol
    within = golden + delta
    verdict = golden_verdict(monkeypatch, golden, within.astype(np.float32), atol)
    true_max = np.abs(within.astype(np.float32).astype(np.float64) - golden).max()
    cases = {
        "within atol, same predictions": (verdict, True, 0, true_max),
    }
    flipped = within.copy()
    flipped[0] = [1.0 + 0.3 * atol, 1.0 - 0.2 * atol, -2.0]  # |change| <= 0.6 atol, argmax flips.
    cases["one flipped prediction within atol"] = (
        golden_verdict(monkeypatch, golden, flipped.astype(np.float32), atol),
        False,
        1,
        np.abs(flipped.astype(np.float32).astype(np.float64) - golden).max(),
    )
    over = within.copy()
    over[3, 2] += 1.5 * atol
    cases["one logit 1.5 atol off"] = (
        golden_verdict(monkeypatch, golden, over.astype(np.float32), atol),
        False,
        0,
        np.abs(over.astype(np.float32).astype(np.float64) - golden).max(),
    )
    for label, (got, passed, mismatched, max_err) in cases.items():
        assert evidence.record(
            "golden self-test verdict",
            label,
            {k: got[k] for k in ("passed", "max_abs_error", "mismatched_predictions")},
            {"atol": atol},
            got["passed"] is passed
            and got["mismatched_predictions"] == mismatched
            and got["max_abs_error"] == pytest.approx(max_err, rel=1e-9, abs=0),
        )
        # The verdict also says how many golden rows it judged, and against which atol.
        assert (got["golden_count"], got["atol"]) == (len(golden), atol), got
        assert sorted(got) == sorted(
            ["passed", "max_abs_error", "mismatched_predictions", "golden_count", "atol"]
        ), got
    for label, rows in (("one row fewer", 5), ("one row more", 7)):
        served = rng.normal(size=(rows, 3)).astype(np.float32)
        got = golden_verdict(monkeypatch, golden, served, atol)
        assert evidence.record(
            "golden self-test refuses a shape change",
            label,
            {"result": str(got)},
            None,
            got["passed"] is False and "shape" in got.get("reason", ""),
        )


@pytest.mark.claims(
    "golden-tolerance-1e-5",
    "golden-logits-within-atol",
    "candidate-ready-after-golden-self-test",
    "bad-candidate-keeps-previous-serving",
)
def test_release_holds_golden_logits_to_one_hundred_thousandth(released, tmp_path, evidence):
    """Candidates whose stored golden logits are off by 0.5e-5, 2e-5 and 1e-4 (predictions
    unchanged): the release refuses the two beyond 1e-5, changing nothing, and releases the one
    within it."""
    # The golden self-test's tolerance, 1e-5 on float32 logits of O(10), is stated in
    # `gates.py` (`GOLDEN_ATOL = 1e-5`, the default `atol` of `golden_check`: "the same program
    # on the same CPU gives equal bits"); the README expects the 16 golden rows reproduced with
    # error 0.0. Written here as a number, so that a change of the module's constant shows.
    tolerance = 1e-5
    state, models, _ = released
    pem = state.keys / "approver.pem"
    source = checkpoint.read_artifact(state.store.get(models[1]))
    column = int(source.golden_logits[0].argmin())  # Raising the lowest logit keeps the argmax.
    candidates = {}
    for factor in (0.5, 2.0, 10.0):
        shifted = source.golden_logits.copy()
        shifted[0, column] += np.float32(factor * tolerance)
        stored_error = abs(float(shifted[0, column]) - float(source.golden_logits[0, column]))
        # The perturbation survives float32 rounding on the intended side of the tolerance.
        assert (stored_error < tolerance) == (factor < 1), (factor, stored_error)
        directory = checkpoint.write_artifact(
            tmp_path / f"golden-x{factor:g}",
            architecture=source.manifest["architecture"],
            params=source.params,
            golden_inputs=source.golden_inputs,
            golden_logits=shifted,
            training=source.manifest["training"],
        )
        candidates[factor] = (register_and_approve(state, directory, pem), stored_error)
    before = snapshot(state)
    for factor in (2.0, 10.0):
        model_id, stored_error = candidates[factor]
        with pytest.raises(release.ReleaseRefused) as info:
            release.release(state, model_id)
        message = str(info.value)
        serving = ledger.serving_model(state.entries())
        assert evidence.record(
            "golden logits beyond 1e-5 refuse the release",
            f"one logit {factor:g} x 1e-5 off",
            {"stored_error": stored_error, "message": message[:400], "serving": serving[:12]},
            {"atol": tolerance},
            "golden self-test failed" in message
            and "'passed': False" in message
            and "'mismatched_predictions': 0" in message
            and serving == models[0]
            and snapshot(state) == before,
        ), message
    model_id, stored_error = candidates[0.5]
    outcome = release.release(state, model_id)
    serving = ledger.serving_model(state.entries())
    assert evidence.record(
        "golden logits within 1e-5 release",
        "one logit 0.5 x 1e-5 off",
        {
            "stored_error": stored_error,
            "self_test": {k: outcome.readiness.get(k) for k in ("passed", "max_abs_error")},
            "serving": serving[:12],
        },
        {"atol": tolerance},
        outcome.model_id == model_id
        and outcome.readiness["passed"] is True
        and outcome.readiness["max_abs_error"] < tolerance
        and serving == model_id
        and release.verify(state) == [],
    ), outcome.readiness


class StagedBackend:
    """A staged candidate as `Host._switch` sees it: an id, a status, nothing in flight."""

    def __init__(self, model_id: str, status: str):
        self.model_id, self.status, self.inflight, self.client = model_id, status, 0, None
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.claims(
    "traffic-switches-only-to-ready",
    "switch-already-serving",
    "switch-refuses-unready",
    "switch-to-ready-retires-old",
)
def test_switch_moves_traffic_only_to_a_ready_candidate_and_retires_the_old_one(tmp_path):
    """Traffic stays on an unstaged or not-ready candidate; the first switch retires nothing, the
    next retires (drains) the previous active one; a repeat says already serving."""
    import asyncio

    host = Host(tmp_path, follow_log=False)
    a, b = StagedBackend("a" * 64, "ready"), StagedBackend("b" * 64, "starting")
    # Every status but `ready` keeps traffic, those that sort before it as after it.
    failed, loading = StagedBackend("f" * 64, "failed"), StagedBackend("d" * 64, "loading")
    host.candidates = {x.model_id: x for x in (a, b, failed, loading)}

    async def settle() -> None:
        for _ in range(200):  # Let the retire tasks run; a hang guard, not a verdict.
            await asyncio.sleep(0.01)
            if all(not t for t in asyncio.all_tasks() - {asyncio.current_task()}):
                break

    async def scenario() -> list:
        seen = []
        seen.append(("unstaged", host._switch("c" * 64), host.active))
        seen.append(("starting", host._switch(b.model_id), host.active))
        seen.append(("failed", host._switch(failed.model_id), host._switch(loading.model_id)))
        seen.append(("first ready", host._switch(a.model_id), host.active))
        await settle()
        seen.append(("retired after first", list(host.retired)))
        b.status = "ready"
        seen.append(("second ready", host._switch(b.model_id), host.active))
        await settle()
        seen.append(("retired after second", list(host.retired), a.stopped))
        seen.append(("repeat", host._switch(b.model_id), len(host.switches)))
        return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        host._server.sock.close()  # Bound when the host was made; never served here.
    assert seen[0][1] == (False, f"candidate `{'c' * 12}` is not staged; traffic stays")
    assert seen[0][2] is None
    assert seen[1][1] == (False, f"candidate `{'b' * 12}` is starting; traffic stays")
    assert seen[1][2] is None
    assert seen[2][1] == (False, f"candidate `{'f' * 12}` is failed; traffic stays")
    assert seen[2][2] == (False, f"candidate `{'d' * 12}` is loading; traffic stays")
    assert b.model_id in host.candidates or host.active is b
    assert seen[3][1] == (True, "switched") and seen[3][2] is a
    assert seen[4][1] == [], "nothing was active before the first switch"
    assert seen[5][1] == (True, "switched") and seen[5][2] is b
    assert seen[6][1] == [{"model_id": a.model_id, "inflight_at_stop": 0}] and seen[6][2] is True
    assert seen[7][1] == (True, "already serving") and seen[7][2] == 2
    # Each switch is recorded once: the model it moved to and when (seconds since the epoch).
    assert [sorted(s) for s in host.switches] == [["at", "model_id"], ["at", "model_id"]]
    assert [s["model_id"] for s in host.switches] == [a.model_id, b.model_id]
    times = [s["at"] for s in host.switches]
    assert all(isinstance(t, float) and t > 1.6e9 for t in times) and times == sorted(times)


@pytest.mark.claims(
    "thresholds-minimum-passes",
    "thresholds-accuracy-miss",
    "thresholds-recall-miss",
    "thresholds-both-accuracy-first",
)
def test_thresholds_pass_at_the_minimum_and_name_each_miss():
    """A metric equal to its minimum passes; one a step below, or NaN, is named with the exact
    sentence, accuracy first."""
    from engineering_release import gates

    policy = Policy(min_accuracy=0.75, min_class_recall=0.5)
    below_a, below_r = float(np.nextafter(0.75, 0)), float(np.nextafter(0.5, 0))
    acc = f"Held-out accuracy {below_a:.4f} is below the policy's 0.75."
    rec = f"The lowest class recall {below_r:.4f} is below the policy's 0.5."
    cases = [
        ({"accuracy": 0.75, "min_class_recall": 0.5}, []),
        ({"accuracy": 0.9, "min_class_recall": 0.9}, []),
        ({"accuracy": below_a, "min_class_recall": 0.5}, [acc]),
        ({"accuracy": 0.75, "min_class_recall": below_r}, [rec]),
        ({"accuracy": below_a, "min_class_recall": below_r}, [acc, rec]),
        (
            {"accuracy": float("nan"), "min_class_recall": 0.5},
            ["Held-out accuracy nan is below the policy's 0.75."],
        ),
    ]
    for metrics, expected in cases:
        assert gates.thresholds(metrics, policy) == expected, metrics
