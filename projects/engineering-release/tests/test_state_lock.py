"""Commands serialize on the state, and the record keeps every entry it reported.

Concurrency: four processes run log- and keyring-writing commands against one
state at once; every command that reported success must find its entry in
the final log (by sequence number and hash) or its key in the final keyring,
and the log must hold exactly the entries that were reported. Then four
processes mix every kind of command (approve, evaluate, status, keygen,
verify, release, rollback: the lock held for commits only, work done
unlocked): none crashes, a refusal names its reason, the log holds exactly
the entries reported, and `verify` passes. The record's
tail: a log that lost anchored entries, or whose anchored tail was rewritten,
fails `verify` with both counts named, and no command extends it (which
would hide the loss once the log grew back to the anchor's length).
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from engineering_release import data, ledger, signing
from engineering_release.cli import main

PROCESSES, COMMANDS = 4, 12


def run(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--root", str(root), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.fixture
def released(released_template, tmp_path):
    template, models, evaluations = released_template
    root = tmp_path / "release"
    shutil.copytree(template, root)
    return root, models, evaluations


def test_concurrent_commands_lose_nothing(released, tmp_path):
    root, models, evaluations = released
    before = ledger.read(root / "ledger.jsonl")
    ring_before = signing.read_keyring(root / "keys")
    train_ids, heldout_ids = data.split_ids(0, 0.2)
    split = tmp_path / "split.npz"
    np.savez(split, train=train_ids, heldout=heldout_ids)
    pem = str(root / "keys" / "approver.pem")
    groups = [
        ["approve", models[0], evaluations[0], "--key", pem],
        ["keygen", "operator-{p}-{i}"],
        ["approve", models[1], evaluations[1], "--key", pem, "--signer", "process-{p}"],
    ]
    argv = [str(Path(__file__).with_name("stress_worker.py")), str(root), str(PROCESSES)]
    argv += [str(COMMANDS), str(split)]
    for group in groups:
        argv += ["--", *group]
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == PROCESSES * COMMANDS
    crashed = [(r["args"][0], r["exception"]) for r in records if r["exception"]]
    failed = [(r["args"][0], r["exit"], r["output"][-300:]) for r in records if r["exit"] != 0]
    reported, keys = [], []
    for r in records:
        if r["exit"] != 0:
            continue
        if r["args"][0] == "approve":
            found = re.search(r"approved: log entry (\d+) ([0-9a-f]{64})", r["output"])
            reported.append((int(found.group(1)), found.group(2)))
        else:
            keys.append(re.search(r"key ([0-9a-f]{16}) at ", r["output"]).group(1))
    final = ledger.read(root / "ledger.jsonl")
    in_log = {(e["seq"], e["hash"]) for e in final}
    lost = [entry for entry in reported if entry not in in_log]
    ring = signing.read_keyring(root / "keys")
    lost_keys = [kid for kid in keys if kid not in ring]
    code, out = run(root, "verify")
    summary = {
        "crashed": crashed[:5],
        "failed": failed[:5],
        "lost_entries": lost,
        "lost_keys": lost_keys,
        "entries": (len(before), len(reported), len(final)),
        "keys": (len(ring_before), len(keys), len(ring)),
        "verify": out[-600:],
    }
    assert not crashed and not failed, summary
    assert not lost and not lost_keys, summary
    assert len(final) == len(before) + len(reported), summary
    assert sorted(seq for seq, _ in reported) == list(range(len(before), len(final))), summary
    assert len(ring) == len(ring_before) + len(keys), summary
    assert code == 0 and f"verified: {len(final)} log entries" in out, summary


# What a command mixed with others may rightly answer with exit 1.
REFUSALS = (
    "is already the serving release",
    "is the one serving now",
    "changed while",
    "Rollback refused",
    "now names",
)


def test_mixed_commands_lose_nothing_and_refuse_with_reasons(released, tmp_path):
    from lock_waits import COMMANDS, WRITES

    root, models, evaluations = released
    before = ledger.read(root / "ledger.jsonl")
    train_ids, heldout_ids = data.split_ids(0, 0.2)
    split = tmp_path / "split.npz"
    np.savez(split, train=train_ids, heldout=heldout_ids)
    ids = {"m0": models[0], "m1": models[1], "e0": evaluations[0], "e1": evaluations[1]}
    ids["pem"] = str(root / "keys" / "approver.pem")
    argv = [str(Path(__file__).with_name("stress_worker.py")), str(root), "4", "8", str(split)]
    for command in COMMANDS:
        argv += ["--", *[a.format(p="{p}", i="{i}", **ids) for a in command]]
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 4 * 8
    crashed = [(r["args"][0], r["exception"]) for r in records if r["exception"]]
    unexplained = [
        (r["args"][0], r["exit"], r["output"][-300:])
        for r in records
        if r["exit"] != 0 and not (r["exit"] == 1 and any(x in r["output"] for x in REFUSALS))
    ]
    assert not crashed and not unexplained, (crashed, unexplained)
    assert {r["args"][0] for r in records if r["exit"] == 0} >= {"approve", "evaluate", "status"}
    reported = {
        (int(seq), digest)
        for r in records
        if r["exit"] == 0
        for seq, digest in WRITES.findall(r["output"])
    }
    final = ledger.read(root / "ledger.jsonl")
    assert final[: len(before)] == before
    assert {(e["seq"], e["hash"]) for e in final[len(before) :]} == reported
    code, out = run(root, "verify")
    assert code == 0 and f"verified: {len(final)} log entries" in out, out


def _lines(root: Path) -> list[str]:
    return (root / "ledger.jsonl").read_text().splitlines()


@pytest.mark.parametrize("keep", [1, 0, None], ids=["one-of-three", "emptied", "deleted"])
def test_verify_detects_a_log_truncated_below_its_anchor(released, keep):
    root, models, evaluations = released
    lines = _lines(root)
    assert len(lines) == 3  # approve A, approve B, release A: anchored by the registry.
    log = root / "ledger.jsonl"
    if keep is None:
        log.unlink()
    else:
        log.write_text("".join(line + "\n" for line in lines[:keep]))
    held = 0 if keep is None else keep
    damaged = log.read_bytes() if log.exists() else None
    code, out = run(root, "verify")
    assert code == 1, out
    assert f"anchored 3 log entries, but the log holds {held}" in out, out
    # No command extends it: an approval appended now would be a different entry
    # at an anchored position, and enough of them would restore the anchored length.
    pem = str(root / "keys" / "approver.pem")
    for _ in range(3 - held):
        code, out = run(root, "approve", models[1], evaluations[1], "--key", pem)
        assert code == 1 and "anchored 3" in out, out
    assert (log.read_bytes() if log.exists() else None) == damaged
    code, out = run(root, "verify")
    assert code == 1 and f"anchored 3 log entries, but the log holds {held}" in out, out


def test_a_rewritten_anchored_tail_is_detected_and_not_extended(released):
    root, models, evaluations = released
    entries = ledger.read(root / "ledger.jsonl")
    # The last entry replaced by another valid one: the chain holds, the length is the
    # anchor's; only the anchored head hash tells (what a lost concurrent update leaves).
    other = ledger.make_entry(entries[:2], "approve", entries[0]["body"])
    rewritten = [*entries[:2], other]
    assert ledger.verify_chain(rewritten) == []
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in rewritten)
    (root / "ledger.jsonl").write_text(text)
    code, out = run(root, "verify")
    assert code == 1 and "Log entry 2 does not hash to the registry's anchor" in out, out
    pem = str(root / "keys" / "approver.pem")
    code, out = run(root, "approve", models[1], evaluations[1], "--key", pem)
    assert code == 1 and "anchor" in out, out
    assert (root / "ledger.jsonl").read_text() == text
