"""Stage 3: a verified recovery point.

Independent checks: the latest accepted step against an enumerated ledger
(None for an empty ledger and an all-rejected one);
the continued run against an uninterrupted run computed in this process
(loss bits and sample IDs, the IDs also computed without any iterator); the
verifier's acceptances against the job's own completion records; damage
(corrupted bytes, a degraded state with regenerated checksums) against the
judgement. Changed conditions: a kill after a step vs a kill during a save;
two damaged steps; two degradations.
"""

import hashlib
import json
import shutil
import struct
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import job_log
from hypothesis import given, settings
from hypothesis import strategies as st

from workload_operations import checkpoint, data, faults, train, verifier
from workload_operations.cli import main
from workload_operations.config import Config
from workload_operations.supervisor import Supervisor, run_verifier, supervise


def _ledger(workdir: Path, requested, verdicts, committed) -> None:
    ledger = checkpoint.Ledger(workdir)
    for step in requested:
        ledger.append("requested", {"step": step})
    for step, accepted in verdicts:
        ledger.append("verdicts", {"step": step, "accepted": accepted, "reasons": []})
    for step in committed:
        root = checkpoint.checkpoint_dir(workdir) / str(step)
        root.mkdir(parents=True)
        (root / "_CHECKPOINT_METADATA").write_text("{}")


@pytest.mark.claims("latest-accepted-step")
def test_latest_accepted_follows_the_verdicts(tmp_path, evidence):
    """The latest accepted step equals the enumerated answer, before and after 9 is accepted."""
    # 6 was accepted but its directory is gone; 12's latest verdict rejects it; 15
    # was never requested; 9 has no verdict yet.
    _ledger(
        tmp_path,
        requested=[3, 6, 9, 12],
        verdicts=[(3, True), (6, True), (12, True), (12, False), (15, True)],
        committed=[3, 9, 12, 15],
    )
    first = checkpoint.latest_accepted(tmp_path)
    checkpoint.Ledger(tmp_path).append("verdicts", {"step": 9, "accepted": True, "reasons": []})
    second = checkpoint.latest_accepted(tmp_path)
    assert evidence.record(
        "latest accepted step = enumerated answer",
        "before and after step 9 is accepted",
        {"before": first, "after": second},
        {"expected": [3, 9]},
        (first, second) == (3, 9),
    ), (first, second)


@pytest.mark.claims("accept-only-requested", "judge-verdict-with-reasons")
def test_a_step_without_a_request_is_not_accepted(tmp_path):
    """A committed step with no request record is rejected; the reason names the missing request."""
    config = Config.tiny_recovery()
    _ledger(tmp_path, requested=[3], verdicts=[], committed=[3, 6])
    verdict = verifier.judge(tmp_path, 6, config, dataset={})
    assert not verdict["accepted"]
    assert "no request record" in verdict["reasons"][0]


def _write_ledger(workdir: Path, kind: str, records: list[dict]) -> None:
    """Records with the times given (`Ledger.append` stamps the present)."""
    ledger = checkpoint.Ledger(workdir)
    ledger.root.mkdir(parents=True, exist_ok=True)
    ledger.rewrite(kind, records)


@pytest.mark.claims("latest-accepted-step")
@pytest.mark.parametrize(
    "request_t, verdict_t, expected",
    [
        (10.0, 10.5, 4),  # judged after its request
        (10.0, 10.0, 4),  # judged at the instant of its request
        (10.0, 9.5, 2),  # requested again after its verdict: that verdict is old
    ],
)
def test_latest_accepted_needs_a_verdict_no_older_than_the_request(
    tmp_path, request_t, verdict_t, expected
):
    """A verdict counts only if no older than the step's latest request (after, at, before it)."""
    _write_ledger(
        tmp_path,
        "requested",
        [{"step": 2, "t": 1.0}, {"step": 4, "t": 1.0}, {"step": 4, "t": request_t}],
    )
    _write_ledger(
        tmp_path,
        "verdicts",
        [
            {"step": 2, "t": 2.0, "accepted": True, "reasons": []},
            {"step": 4, "t": verdict_t, "accepted": True, "reasons": []},
        ],
    )
    for step in (2, 4):
        root = checkpoint.checkpoint_dir(tmp_path) / str(step)
        root.mkdir(parents=True)
        (root / "_CHECKPOINT_METADATA").write_text("{}")
    assert checkpoint.latest_accepted(tmp_path) == expected


@pytest.mark.claims("latest-accepted-none")
def test_latest_accepted_is_none_when_no_step_qualifies(tmp_path, evidence):
    """latest_accepted is None for an empty ledger and for one whose every step is rejected.

    Both workdirs hold committed step directories (3, 6, 9), so None is not the
    answer of a workdir with nothing saved: with empty ledger files; and with
    every step requested and rejected (9 accepted first, then rejected by its
    latest verdict)."""
    empty = tmp_path / "empty"
    _ledger(empty, requested=[], verdicts=[], committed=[3, 6, 9])
    for kind in ("requested", "verdicts"):
        _write_ledger(empty, kind, [])
    rejected = tmp_path / "rejected"
    _ledger(
        rejected,
        requested=[3, 6, 9],
        verdicts=[(3, False), (6, False), (9, True), (9, False)],
        committed=[3, 6, 9],
    )
    found = {
        "empty ledger": checkpoint.latest_accepted(empty),
        "every step rejected": checkpoint.latest_accepted(rejected),
    }
    assert evidence.record(
        "latest accepted step when none qualifies",
        "empty ledger; every step rejected; steps 3, 6, 9 committed in both",
        found,
        {"expected": None},
        all(value is None for value in found.values()),
    ), found


@pytest.mark.claims("ledger-last-record-per-step")
def test_ledger_by_step_keeps_the_last_record_of_each_step(tmp_path):
    """by_step keeps each step's last record, int keys in first-seen order; no file gives {}."""
    records = [
        {"step": 3, "t": 1.0, "accepted": True, "reasons": []},
        {"step": 6, "t": 2.0, "accepted": True, "reasons": []},
        {"step": 3, "t": 3.0, "accepted": False, "reasons": ["x"]},
        {"step": 0, "t": 4.0, "accepted": True, "reasons": []},
    ]
    _write_ledger(tmp_path, "verdicts", records)
    got = checkpoint.Ledger(tmp_path).by_step("verdicts")
    assert list(got) == [3, 6, 0] and all(type(k) is int for k in got)
    assert got == {3: records[2], 6: records[1], 0: records[3]}
    assert checkpoint.Ledger(tmp_path).by_step("completed") == {}


@pytest.mark.claims("committed-needs-metadata")
def test_is_committed_needs_the_step_directory_and_its_metadata_file(tmp_path):
    """is_committed holds only for a step folder with its metadata file, in six layouts."""
    root = checkpoint.checkpoint_dir(tmp_path)
    (root / "3").mkdir(parents=True)
    (root / "3" / "_CHECKPOINT_METADATA").write_text("{}")
    (root / "6").mkdir()  # no metadata: Orbax never finished it
    (root / "9").mkdir()
    (root / "9" / "_CHECKPOINT_METADATA").mkdir()  # a directory, not the file
    (root / "12").write_text("")  # a file where the step directory should be
    (root / "15.orbax-checkpoint-tmp-1").mkdir()
    (root / "15.orbax-checkpoint-tmp-1" / "_CHECKPOINT_METADATA").write_text("{}")
    got = {step: checkpoint.is_committed(tmp_path, step) for step in (3, 6, 9, 12, 15, 18)}
    assert got == {3: True, 6: False, 9: False, 12: False, 15: False, 18: False}


@pytest.mark.claims("accept-only-committed", "judge-verdict-with-reasons")
def test_a_requested_step_never_committed_is_rejected_without_a_restore(tmp_path, monkeypatch):
    """A requested step Orbax never committed is rejected as not completed, without a restore."""
    _ledger(tmp_path, requested=[3, 6], verdicts=[], committed=[3])
    (checkpoint.checkpoint_dir(tmp_path) / "6.orbax-checkpoint-tmp-2").mkdir()

    def no_restore(*args, **kwargs):
        raise AssertionError("a step that was never committed must not be restored")

    monkeypatch.setattr(checkpoint, "restore", no_restore)
    verdict = verifier.judge(tmp_path, 6, Config.tiny_recovery(), dataset={})
    assert verdict["accepted"] is False and verdict["figures"]["committed"] is False
    assert verdict["reasons"] == ["not completed: Orbax never committed the step directory"]


_DTYPES = ["float32", "float64", "int32", "uint8", "bool"]


@st.composite
def _trees(draw):
    """A dict of arrays: dtypes, 0-d, empty and non-contiguous (transposed) arrays."""
    leaves = {}
    for i in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        seed = draw(st.integers(0, 2**16))
        a = np.random.default_rng(seed).integers(0, 255, size=shape).astype(dtype)
        if a.ndim == 2 and draw(st.booleans()):
            a = a.T
        leaves[f"a{i}"] = a
    return {"params": leaves, "step": np.int32(draw(st.integers(0, 100)))}


def _sha(array: np.ndarray) -> str:
    """The documented digest: SHA-256 of the dtype, the shape and the C-order bytes."""
    header = f"{array.dtype}{array.shape}".encode()
    return hashlib.sha256(header + np.asarray(array).tobytes(order="C")).hexdigest()


@pytest.mark.claims("checksums-dtype-shape-bytes")
@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(tree=_trees())
def test_checksums_hash_dtype_shape_and_bytes_of_every_leaf(tree):
    """Each leaf's checksum equals SHA-256 of dtype, shape and C-order bytes, over drawn arrays.

    Drawn: five dtypes, 0-d, empty and transposed (non-contiguous) arrays.
    """
    got = checkpoint.checksums(tree)
    expected = {f"['params']['{k}']": _sha(v) for k, v in tree["params"].items()}
    expected["['step']"] = _sha(np.asarray(tree["step"]))
    assert got == expected


@pytest.mark.claims("checksums-dtype-shape-bytes")
def test_checksums_change_with_each_field():
    """A digest changes with the dtype, the shape or one byte alone, and not for an equal array.

    The same bytes under another dtype or shape, and one flipped byte, each give another
    digest; a copy and a JAX array of the same values give the same one.
    """
    a = np.arange(12, dtype=np.int32)
    base = checkpoint.checksums({"w": a})["['w']"]
    variants = {
        "dtype": a.view(np.float32),
        "shape": a.reshape(3, 4),
        "byte": np.where(np.arange(12) == 5, a ^ 1, a).astype(np.int32),
    }
    for field, v in variants.items():
        assert checkpoint.checksums({"w": v})["['w']"] != base, field
    assert checkpoint.checksums({"w": a.copy()})["['w']"] == base
    assert checkpoint.checksums({"w": jax.numpy.asarray(a)})["['w']"] == base


@pytest.mark.claims("data-state-digest")
@pytest.mark.parametrize(
    "state",
    [b"", b"grain-state\x00\xff", {"b": 1, "a": [1, 2]}, {}],
)
def test_data_state_digest_is_sha256_of_bytes_or_sorted_json(state):
    """The data state digest equals SHA-256 of the bytes or of key-sorted JSON, for four states.

    A reordered dict gives the same digest; an added key gives another.
    """
    if isinstance(state, bytes):
        expected = hashlib.sha256(state).hexdigest()
    else:
        text = json.dumps(dict(sorted(state.items())), separators=(", ", ": "))
        expected = hashlib.sha256(text.encode()).hexdigest()
    assert checkpoint.data_state_digest(state) == expected
    if isinstance(state, dict) and state:
        reordered = dict(reversed(list(state.items())))
        assert checkpoint.data_state_digest(reordered) == expected
        assert checkpoint.data_state_digest({**state, "c": 0}) != expected


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, jax_cache):
    """A job run to the end with its checkpoints (Orbax's background saves run in the
    job's process, not here), every step judged in this process."""
    config = Config.tiny_recovery().replace(steps_per_second=0.0)
    workdir = tmp_path_factory.mktemp("saved") / "run"
    outcome = Supervisor(config, workdir, detect=False, compilation_cache=jax_cache).run()
    assert outcome.status == "completed", (
        f"the job ended `{outcome.status}` (exit status {outcome.returncode}), "
        f"not `completed`\n{job_log(workdir)}"
    )
    verdicts = verifier.verify(workdir, config)
    assert [v["accepted"] for v in verdicts] == [True] * 5, verdicts
    return config, workdir


@pytest.fixture
def finished_copy(saved_run, tmp_path):
    config, workdir = saved_run
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    return config, copy


@pytest.mark.claims(
    "accept-matching-checksums",
    "accept-matching-heldout",
    "judge-verdict-with-reasons",
)
@pytest.mark.parametrize(
    "forgery",
    [
        "below",
        "above",
        "missing",
        "extra",
        "extra-null",
        "data-below",
        "data-above",
        "heldout-below",
        "heldout-above",
        "loss-ulp-below",
        "loss-ulp-above",
    ],
)
def test_a_request_whose_checksums_differ_in_any_way_is_rejected(finished_copy, forgery):
    """A request record edited in one digest or its array set is rejected for that one reason alone.

    The request record of step 12 is edited: one array's SHA-256 replaced by a value below
    or above the true digest (as hex strings compare), one array left out, one array the
    state does not hold added (with a digest, or with null, which no restored array's
    digest equals), the Grain state digest or the recorded held-out predictions digest
    replaced by a value below or above the true one, or the recorded held-out loss moved
    by one float32 unit in the last place either way (the loss is compared bit for bit,
    not within a tolerance). The step itself is intact; it is rejected on that record,
    with that one reason. Step 9, untouched, is accepted.
    """
    config, workdir = finished_copy
    dataset = data.make_dataset(config)
    ledger = checkpoint.Ledger(workdir)
    records = ledger.read("requested")
    record = next(r for r in records if r["step"] == 12)
    sums = record["checksums"]
    key = sorted(sums)[0]
    forged = ("0" if forgery.endswith("-below") else "f") * 64
    if forgery.startswith("data-"):
        record["data_state_sha256"] = forged
    elif forgery.startswith("heldout-"):
        record["heldout"]["predictions_sha256"] = forged
    elif forgery.startswith("loss-"):
        # The recorded loss, big-endian float32 bits, moved to its neighbouring float.
        (loss,) = struct.unpack(">f", bytes.fromhex(record["heldout"]["loss_bits"]))
        toward = -np.inf if forgery.endswith("-below") else np.inf
        forged = struct.pack(">f", np.nextafter(np.float32(loss), np.float32(toward))).hex()
        record["heldout"]["loss_bits"] = forged
    elif forgery == "below":
        sums[key] = "0" * 64
    elif forgery == "above":
        sums[key] = "f" * 64
    elif forgery == "missing":
        del sums[key]
    else:  # An array the state does not hold, recorded with a digest or with null.
        key = "['not_in_the_state']"
        sums[key] = None if forgery == "extra-null" else "0" * 64
    ledger.rewrite("requested", records)
    verdict = verifier.judge(workdir, 12, config, dataset)
    expected_bad = [key] if forgery in ("below", "above", "extra") else []
    if forgery.startswith("data-"):
        expected_reasons = ["the Grain iterator state differs from the requested one"]
    elif forgery.startswith(("heldout-", "loss-")):
        field = "predictions_sha256" if forgery.startswith("heldout-") else "loss_bits"
        computed = verdict["figures"]["heldout"][field]
        expected_reasons = [f"held-out `{field}` is `{computed}`, recorded `{forged}` at save time"]
    else:
        expected_reasons = [f"checksums differ for {expected_bad or 'the set of arrays'}"]
    assert not verdict["accepted"], verdict
    assert verdict["figures"]["checksum_mismatches"] == expected_bad, verdict["figures"]
    assert verdict["reasons"] == expected_reasons, verdict["reasons"]
    if forgery == "below":
        intact = verifier.judge(workdir, 9, config, dataset)
        assert intact["accepted"] and intact["figures"]["checksum_mismatches"] == [], intact


@pytest.mark.claims("accept-only-restorable", "recovery-points-judged")
def test_corrupted_completed_steps_are_rejected(finished_copy, jax_cache, evidence):
    """Two committed steps with flipped bytes are rejected by the verifier; steps 3 to 9 stay.

    Both steps were accepted before the damage; the verifier process judges every step (a
    restore that fails on damage is best kept out of the test process).
    """
    config, workdir = finished_copy
    dataset = data.make_dataset(config)
    before = {step: verifier.judge(workdir, step, config, dataset)["accepted"] for step in (12, 15)}
    changed = {step: faults.corrupt_step(workdir, step) for step in (12, 15)}
    checkpoint.Ledger(workdir).rewrite("verdicts", [])
    summary = run_verifier(workdir, jax_cache)
    after = {v["step"]: v for v in summary["verdicts"]}
    for step in (12, 15):
        ok = before[step] and changed[step] and not after[step]["accepted"]
        assert evidence.record(
            "bytes flipped in a committed step: rejected by the verifier process",
            f"step {step}, {len(changed[step])} data files changed",
            {"before": before[step], "reasons": after[step]["reasons"]},
            None,
            ok,
        ), after[step]
    intact = [after[s]["accepted"] for s in (3, 6, 9)]
    assert intact == [True] * 3 and summary["latest_accepted"] == 9, summary


@pytest.mark.claims("accept-matching-heldout", "recovery-points-judged")
@pytest.mark.parametrize("scale", [0.5, 0.999])
def test_a_degraded_artifact_with_regenerated_checksums_is_rejected(
    finished_copy, scale, jax_cache, evidence
):
    """A state scaled by 0.5 or 0.999, checksums regenerated, is rejected by its held-out check.

    Judged in this process for both scales, and for 0.5 also by the verifier process,
    after which the latest accepted step is the one before.
    """
    config, workdir = finished_copy
    dataset = data.make_dataset(config)
    step = 15
    faults.degrade_step(workdir, step, config, scale=scale)
    verdict = verifier.judge(workdir, step, config, dataset)
    figures = verdict["figures"]
    ok = (
        not verdict["accepted"]
        and figures["checksum_mismatches"] == []
        and any("held-out" in r for r in verdict["reasons"])
    )
    summary = {"latest_accepted": None}
    if scale == 0.5:
        # The same judgement by the separate verifier process, re-judging every step.
        checkpoint.Ledger(workdir).rewrite("verdicts", [])
        summary = run_verifier(workdir, jax_cache)
        process_verdict = next(v for v in summary["verdicts"] if v["step"] == step)
        ok = ok and not process_verdict["accepted"] and summary["latest_accepted"] == 12
    assert evidence.record(
        "checksums pass, held-out evaluation rejects",
        f"w2 scaled by {scale}",
        {
            "reasons": verdict["reasons"],
            "heldout": figures.get("heldout"),
            "recorded": figures.get("heldout_recorded"),
            "latest_accepted_after": summary["latest_accepted"],
        },
        None,
        ok,
    ), verdict


SCENARIOS = {"kill-after-step": "kill@8", "kill-during-save": "kill-during-save@9"}


@pytest.fixture(scope="module")
def recovery(tmp_path_factory, jax_cache):
    """Both interrupted runs, supervised concurrently, each continued once."""
    config = Config.tiny_recovery()
    root = tmp_path_factory.mktemp("recovery")
    results = {}

    def go(name, fault):
        results[name] = supervise(
            config, root / name, fault=fault, restarts=1, compilation_cache=jax_cache
        )

    threads = [threading.Thread(target=go, args=item) for item in SCENARIOS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return config, root, results


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run, in this process and in memory."""
    config = Config.tiny_recovery()
    result = train.train_and_evaluate(config, None)
    return {r["step"]: r for r in result["records"]}, result["final_heldout"]


def _attempt_logs(name: str, outcomes: list) -> str:
    """Each attempt's status, exit status and own log tail, for an assertion message:
    a job that died at its start says why only in its logs."""
    lines = [f"{name}: attempts ended {[o.status for o in outcomes]}"]
    for o in outcomes:
        lines.append(f"attempt {o.attempt}: `{o.status}`, exit status {o.returncode}")
        lines.append(job_log(o.workdir, o.attempt))
    return "\n".join(lines)


def _records(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.claims("continuation-bitwise")
def test_continuation_equals_an_uninterrupted_run_bitwise(recovery, reference, evidence):
    """Continued runs equal an uninterrupted run bitwise, after a kill and a kill during a save.

    Loss bits and sample IDs of every continued step against the reference run (the IDs
    also computed without any iterator); the continuation starts at the latest accepted
    step and ends with the reference's held-out figures.
    """
    config, root, results = recovery
    reference, reference_heldout = reference
    for name in SCENARIOS:
        outcomes = results[name]["outcomes"]
        # Checked first: the verification and the records below exist only if it holds.
        assert [o.status for o in outcomes] == ["killed", "completed"], _attempt_logs(
            name, outcomes
        )
        first_verification = results[name]["verifications"][0]
        start = outcomes[1].finished["start_step"]
        resumed = [r for r in _records(root / name) if r["attempt"] == 1]
        steps = [r["step"] for r in resumed]
        loss_equal = all(r["loss_bits"] == reference[r["step"]]["loss_bits"] for r in resumed)
        ids_equal = all(
            r["ids"] == reference[r["step"]]["ids"] == data.ids_for_step(config, r["step"])
            for r in resumed
        )
        ok = (
            start == first_verification["latest_accepted"]
            and steps == list(range(start + 1, config.num_steps + 1))
            and loss_equal
            and ids_equal
            and outcomes[1].finished["final_heldout"] == reference_heldout
        )
        assert evidence.record(
            "continued run = uninterrupted run (loss bits, sample IDs)",
            f"{name}: resumed from accepted step {start}",
            {"start": start, "steps": steps, "loss_equal": loss_equal, "ids_equal": ids_equal},
            {"bitwise": True},
            ok,
        ), (name, start, steps, loss_equal, ids_equal)


@pytest.mark.claims("recovery-points-judged", "accept-only-committed")
def test_only_completed_steps_are_accepted(recovery, evidence):
    """Only steps Orbax lists as committed are accepted; a save cut by a kill is rejected.

    Against Orbax's own list of committed steps and the job's own completion records;
    every checkpoint of the continuation is accepted; the save cut by a kill left only a
    temporary directory and was rejected as not completed.
    """
    import orbax.checkpoint as ocp

    config, root, results = recovery
    for name in SCENARIOS:
        outcomes = results[name]["outcomes"]
        # The continuation's start step is read below: it must have run and finished.
        assert len(outcomes) == 2 and outcomes[1].finished is not None, _attempt_logs(
            name, outcomes
        )
        workdir = root / name
        ledger = checkpoint.Ledger(workdir)
        job_completed = set(ledger.by_step("completed"))
        verdicts = [v for r in results[name]["verifications"] for v in r["verdicts"]]
        ever_accepted = {v["step"] for v in verdicts if v["accepted"]}
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=False)
        with ocp.CheckpointManager(checkpoint.checkpoint_dir(workdir), options=options) as mngr:
            orbax_steps = set(mngr.all_steps())
        final = {v["step"]: v["accepted"] for v in verdicts}  # The last verdict of each step.
        final_accepted = {s for s, a in final.items() if a}
        start = results[name]["outcomes"][1].finished["start_step"]
        continued = set(range(start + 3 - start % 3, config.num_steps + 1, 3))
        ok = (
            job_completed <= ever_accepted
            and final_accepted <= orbax_steps
            and continued <= final_accepted
        )
        cut = None
        if name == "kill-during-save":
            first = {v["step"]: v for v in results[name]["verifications"][0]["verdicts"]}
            tmp = [p.name for p in (workdir / "set-aside").iterdir() if p.name.startswith("9.")]
            cut = {"verdict": first.get(9), "temporary_dirs": tmp}
            ok = ok and first[9]["accepted"] is False and "not completed" in first[9]["reasons"][0]
            ok = ok and bool(tmp)
        assert evidence.record(
            "accepted = committed by Orbax; a save cut by a kill is never accepted",
            name,
            {
                "job_completed": sorted(job_completed),
                "orbax_steps": sorted(orbax_steps),
                "final_accepted": sorted(final_accepted),
                "continued_steps": sorted(continued),
                "cut_save": cut,
            },
            None,
            ok,
        ), (name, sorted(job_completed), sorted(orbax_steps), verdicts, cut)


def test_missing_or_damaged_checkpoint_folder_is_a_clear_error(tmp_path):
    """A missing checkpoint folder or a non-JSON ledger line is refused by name, nothing changed."""
    runner = CliRunner()
    result = runner.invoke(main, ["verify", "--workdir", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "holds no checkpoint folder" in result.output
    result = runner.invoke(main, ["run", "--resume", "--workdir", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "holds no checkpoint folder" in result.output
    assert not (tmp_path / "empty").exists()
    damaged = tmp_path / "damaged"
    _ledger(damaged, requested=[3, 6], verdicts=[(3, True)], committed=[3])
    path = damaged / "ledger" / "requested.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(checkpoint.CheckpointError, match="Line 2 of .* is not JSON"):
        checkpoint.latest_accepted(damaged)
    (damaged / "config.json").write_text(Config.tiny_recovery().to_json())
    result = runner.invoke(main, ["verify", "--workdir", str(damaged)])
    assert result.exit_code == 2 and "is not JSON" in result.output
    assert path.read_text().count("\n") == 3, "the damaged ledger is left as it was"
