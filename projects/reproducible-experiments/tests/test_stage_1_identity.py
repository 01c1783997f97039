"""Stage 1: a run that knows what it is.

Independent check: two tracked runs (the tiny config, then a changed config
with other seeds and width) are read back by a FRESH process with a new
client (`reproducible-experiments show`); the config, seeds and every identity
it reconstructs must equal what the test computes on its own: the config it
passed in, code identity from `git` run here, the data hash from the raw
scikit-learn arrays, split hashes from the in-memory split, runtime identity
from the imported packages. Every metric value must come back bit for bit.
Repeated on both back-ends (SQLite file, `mlflow server` on PostgreSQL).
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient
from sklearn.datasets import load_digits

from reproducible_experiments import data, identity, record, tracking, train
from reproducible_experiments.cli import main
from reproducible_experiments.config import Config, ConfigError, load_config

CLI = str(Path(sys.executable).parent / "reproducible-experiments")
CHANGED = Config.tiny().replace(train_seed=7, eval_seed=3, hidden_size=48, dropout_rate=0.1)


def _bits(values):
    return [int(np.float64(v).view(np.uint64)) for v in values]


# FAST, DIRECT CHECKS (first in the file: a wrong identity fails within seconds) ---------


def _git_here(repo, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True)
    return done.stdout


def _scratch_repo(tmp_path: Path) -> tuple[Path, Path, str]:
    """A git repository holding a copy of this package and its pyproject, committed."""
    project = tmp_path / "project"
    package = project / "src" / "reproducible_experiments"
    shutil.copytree(identity.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(identity.PROJECT_DIR / "pyproject.toml", project / "pyproject.toml")
    _git_here(project, "init", "-q")
    _git_here(project, "add", ".")
    _git_here(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    return project, package, _git_here(project, "rev-parse", "HEAD").decode().strip()


@pytest.mark.claims(
    "run-records-its-identities",
    "code-clean-tree",
    "code-tracked-edits-hashed",
    "code-untracked-files-hashed",
    "code-edits-reverted",
    "code-git-commit",
)
def test_code_identity_sees_the_uncommitted_diff(evidence, tmp_path):
    """git_identity's dirty flag and diff hash follow edits and untracked files, like git here.

    A scratch repository holding a copy of this package: the identity of the
    clean tree, after an edit, after a new untracked file, after that file's
    bytes change (its name does not), and with the edit reverted. Independent
    check: `git diff HEAD --binary` and `git rev-parse` run here, the diff
    hashed here."""
    project, package, commit = _scratch_repo(tmp_path)
    seen = {"clean": identity.git_identity(project, package)}
    edited = package / "model.py"
    original = edited.read_bytes()
    edited.write_bytes(original + b"# an uncommitted edit\n")
    seen["edited"] = identity.git_identity(project, package)
    diff = _git_here(
        project, "diff", "HEAD", "--binary", "--", "src/reproducible_experiments", "pyproject.toml"
    )
    (package / "extra.py").write_text("VALUE = 1\n")
    seen["edited + untracked"] = identity.git_identity(project, package)
    (package / "extra.py").write_text("VALUE = 2\n")  # Same name, other bytes.
    seen["edited + untracked, changed"] = identity.git_identity(project, package)
    (package / "extra.py").unlink()
    edited.write_bytes(original)
    seen["reverted"] = identity.git_identity(project, package)
    observed = {k: {t: v for t, v in tags.items()} for k, tags in seen.items()}
    assert evidence.record(
        "code identity: the uncommitted diff and untracked files count",
        "scratch repository: clean, edited, edited + untracked (twice, other bytes), reverted",
        observed,
        None,
        all(tags["code.git_commit"] == commit for tags in seen.values())
        and [seen[k]["code.git_dirty"] for k in seen] == ["false", "true", "true", "true", "false"]
        and seen["clean"]["code.git_diff_sha256"] == hashlib.sha256(b"").hexdigest()
        and seen["edited"]["code.git_diff_sha256"] == hashlib.sha256(diff).hexdigest()
        and len(diff) > 0
        and len(
            {
                seen[k]["code.git_diff_sha256"]
                for k in ("clean", "edited", "edited + untracked", "edited + untracked, changed")
            }
        )
        == 4
        and seen["reverted"] == seen["clean"]
        and seen["edited"]["code.source_sha256"] != seen["clean"]["code.source_sha256"],
    ), observed


@pytest.mark.claims("code-compiled-files-never-count")
def test_compiled_files_and_caches_never_count(tmp_path):
    """Untracked .pyc files leave the code identity clean; an untracked .py makes it dirty.

    Untracked `.pyc` files (in `__pycache__` or beside the source) are not code:
    the identity stays that of the clean tree. An untracked `.py` does count."""
    project, package, _ = _scratch_repo(tmp_path)
    clean = identity.git_identity(project, package)
    (package / "stray.pyc").write_bytes(b"\x00compiled")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\x00cached")
    assert identity.git_identity(project, package) == clean
    (package / "extra.py").write_text("VALUE = 1\n")
    dirty = identity.git_identity(project, package)
    assert dirty["code.git_dirty"] == "true" and dirty != clean


_A, _B = b"VALUE = 1\n", b"VALUE = 2\n"
# Untracked files of the package per state (path under the package -> bytes). Each state
# but `base` changes one thing; names keep their sorted order ("aux/" < "b.py") where only
# the path changes, so a hash of the bytes alone, in name order, would not move.
_UNTRACKED_STATES = {
    "base": {"a.py": _A, "b.py": _B},
    "renamed": {"a_renamed.py": _A, "b.py": _B},
    "moved into a subfolder": {"aux/a.py": _A, "b.py": _B},
    "contents swapped": {"a.py": _B, "b.py": _A},
    "empty file added": {"a.py": _A, "b.py": _B, "c.py": b""},
    "one byte changed": {"a.py": _A, "b.py": b"VALUE = 3\n"},
}


def _set_untracked(project: Path, package: Path, files: dict[str, bytes]) -> None:
    """Leaves exactly `files` untracked in the package (earlier untracked files removed)."""
    _git_here(project, "clean", "-fdqx", "--", "src/reproducible_experiments")
    for name, content in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(content)


@pytest.mark.claims(
    "code-untracked-files-hashed",
    "code-git-commit",
    "source-hash-by-path-and-bytes",
)
def test_untracked_files_enter_the_diff_hash_by_path_and_bytes(evidence, tmp_path):
    """Each untracked file's path and bytes enter code.git_diff_sha256, field by field.

    Two independent scratch repositories, the same tracked edit in both, then
    six states of the untracked files: a base, a rename, a move into a
    subfolder (same bytes), the contents of two files swapped, an empty file
    added, one byte changed. Every state must have its own diff hash; the same
    state must give the same hash in the other repository (built in reverse
    order) and again in the first after the others. The other tags, field by
    field: `git_commit` is `git rev-parse HEAD` run here, `git_dirty` is "true",
    `source_sha256` is the documented path-and-bytes reference written here."""
    sides = {}
    for side, order in (
        ("first", list(_UNTRACKED_STATES)),
        ("second", list(reversed(_UNTRACKED_STATES))),
    ):
        project, package, commit = _scratch_repo(tmp_path / side)
        edited = package / "model.py"
        edited.write_bytes(edited.read_bytes() + b"# an uncommitted edit\n")
        seen = {}
        for state in [*order, order[0]]:
            _set_untracked(project, package, _UNTRACKED_STATES[state])
            listed = _git_here(project, "ls-files", "--others", "-z").decode().split("\0")
            tags = identity.git_identity(project, package)
            key = state if state not in seen else f"{state} (again)"
            seen[key] = {
                "diff_sha256": tags["code.git_diff_sha256"],
                "commit_is_head": tags["code.git_commit"] == commit,
                "dirty": tags["code.git_dirty"],
                "source_is_reference": tags["code.source_sha256"] == _source_reference(package),
                "untracked_listed": sorted(
                    n.rsplit("reproducible_experiments/", 1)[1] for n in listed if n
                ),
            }
        sides[side] = seen
    first, second = sides["first"], sides["second"]
    hashes = {state: first[state]["diff_sha256"] for state in _UNTRACKED_STATES}
    same_as_base = [s for s in _UNTRACKED_STATES if s != "base" and hashes[s] == hashes["base"]]
    observed = {
        "first_repo": first,
        "second_repo": second,
        "distinct_hashes": len(set(hashes.values())),
        "states_hashing_like_base": same_as_base,
        "states_differing_across_repos": [
            s for s in _UNTRACKED_STATES if first[s]["diff_sha256"] != second[s]["diff_sha256"]
        ],
    }
    repeated = [k for side in sides.values() for k in side if k.endswith("(again)")]
    assert evidence.record(
        "code identity: every untracked file's path and bytes enter the diff hash",
        "two scratch repositories, same tracked edit; untracked files renamed, moved, "
        "swapped, an empty one added, one byte changed",
        observed,
        {"distinct_hashes": len(_UNTRACKED_STATES), "states_differing_across_repos": 0},
        observed["distinct_hashes"] == len(_UNTRACKED_STATES)
        and not same_as_base
        and not observed["states_differing_across_repos"]
        and len(repeated) == 2
        and all(
            side[k]["diff_sha256"] == side[k.removesuffix(" (again)")]["diff_sha256"]
            for side in sides.values()
            for k in side
            if k.endswith("(again)")
        )
        and all(
            tags["commit_is_head"]
            and tags["dirty"] == "true"
            and tags["source_is_reference"]
            and tags["untracked_listed"]
            == sorted(_UNTRACKED_STATES[state.removesuffix(" (again)")])
            for side in sides.values()
            for state, tags in side.items()
        ),
    ), observed


_GIT_CODES = (0, 1, -1, 128, -9)  # ok, error, killed by signal 1, git's fatal, SIGKILL


@pytest.mark.claims("code-git-unavailable")
@pytest.mark.parametrize("head_rc", _GIT_CODES)
@pytest.mark.parametrize("top_rc", _GIT_CODES)
def test_a_failed_git_never_names_a_commit(monkeypatch, head_rc, top_rc):
    """Unless both git rev-parse calls exit 0, the git tags are `unavailable` (25 code pairs).

    `git rev-parse HEAD` and `--show-toplevel` must both exit 0 (any other code,
    negative ones from a signal included) before the tree is called a commit."""

    def fake_git(*args, cwd=identity.PROJECT_DIR):
        codes = {"HEAD": head_rc, "--show-toplevel": top_rc}
        rc = codes.get(args[-1], 0) if args[0] == "rev-parse" else 0
        out = {"HEAD": b"c0ffee\n", "--show-toplevel": b"/top\n"}.get(args[-1], b"")
        return subprocess.CompletedProcess(
            ["git", *args], rc, out if args[0] == "rev-parse" else b"", b""
        )

    monkeypatch.setattr(identity, "_git", fake_git)
    got = identity.git_identity(identity.PROJECT_DIR, identity.PACKAGE_DIR)
    assert got["code.source_sha256"] == _source_reference(identity.PACKAGE_DIR)
    if head_rc == 0 and top_rc == 0:
        expected = ("c0ffee", "false", hashlib.sha256(b"").hexdigest())
    else:
        expected = ("unavailable",) * 3
    assert (got["code.git_commit"], got["code.git_dirty"], got["code.git_diff_sha256"]) == expected


@pytest.mark.claims("code-git-unavailable")
@pytest.mark.parametrize("error", [OSError("no git here"), subprocess.TimeoutExpired("git", 30)])
def test_git_missing_or_hung_leaves_code_identity_unavailable(monkeypatch, error):
    """A missing or hung git leaves only the source hash; the git tags are `unavailable`."""

    def broken_git(*args, cwd=identity.PROJECT_DIR):
        raise error

    monkeypatch.setattr(identity, "_git", broken_git)
    got = identity.git_identity(identity.PROJECT_DIR, identity.PACKAGE_DIR)
    assert got == {
        "code.source_sha256": _source_reference(identity.PACKAGE_DIR),
        "code.git_commit": "unavailable",
        "code.git_dirty": "unavailable",
        "code.git_diff_sha256": "unavailable",
    }


@pytest.mark.claims("code-git-unavailable")
@pytest.mark.parametrize("where", ["no repository", "no commit yet", "inside .git"])
def test_real_git_without_a_commit_or_work_tree(tmp_path, where):
    """Real git without a repository, a commit or a work tree names no commit.

    Real git: outside any repository both calls fail; a repository with no
    commit has a top level but no HEAD; inside `.git` HEAD resolves but there is
    no work tree. None of them is a commit."""
    project = tmp_path / "p"
    project.mkdir()
    if where != "no repository":
        _git_here(project, "init", "-q")
    if where == "inside .git":
        (project / "f.txt").write_text("x")
        _git_here(project, "add", ".")
        _git_here(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "s")
        project = project / ".git"
    got = identity.git_identity(project, identity.PACKAGE_DIR)
    assert [got[k] for k in ("code.git_commit", "code.git_dirty", "code.git_diff_sha256")] == [
        "unavailable"
    ] * 3


def _source_reference(package_dir: Path) -> str:
    """The documented source hash, written out here: per `.py` file in path
    order, its relative POSIX path, NUL, its bytes, NUL."""
    parts = b""
    for path in sorted(package_dir.rglob("*.py")):
        parts += path.relative_to(package_dir).as_posix().encode() + b"\0"
        parts += path.read_bytes() + b"\0"
    return hashlib.sha256(parts).hexdigest()


@pytest.mark.claims("source-hash-by-path-and-bytes")
def test_source_hash_covers_python_files_by_path_and_bytes(tmp_path):
    """source_sha256 equals a path-and-bytes reference over .py files; a rename changes it."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").write_text("B = 2\n")
    first = identity.source_sha256(package)
    assert first == _source_reference(package)
    assert identity.source_sha256(identity.PACKAGE_DIR) == _source_reference(identity.PACKAGE_DIR)
    (package / "notes.txt").write_text("not code")
    assert identity.source_sha256(package) == first  # Only `.py` files count.
    (package / "sub" / "b.py").rename(package / "sub" / "c.py")  # Same bytes, new name.
    renamed = identity.source_sha256(package)
    assert renamed != first and renamed == _source_reference(package)
    (package / "a.py").write_text("A = 3\n")
    assert identity.source_sha256(package) not in (first, renamed)


def _runtime_reference() -> dict[str, str]:
    """Runtime identity from the imported packages, without the package's code."""
    return {
        "runtime.python": platform.python_version(),
        "runtime.jax": jax.__version__,
        "runtime.jaxlib": importlib.metadata.version("jaxlib"),
        "runtime.flax": importlib.metadata.version("flax"),
        "runtime.optax": importlib.metadata.version("optax"),
        "runtime.numpy": np.__version__,
        "runtime.backend": jax.default_backend(),
        "runtime.device_kind": jax.devices()[0].device_kind,
        "runtime.device_count": str(jax.device_count()),
        "runtime.xla_flags": os.environ.get("XLA_FLAGS", ""),
        "runtime.machine": platform.machine(),
    }


@pytest.mark.claims("runtime-identity-tags")
def test_runtime_identity_names_every_version_and_device(monkeypatch):
    """runtime_identity equals versions and devices read here, and follows XLA_FLAGS."""
    assert identity.runtime_identity() == _runtime_reference()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert identity.runtime_identity()["runtime.xla_flags"] == "--xla_cpu_enable_fast_math=false"


def test_data_is_the_scaled_digits_and_hashes_the_raw_bytes():
    """data.load gives the digits scaled to [0, 1] and the sha256 of sklearn's raw bytes."""
    bunch = load_digits()
    digits = data.load()
    assert digits.images.dtype == np.float32 and digits.labels.dtype == np.int32
    np.testing.assert_array_equal(digits.images, (bunch.data / 16.0).astype(np.float32))
    assert digits.images.min() == 0.0 and digits.images.max() == 1.0
    np.testing.assert_array_equal(digits.labels, bunch.target)
    raw = hashlib.sha256(
        np.ascontiguousarray(bunch.data, "<f8").tobytes()
        + np.ascontiguousarray(bunch.target, "<i8").tobytes()
    ).hexdigest()
    assert digits.raw_sha256 == raw


@pytest.mark.claims("split-ids-hashed-on-their-own", "split-counted")
@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(
    n=st.integers(3, 60),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["int32", "int64", "uint16"]),
)
def test_each_split_is_hashed_and_counted_on_its_own(n, seed, dtype):
    """data_identity hashes each split's own IDs as <i4 in order and counts them, any partition.

    Any three-way partition of `range(n)` (a split may hold one ID), IDs in any
    integer dtype: each split's tag is the sha256 of ITS OWN IDs as little-endian
    int32, in the order given, and its count is its length."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cut = np.sort(rng.choice(np.arange(1, n), size=2, replace=False))
    parts = np.split(order, cut)
    split = {name: ids.astype(dtype) for name, ids in zip(data.SPLITS, parts, strict=True)}
    digits = data.Digits(np.zeros((n, 64), np.float32), np.zeros(n, np.int32), "raw-hash")
    got = data.data_identity(digits, split)
    expected = {"data.source": "sklearn.datasets.load_digits", "data.sha256": "raw-hash"}
    for name, ids in zip(data.SPLITS, parts, strict=True):
        ref = hashlib.sha256(b"".join(int(i).to_bytes(4, "little") for i in ids)).hexdigest()
        expected[f"data.split.{name}.sha256"] = ref
        expected[f"data.split.{name}.count"] = str(len(ids))
        assert data.ids_sha256(split[name]) == ref
    assert got == expected
    if len(parts[0]) > 1:  # The order is part of the identity.
        assert data.ids_sha256(parts[0][::-1]) != expected["data.split.train.sha256"]


@pytest.mark.claims("config-hash-canonical-json")
@pytest.mark.parametrize("config", [Config.tiny(), Config.default(), CHANGED])
def test_config_hash_is_of_its_canonical_json(config):
    """Config.sha256 is the sha256 of its sorted, spaceless JSON, whatever the field order.

    sha256 of the config's JSON with sorted keys and no spaces (the form any
    tool can recompute), not of the field order the class happens to declare."""
    fields = config.model_dump(mode="json")
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert config.sha256() == hashlib.sha256(canonical.encode()).hexdigest()
    assert canonical != json.dumps(fields, separators=(",", ":"))  # Sorting matters here.
    shuffled = Config.from_dict(dict(reversed(list(fields.items()))))
    assert shuffled.sha256() == config.sha256()


# THROUGH THE STORE AND A FRESH PROCESS -------------------------------------------


@pytest.mark.claims("run-records-its-identities", "show-rebuilds-in-a-fresh-process")
def test_fresh_process_reconstructs_every_identity(evidence, store, tmp_path):
    """A fresh `show` recovers config, seeds, identities and bitwise metrics of 2 runs."""
    client = store.client()
    _, exp_id = store.new_experiment(client, "identity")
    calls = {"log_batch": 0, "log_metric": 0}
    original_batch, original_metric = MlflowClient.log_batch, MlflowClient.log_metric

    def counting_batch(self, *args, **kwargs):
        if kwargs.get("metrics"):
            calls["log_batch"] += 1
        return original_batch(self, *args, **kwargs)

    def counting_metric(self, *args, **kwargs):
        calls["log_metric"] += 1
        return original_metric(self, *args, **kwargs)

    # The commit the runs are made from (read before them: in a shared checkout,
    # a commit made while the test runs must not count as a difference).
    head = subprocess.run(
        ["git", "-C", str(identity.PROJECT_DIR), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
    )
    identity._code_identity.cache_clear()  # Computed once per process: here, now.
    identity.code_identity()
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MlflowClient, "log_batch", counting_batch)
        mp.setattr(MlflowClient, "log_metric", counting_metric)
        for config in (Config.tiny(), CHANGED):
            run_id, result, status = record.run_tracked(client, exp_id, config)
            assert status == "FINISHED"
            runs[run_id] = result

    shown = subprocess.run(
        [CLI, "show", *runs, "--tracking-uri", store.uri],
        capture_output=True,
        text=True,
        timeout=900,  # A hang guard only.
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    records = {item["run_id"]: item for item in json.loads(shown.stdout)}

    # The test's own references, computed without the package's identity code.
    bunch = load_digits()
    raw = hashlib.sha256(
        np.ascontiguousarray(bunch.data, "<f8").tobytes()
        + np.ascontiguousarray(bunch.target, "<i8").tobytes()
    ).hexdigest()
    runtime = _runtime_reference()
    for run_id, result in runs.items():
        got = records[run_id]
        config = result.config
        split_hashes = {
            f"data.split.{name}.sha256": hashlib.sha256(ids.astype("<i4").tobytes()).hexdigest()
            for name, ids in result.split.items()
        }
        all_ids = np.sort(np.concatenate(list(result.split.values())))
        checks = {
            "config": got["config"] == config.model_dump(mode="json"),
            "config_sha256": got["config_sha256"] == config.sha256(),
            "seeds_separate": got["seeds"]
            == {"train_seed": config.train_seed, "eval_seed": config.eval_seed},
            "code": got["code"] == identity.code_identity(),
            "git_commit": got["code"]["code.git_commit"]
            == (head.stdout.strip() if head.returncode == 0 else "unavailable"),
            "data_raw": got["data"]["data.sha256"] == raw,
            "data_splits": all(got["data"][k] == v for k, v in split_hashes.items()),
            "split_ids": {k: v for k, v in got["split_ids"].items()}
            == {k: v.tolist() for k, v in result.split.items()},
            "split_partition": np.array_equal(all_ids, np.arange(len(bunch.target))),
            "runtime": got["runtime"] == runtime,
            "params_sha256": got["params_sha256"] == result.params_sha256,
        }
        series = result.metric_series()
        checks["metrics_bitwise"] = set(got["metrics"]) == set(series) and all(
            [s for s, _ in got["metrics"][k]] == [s for s, _ in series[k]]
            and _bits([v for _, v in got["metrics"][k]]) == _bits([v for _, v in series[k]])
            for k in series
        )
        values = sum(len(v) for v in series.values())
        assert evidence.record(
            "fresh process reconstructs config and every identity",
            f"{store.kind}, config {config.sha256()[:12]} (train_seed {config.train_seed}, "
            f"eval_seed {config.eval_seed})",
            {**checks, "metric_values": values},
            None,
            all(checks.values()),
        ), checks

    # Metrics went out in batches: a few log_batch calls, never one call per value.
    total = sum(sum(len(v) for v in r.metric_series().values()) for r in runs.values())
    assert evidence.record(
        "metrics logged in batches",
        store.kind,
        {**calls, "values": total},
        {"log_metric": 0, "log_batch_max": 4 * len(runs)},
        calls["log_metric"] == 0 and 0 < calls["log_batch"] <= 4 * len(runs),
    ), calls

    for run_id in runs:
        names = {a.path for a in client.list_artifacts(run_id)}
        assert {"config.json", "split_ids.json", "learning_curve.png"} <= names
        png = Path(client.download_artifacts(run_id, "learning_curve.png", str(tmp_path)))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.claims("run-records-its-identities")
def test_same_seeds_same_bits_and_seeds_stay_separate(evidence):
    """One config trains bitwise alike twice; train_seed moves params, eval_seed the split.

    Determinism (same config -> same bits) and the two seeds' separate roles.
    """
    a = train.train_and_evaluate(Config.tiny())
    b = train.train_and_evaluate(Config.tiny())
    other_train = train.train_and_evaluate(Config.tiny().replace(train_seed=1))
    other_eval = train.train_and_evaluate(Config.tiny().replace(eval_seed=1))
    same = a.params_sha256 == b.params_sha256 and _bits(
        [v for s in a.metric_series().values() for _, v in s]
    ) == _bits([v for s in b.metric_series().values() for _, v in s])
    assert evidence.record(
        "same config and seeds give bitwise-identical metrics and parameters",
        "tiny config, twice in one process",
        {"params_sha256": a.params_sha256, "test_accuracy": a.test["test_accuracy"]},
        {"bitwise": True},
        same,
    )
    roles = {
        "train_seed changes parameters": other_train.params_sha256 != a.params_sha256,
        "train_seed keeps the split": other_train.data_identity == a.data_identity,
        "eval_seed changes the split": other_eval.data_identity["data.split.test.sha256"]
        != a.data_identity["data.split.test.sha256"],
        "eval_seed keeps the data bytes": other_eval.data_identity["data.sha256"]
        == a.data_identity["data.sha256"],
    }
    assert evidence.record(
        "training and evaluation seeds act separately",
        "train_seed 0->1; eval_seed 0->1",
        roles,
        None,
        all(roles.values()),
    ), roles


def test_tracking_uri_is_explicit_even_with_mlruns_present(tmp_path, monkeypatch, evidence):
    """The CLI tracks into runs/mlflow.db even when a ./mlruns folder exists.

    MLflow silently uses `./mlruns` when it exists; the CLI must not.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    config_file = tmp_path / "tiny.json"
    config_file.write_text(Config.tiny().to_json())
    result = CliRunner().invoke(main, ["train", "--config", str(config_file), "--no-checkpoint"])
    assert result.exit_code == 0, result.output
    run_id = result.output.split("run ", 1)[1].split()[0]
    client = tracking.connect(tmp_path / "runs" / "mlflow.db")
    found = client.get_run(run_id).info.status
    observed = {
        "status_in_runs_db": found,
        "mlruns_entries": sorted(p.name for p in (tmp_path / "mlruns").iterdir()),
    }
    assert evidence.record(
        "default store is runs/mlflow.db, named explicitly",
        "a ./mlruns folder exists in the working directory",
        observed,
        None,
        found == "FINISHED" and observed["mlruns_entries"] == [],
    ), observed


def test_bad_config_is_a_clear_error(tmp_path, sqlite_store):
    """Bad or unknown config fields raise ConfigError naming them; the CLI exits 2."""
    project = Path(__file__).resolve().parents[1]
    assert load_config(project / "configs" / "tiny.json") == Config.tiny()
    assert load_config(project / "configs" / "default.json") == Config.default()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 0, "colour": "red"}))
    with pytest.raises(ConfigError, match=r"Field `hidden_size` has value `0`"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"Unknown field `colour`"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"`val_fraction` \+ `test_fraction` must be at most"):
        Config.tiny().replace(val_fraction=0.5, test_fraction=0.5)
    result = CliRunner().invoke(main, ["train", "--config", str(bad)])
    assert result.exit_code == 2
    assert "Invalid config" in result.output and "Traceback" not in result.output
    missing = CliRunner().invoke(main, ["show", "0" * 32, "--tracking-uri", sqlite_store.uri])
    assert missing.exit_code == 2 and "is not in" in missing.output
