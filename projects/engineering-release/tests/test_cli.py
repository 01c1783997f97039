"""The command line end to end, in one state: register, evaluate, approve,
release, status, verify, rollback, and bad input refused with exit code 2
(a value that names nothing) or 1 (a refusal), changing nothing."""

import json
import re
from pathlib import Path

from click.testing import CliRunner

from engineering_release.cli import main

PROJECT = Path(__file__).resolve().parents[1]


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


def _stand_in_for_training(trained, monkeypatch):
    """`train.train` answers with the session's seed-0 model (the command's training is
    the stage-1 tests' subject; here it is the state around it), after checking that it
    was asked for exactly the run `configs/tiny.json` describes."""
    from engineering_release import train
    from engineering_release.config import TrainConfig

    def stand_in(config):
        assert config == TrainConfig.tiny(seed=0), config
        return trained[0]

    monkeypatch.setattr(train, "train", stand_in)


def test_readme_register_with_the_default_relative_root(trained, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from engineering_release import registry
    from engineering_release.store import tree_digest

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.json").write_bytes(
        (PROJECT / "configs" / "tiny.json").read_bytes()
    )
    monkeypatch.chdir(tmp_path)
    _stand_in_for_training(trained, monkeypatch)
    result = CliRunner().invoke(main, ["register", "--config", "configs/tiny.json"])
    assert result.exit_code == 0 and result.exception is None, result.output
    model_id = re.search(r"model ([0-9a-f]{64})", result.output).group(1)
    objects = tmp_path / "runs" / "release" / "store" / "objects"
    assert [p.name for p in objects.iterdir()] == [model_id]
    assert tree_digest(objects / model_id) == model_id
    uri = f"sqlite:///{tmp_path / 'runs' / 'release' / 'registry.db'}"
    versions = MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions(
        f"name='{registry.MODEL_NAME}'"
    )
    assert [(v.tags["model_id"], v.source) for v in versions] == [
        (model_id, (objects / model_id).as_uri())
    ]
    result = CliRunner().invoke(main, ["verify"])
    assert result.exit_code == 0 and "verified: 0 log entries, 1 objects" in result.output


def test_a_failed_registration_leaves_no_stored_model(trained, tmp_path, monkeypatch):
    from engineering_release import registry

    _stand_in_for_training(trained, monkeypatch)

    def refuse(client, model_id, source):
        raise registry.RegistryError("The registry refused the version (a test stand-in).")

    monkeypatch.setattr(registry, "register", refuse)
    root = tmp_path / "release"
    config = PROJECT / "configs" / "tiny.json"
    code, out = run(root, "register", "--config", str(config))
    assert code == 1 and "refused the version" in out, out
    objects = root / "store" / "objects"
    assert not objects.exists() or list(objects.iterdir()) == []
    scratch = root / "store" / "scratch"
    assert not scratch.exists() or list(scratch.iterdir()) == []
