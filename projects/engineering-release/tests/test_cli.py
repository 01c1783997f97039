"""The command line end to end, in one state: register, evaluate, approve,
release, status, verify, rollback, and bad input refused with exit code 2
(a value that names nothing) or 1 (a refusal), changing nothing."""

import json
import re

from click.testing import CliRunner

from engineering_release.cli import main


def run(root, *args):
    result = CliRunner().invoke(main, ["--root", str(root), *args])
    return result.exit_code, result.output


def test_cli_release_cycle_and_bad_input(tmp_path):
    root = tmp_path / "release"
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"hidden_size": 32, "num_epochs": 12}))
    ids = []
    for seed in ("0", "1"):
        code, out = run(root, "register", "--config", str(config), "--seed", seed)
        assert code == 0, out
        ids.append(re.search(r"model ([0-9a-f]{64})", out).group(1))
    evaluations = []
    for model_id in ids:
        code, out = run(root, "evaluate", model_id[:12])
        assert code == 0, out
        evaluations.append(re.search(r"evaluation ([0-9a-f]{64})", out).group(1))
    # An approval for another model id: refused (exit 1), nothing appended.
    code, out = run(root, "approve", ids[1], evaluations[0])
    assert code == 1 and "judged model" in out, out
    assert not (root / "ledger.jsonl").exists()
    for model_id, evaluation_id in zip(ids, evaluations, strict=True):
        code, out = run(root, "approve", model_id, evaluation_id)
        assert code == 0, out
    code, out = run(root, "release", "0123456789abcdef")
    assert code == 2 and "Unknown object id `0123456789abcdef`" in out, out
    code, out = run(root, "release", "not-an-id")
    assert code == 2 and "`not-an-id` is not an object id" in out, out
    code, out = run(root, "release", ids[0])
    assert code == 0 and "release:" in out, out
    code, out = run(root, "release", ids[1])
    assert code == 0, out
    code, out = run(root, "rollback")
    assert code == 0 and f"rollback: {ids[0]}" in out, out
    code, out = run(root, "status", "--json")
    status = json.loads(out)
    assert status["serving"] == ids[0] and status["previous"] == ids[1]
    assert status["registry"]["champion"] == ids[0]
    code, out = run(root, "verify")
    assert code == 0 and "verified: 5 log entries" in out, out
    # An edited log fails verification with the reason.
    log = root / "ledger.jsonl"
    text = log.read_text()
    log.write_text(text.replace(ids[1], ids[0], 1))
    code, out = run(root, "verify")
    assert code == 1 and "problem:" in out, out
    log.write_text(text)
    code, out = run(root, "set-policy", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json" in out, out
