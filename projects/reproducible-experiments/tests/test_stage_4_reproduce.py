"""Stage 4: reproduce from the record.

Independent check: `reproducible-experiments reproduce RUN_ID` runs in a FRESH
process that has only the run id and the store (on SQLite; on the server
back-end the same function runs in-process with a new client); it must recover the config,
seeds and identities from the record, re-run, and find every metric value
bitwise equal (the test also compares the two metric histories itself, as
float64 bit patterns read from the store). Repeated under changed conditions:
  - a real runtime change (`XLA_FLAGS` giving 2 CPU devices): the verdict must
    name the runtime identity and must not call the re-run a reproduction;
  - a record whose code commit or data hash says otherwise: the verdict names
    `code` or `data`;
  - a one-ulp change in a metric value: the bitwise comparison catches it.
On both back-ends.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reproducible_experiments import checkpoint, identity, record, reproduce
from reproducible_experiments.config import Config
from reproducible_experiments.tracking import TrackingError

CLI = str(Path(sys.executable).parent / "reproducible-experiments")


def _cli_reproduce(store, run_id: str, env_extra: dict[str, str] | None = None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [CLI, "reproduce", run_id, "--tracking-uri", store.uri, "--json"],
        capture_output=True,
        text=True,
        timeout=900,  # A hang guard only.
        env=env,
        check=False,
    )


def _history_bits(client, run_id: str) -> dict[str, list[tuple[int, int]]]:
    run = client.get_run(run_id)
    return {
        key: sorted(
            (m.step, int(np.float64(m.value).view(np.uint64)))
            for m in client.get_metric_history(run_id, key)
        )
        for key in run.data.metrics
    }


@pytest.mark.claims(
    "verdict-names-differing-identities",
    "verdict-not-reproduced",
    "verdict-reproduced",
)
def test_the_verdict_names_what_differs(evidence):
    """verdict_of names each differing identity and says reproduced only when all match.

    The verdict for each way a re-run can differ, written out by hand.
    """
    same = {"code": {}, "data": {}, "runtime": {}}
    one = ("a", "b")
    cases = {
        "all equal": (same, {}, True, True, "reproduced"),
        "no params or checkpoint recorded": (same, {}, None, None, "reproduced"),
        "a metric differs": (same, {"loss": "x"}, True, True, "NOT reproduced"),
        "params differ": (same, {}, False, None, "NOT reproduced"),
        "checkpoint differs": (same, {}, True, False, "NOT reproduced"),
        "code differs": (
            {**same, "code": {"k": one}},
            {},
            True,
            True,
            "not a reproduction: code identity differs",
        ),
        "runtime differs": (
            {**same, "runtime": {"k": one}},
            {},
            True,
            True,
            "not a reproduction: runtime identity differs",
        ),
        "data and runtime differ": (
            {**same, "data": {"k": one}, "runtime": {"k": one}},
            {"loss": "x"},
            True,
            True,
            "not a reproduction: data and runtime identity differs",
        ),
    }
    got = {name: reproduce.verdict_of(*args[:4]) for name, args in cases.items()}
    assert evidence.record(
        "the verdict names each differing identity and never says reproduced otherwise",
        f"{len(cases)} cases",
        got,
        None,
        all(got[name].startswith(args[4]) for name, args in cases.items()),
    ), got


@pytest.mark.claims("compare-float64-bits", "compare-missing-series")
def test_bitwise_comparison_catches_one_ulp(evidence):
    """compare_metrics flags a one-ulp change and a missing series, and nothing in a copy."""
    recorded = {"test_loss": [(5, 0.25)], "val_loss": [(1, 0.5), (2, 0.4)]}
    nudged = {"test_loss": [(5, float(np.nextafter(0.25, 1.0)))], "val_loss": [(1, 0.5), (2, 0.4)]}
    mismatches, compared = reproduce.compare_metrics(recorded, nudged)
    same, _ = reproduce.compare_metrics(recorded, {k: list(v) for k, v in recorded.items()})
    missing, _ = reproduce.compare_metrics(recorded, {"test_loss": [(5, 0.25)]})
    assert evidence.record(
        "bitwise comparison: one ulp is a difference, a missing series is a difference",
        "test_loss nudged by one ulp; val_loss removed",
        {"one_ulp": mismatches, "identical": same, "missing": missing, "compared": compared},
        None,
        list(mismatches) == ["test_loss"] and same == {} and list(missing) == ["val_loss"],
    )


@pytest.mark.claims("compare-float64-bits", "compare-counts-values")
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_the_first_differing_step_is_named(direction):
    """A one-ulp change at step 2 of 3 is named with both values; 3 values are compared.

    One ulp up or down at the second of three steps: the mismatch names that
    step and both values; every value on both sides is counted as compared."""
    old = [(1, 0.5), (2, 0.4), (3, 0.3)]
    moved = float(np.nextafter(0.4, direction * np.inf))
    new = [(1, 0.5), (2, moved), (3, 0.3)]
    mismatches, compared = reproduce.compare_metrics({"loss": old}, {"loss": new})
    assert mismatches == {"loss": f"step 2: recorded {0.4!r}, now {moved!r}"}
    assert compared == 3


@pytest.mark.claims("compare-float64-bits")
@pytest.mark.parametrize(
    "before, after",
    [(0.0, -0.0), (-0.0, 0.0), (float("nan"), -float("nan"))],
    ids=["zero-to-negative-zero", "negative-zero-to-zero", "nan-sign"],
)
def test_values_equal_as_floats_but_not_in_bits_are_a_difference(before, after):
    """0.0 against -0.0, and NaNs of two sign bits, differ in float64 bits: the first such step is
    named."""
    assert np.float64(before).view(np.uint64) != np.float64(after).view(np.uint64)
    old = [(1, 0.5), (2, before), (3, 0.3)]
    new = [(1, 0.5), (2, after), (3, 0.3)]
    mismatches, compared = reproduce.compare_metrics({"loss": old}, {"loss": new})
    assert mismatches == {"loss": f"step 2: recorded {before!r}, now {after!r}"}
    assert compared == 3


@pytest.mark.claims("compare-missing-series", "compare-steps-differ", "compare-counts-values")
def test_every_series_and_step_is_compared_both_ways():
    """compare_metrics names missing series and differing steps both ways, counting values.

    Series missing on either side, steps that differ (sorting before and after),
    and a clean match, with the count of values compared written out here."""
    recorded = {
        "a": [(1, 1.0), (2, 2.0)],
        "b": [(1, 1.0), (2, 2.0)],
        "c": [(1, 1.0), (3, 3.0)],
        "only_recorded": [(1, 1.0)],
        "same": [(2, 0.5), (1, 0.25)],  # Order of the pairs does not matter.
    }
    now = {
        "a": [(1, 1.0), (3, 2.0)],  # A later step now.
        "b": [(1, 1.0)],  # A step lost.
        "c": [(1, 1.0), (2, 3.0)],  # An earlier step now.
        "only_now": [(4, 4.0)],
        "same": [(1, 0.25), (2, 0.5)],
    }
    mismatches, compared = reproduce.compare_metrics(recorded, now)
    assert mismatches == {
        "a": "steps differ (2 recorded, 2 now)",
        "b": "steps differ (2 recorded, 1 now)",
        "c": "steps differ (2 recorded, 2 now)",
        "only_now": "missing from the record",
        "only_recorded": "missing from the re-run",
    }
    assert compared == 2 + 1 + 2 + 2
    assert reproduce.compare_metrics({}, {}) == ({}, 0)
    assert reproduce.compare_metrics(now, now) == ({}, 1 + 2 + 2 + 1 + 2)


@pytest.mark.claims(
    "verdict-names-differing-identities",
    "verdict-not-reproduced",
    "verdict-reproduced",
)
def test_whole_verdicts_word_for_word():
    """verdict_of's sentences equal the documented wording for each combination of parts."""
    same = {"code": {}, "data": {}, "runtime": {}}
    one = {"k": ("a", "b")}
    assert reproduce.verdict_of({**same, "code": one}, {}, True, True) == (
        "not a reproduction: code identity differs; the re-run's metrics are bitwise equal"
    )
    assert reproduce.verdict_of({**same, "data": one, "runtime": one}, {"m": "x"}, None, None) == (
        "not a reproduction: data and runtime identity differs; the re-run's metrics are different"
    )
    assert reproduce.verdict_of(
        {"code": one, "data": one, "runtime": one}, {}, False, False
    ).startswith("not a reproduction: code and data and runtime identity differs")
    for params, ckpt in ((True, True), (None, True), (True, None), (None, None)):
        assert reproduce.verdict_of(same, {}, params, ckpt) == "reproduced"
    for mismatches, params, ckpt in (
        ({"m": "x"}, True, True),
        ({}, False, True),
        ({}, None, False),
    ):
        assert reproduce.verdict_of(same, mismatches, params, ckpt) == (
            "NOT reproduced: identities match but the metrics differ"
        )


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(verdict=st.one_of(st.text(max_size=30), st.sampled_from(["reproduced", "reproduced!", "z"])))
def test_only_the_verdict_reproduced_is_a_reproduction(verdict):
    """Reproduction.reproduced is True for the verdict `reproduced` exactly, no other."""
    made = reproduce.Reproduction("r", verdict, {}, {}, 0, None, None, None)
    assert made.reproduced is (verdict == "reproduced")


_TAG = st.sampled_from(["a", "b", "c", "d", "e"])
_VALUE = st.sampled_from(["", "0", "1", "x", "y"])


@pytest.mark.claims("identity-differences-key-by-key")
@settings(max_examples=80, derandomize=True, deadline=None, database=None)
@given(recorded=st.dictionaries(_TAG, _VALUE), current=st.dictionaries(_TAG, _VALUE))
def test_identity_differences_against_a_key_by_key_reference(recorded, current):
    """identity.differences equals a key-by-key reference, `<missing>` for absent keys.

    Every key on either side whose value differs or is missing on one side,
    with both values (`<missing>` for the absent one); equal keys never appear."""
    expected = {}
    for key in "abcde":
        if key in recorded or key in current:
            pair = (recorded.get(key, "<missing>"), current.get(key, "<missing>"))
            if key not in recorded or key not in current or pair[0] != pair[1]:
                expected[key] = pair
    assert identity.differences(recorded, current) == expected
    assert identity.differences(current, recorded) == {k: v[::-1] for k, v in expected.items()}


@pytest.mark.claims("params-digest-by-path")
def test_params_digest_against_a_reference():
    """checkpoint.digest equals a sha256 over leaves sorted by path; any change moves it.

    sha256 over `path|dtype|shape|` and the bytes of each leaf, leaves sorted by
    their path string: with eleven list entries that order ([0], [10], [1], ...)
    is not the tree's own. Any changed value, dtype, shape or path changes it."""
    params = {"w": [np.full((2,), i, np.float32) for i in range(11)], "b": np.arange(3)}
    leaves = [(f"['w'][{i}]", a) for i, a in enumerate(params["w"])] + [("['b']", params["b"])]
    h = hashlib.sha256()
    for path, leaf in sorted(leaves):
        h.update(f"{path}|{leaf.dtype}|{leaf.shape}|".encode() + leaf.tobytes())
    assert checkpoint.digest(params) == h.hexdigest()
    changed = [
        {**params, "b": np.arange(3) + 1},
        {**params, "b": np.arange(3).astype(np.int32)},
        {**params, "b": np.arange(3).reshape(1, 3)},
        {"w": params["w"], "c": params["b"]},
    ]
    assert len({checkpoint.digest(p) for p in [params, *changed]}) == 5


@pytest.mark.claims("reproduce-bitwise-from-the-record", "differing-identity-named")
def test_reproduce_in_a_fresh_process_is_bitwise(evidence, store):
    """A fresh process reproduces a run bitwise from its record; a runtime change is named."""
    client = store.client()
    _, exp_id = store.new_experiment(client, "reproduce")
    config = Config.tiny().replace(train_seed=5, eval_seed=2, dropout_rate=0.2)
    run_id, _, status = record.run_tracked(client, exp_id, config)
    assert status == "FINISHED"

    if store.kind == "sqlite":  # A fresh process: it has only the run id and the store.
        same = _cli_reproduce(store, run_id)
        assert same.returncode == 0, same.stdout + same.stderr
        result = json.loads(same.stdout)
    else:  # The same path in this process (a new client), to spare a process start.
        result = reproduce.reproduce(store.client(), run_id).to_json()
    original, rerun = _history_bits(client, run_id), _history_bits(client, result["new_run_id"])
    rerun_record = record.load_record(client, result["new_run_id"])
    assert evidence.record(
        "re-run from the record alone: every metric value bitwise equal",
        f"{store.kind}, same runtime, "
        + ("fresh process" if store.kind == "sqlite" else "new client"),
        {
            "verdict": result["verdict"],
            "values_compared": result["values_compared"],
            "params_sha256_equal": result["params_sha256_equal"],
            "test_own_bitwise_comparison": original == rerun,
        },
        {"bitwise": True},
        result["verdict"] == "reproduced"
        and original == rerun
        and result["values_compared"] == sum(len(v) for v in original.values())
        and result["params_sha256_equal"] is True
        and rerun_record.config == config
        and rerun_record.tags["reproduce.of"] == run_id,
    ), result

    if store.kind == "sqlite":  # One real runtime change is enough; it costs a process.
        # One more CPU device than this process has, on top of whatever XLA_FLAGS
        # the environment already sets (the original run recorded those).
        before_flags = os.environ.get("XLA_FLAGS", "")
        before_count = jax.device_count()
        flags = f"{before_flags} --xla_force_host_platform_device_count={before_count + 1}".strip()
        changed = _cli_reproduce(store, run_id, {"XLA_FLAGS": flags})
        assert changed.returncode == 1, changed.stdout + changed.stderr
        payload = json.loads(changed.stdout)
        runtime = payload["identity_differences"]["runtime"]
        assert evidence.record(
            "a changed runtime is named and the re-run is not called a reproduction",
            f"{store.kind}, XLA_FLAGS={flags}",
            {"verdict": payload["verdict"], "runtime_differences": runtime},
            None,
            payload["verdict"].startswith("not a reproduction: runtime identity differs")
            and runtime["runtime.xla_flags"] == [before_flags, flags]
            and runtime["runtime.device_count"] == [str(before_count), str(before_count + 1)]
            and not payload["identity_differences"]["code"]
            and not payload["identity_differences"]["data"],
        ), payload


@pytest.mark.claims("differing-identity-named")
@pytest.mark.parametrize(
    ("tag", "kind"),
    [("code.git_commit", "code"), ("data.sha256", "data"), ("runtime.jax", "runtime")],
)
def test_a_differing_identity_is_named(evidence, store, tag, kind):
    """An altered code, data or runtime tag is named alone, and the re-run is no reproduction."""
    client = store.client()
    _, exp_id = store.new_experiment(client, f"identity-{kind}")
    run_id, _, _ = record.run_tracked(client, exp_id, Config.tiny())
    client.set_tag(run_id, tag, "0" * 40)  # The record says another code / data / runtime.
    result = reproduce.reproduce(client, run_id, track=False)
    named = result.identity_differences[kind]
    others = [
        k for k in ("code", "data", "runtime") if k != kind and result.identity_differences[k]
    ]
    assert evidence.record(
        "a differing identity is named, and the result is not a reproduction",
        f"{store.kind}: recorded `{tag}` altered",
        {"verdict": result.verdict, "differences": {k: list(v) for k, v in named.items()}},
        None,
        result.verdict.startswith(f"not a reproduction: {kind} identity differs")
        and list(named) == [tag]
        and not others
        and not result.reproduced,
    ), result.verdict


def test_checkpoint_restores_the_same_bits(evidence, sqlite_store, monkeypatch):
    """The run's Orbax checkpoint restores bitwise to the re-run's parameters.

    Changed condition: the restored checkpoint with one weight one float32 ulp off
    (the stored files untouched; the loader moves it after reading) is `NOT
    reproduced`, with `checkpoint_equal` False: the comparison is bitwise.
    """
    client = sqlite_store.client()
    _, exp_id = sqlite_store.new_experiment(client, "checkpoint")
    run_id, result, _ = record.run_tracked(client, exp_id, Config.tiny(), save_checkpoint=True)
    restored = checkpoint.load_from_run(client, run_id, like=result.params)
    leaves = zip(jax.tree.leaves(restored), jax.tree.leaves(result.params), strict=True)
    same_leaves = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in leaves)
    rep = reproduce.reproduce(client, run_id, track=False)

    load = checkpoint.load_from_run

    def one_ulp_off(*args, **kwargs):
        params = load(*args, **kwargs)
        flat, tree = jax.tree.flatten(params)
        first = np.array(flat[0])
        first.flat[0] = np.nextafter(first.flat[0], np.inf, dtype=first.dtype)
        return jax.tree.unflatten(tree, [jnp.asarray(first), *flat[1:]])

    monkeypatch.setattr(checkpoint, "load_from_run", one_ulp_off)
    moved = reproduce.reproduce(client, run_id, track=False)
    assert evidence.record(
        "Orbax checkpoint round trip and reproduction of the trained parameters",
        "sqlite, tiny config; then the restored checkpoint one ulp off",
        {
            "leaves_equal": same_leaves,
            "checkpoint_equal": rep.checkpoint_equal,
            "verdict": rep.verdict,
            "one_ulp_off": {"checkpoint_equal": moved.checkpoint_equal, "verdict": moved.verdict},
        },
        {"bitwise": True},
        same_leaves
        and rep.checkpoint_equal is True
        and rep.reproduced
        and moved.checkpoint_equal is False
        and moved.verdict.startswith("NOT reproduced"),
    )
    with pytest.raises(checkpoint.CheckpointError, match="There is no checkpoint"):
        checkpoint.restore(
            Path(sqlite_store.backend_uri.removeprefix("sqlite:///")).parent / "missing",
            result.params,
        )


def test_only_finished_runs_reproduce(store):
    """reproduce refuses a FAILED run with TrackingError: only a FINISHED run is complete."""
    client = store.client()
    _, exp_id = store.new_experiment(client, "unfinished")

    def boom(_run):
        raise RuntimeError("stop before training")

    with pytest.raises(RuntimeError, match="stop before training"):
        record.run_tracked(client, exp_id, Config.tiny(), before_train=boom)
    failed = client.search_runs([exp_id])[0].info.run_id
    with pytest.raises(TrackingError, match=r"ended `FAILED`; only a FINISHED run"):
        reproduce.reproduce(client, failed, track=False)
