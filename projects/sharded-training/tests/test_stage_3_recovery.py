"""Stage 3: full-state recovery in fresh processes.

One uninterrupted 2-process x 4-device run is the reference. A second job in
another directory is SIGKILLed at 10 points drawn at random (a seeded draw,
recorded) from "after step s" and "while the async save of step s is being
written", in either process; after each kill the launcher kills the other
process too (a preempted job) and a fresh pair of processes restores the
latest complete checkpoint. Twice the latest committed checkpoint is damaged
before a relaunch (an item file removed, an item's metadata truncated, as a kill
during cleanup or a bad disk would leave it); it must be rejected, with the
reason, in favour of the previous good one.

Independent check, for every relaunch: every loss after the restore point is
bitwise equal to the reference's loss at that step, the sample IDs of the
first batch after resume equal the reference's, and the final state digest
(params, Adam state, step, PRNG key) equals the reference's. Same processes,
devices, core count and versions: recorded with the result.

Also: either of two processes killed with no launcher help while the other is
idle, the survivor ends with exit code 1 and one message within the heartbeat
timeout + 15 s; a checkpoint from another config is a clear error.
"""

import inspect
import json
import random
import shutil
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sharded_training import checkpoint, launch, train, worker
from sharded_training.config import Config

CONFIG = Config.tiny()
KILL_SEED = 20261129
NUM_KILLS = 10
DAMAGES = ["remove data/process_1-of-2.json", "truncate state/_METADATA"]
PHASE_ORDER = {"step": 0, "save": 1}


def read_log(workdir: Path, attempt: int, process: int) -> list[dict]:
    path = workdir / "logs" / f"attempt_{attempt}_p{process}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kill_points() -> list[tuple[int, str, int]]:
    rng = random.Random(KILL_SEED)
    candidates = [(s, "step") for s in range(1, CONFIG.num_steps)]
    candidates += [
        (s, "save")
        for s in range(CONFIG.checkpoint_every, CONFIG.num_steps + 1, CONFIG.checkpoint_every)
    ]
    chosen = rng.sample(candidates, NUM_KILLS)
    points = [(s, phase, rng.randrange(2)) for s, phase in chosen]
    return sorted(points, key=lambda p: (p[0], PHASE_ORDER[p[1]]))


def damage(ckpt_dir: Path, how: str) -> int:
    """Damages the latest committed step as `how` says ("remove <file>" or "truncate
    <file>", the file relative to the step) and returns that step."""
    step = checkpoint.committed_steps(ckpt_dir)[0]
    verb, relative = how.split(" ", 1)
    target = ckpt_dir / str(step) / relative
    if verb == "remove":
        target.unlink()
    else:
        target.write_text('{"tree_metadata": ')
    return step


def progress(request: pytest.FixtureRequest):
    """A line on pytest's terminal, past its output capture: the sweep runs twelve jobs."""
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return lambda line: None

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"stage 3 recovery: {line}")

    return say


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, request):
    say = progress(request)
    root = tmp_path_factory.mktemp("recovery")
    cache = root / "jax-cache"  # Shared: every launch after the first loads its executables.
    say("the uninterrupted reference job (2 processes x 4 devices) ...")
    reference = launch.launch(CONFIG, root / "reference", timeout_s=600, compilation_cache=cache)
    assert reference.returncodes == [0, 0], launch.read_output(root / "reference", 0, 0)
    job = root / "killed"
    attempts = []
    damages = list(DAMAGES)
    for attempt, point in enumerate([*kill_points(), None]):
        damaged = None
        # Damage the latest committed step before the first two relaunches that have an
        # older good one to fall back to.
        if attempt and damages and len(checkpoint.committed_steps(job / "checkpoints")) >= 2:
            how = damages.pop(0)
            damaged = {"step": damage(job / "checkpoints", how), "how": how}
        kill_at = "" if point is None else ":".join(map(str, point))
        say(
            f"attempt {attempt + 1}/{NUM_KILLS + 1}: "
            + ("runs to the end" if point is None else f"kill at {kill_at} (step:phase:process)")
            + (f", step {damaged['step']} damaged first ({damaged['how']})" if damaged else "")
        )
        result = launch.launch(
            CONFIG, job, attempt=attempt, kill_at=kill_at, timeout_s=600, compilation_cache=cache
        )
        if point is None:  # The last relaunch runs to the end.
            assert result.returncodes == [0, 0], launch.read_output(job, attempt, 0)
        attempts.append(
            {
                "attempt": attempt,
                "kill_at": kill_at,
                "returncodes": result.returncodes,
                "damaged_before": damaged,
                "wall_s": round(result.wall_s, 2),
                # Orbax creates the folder lazily: a kill after step 1 may precede it.
                "checkpoint_dir_after": sorted(p.name for p in (job / "checkpoints").glob("*")),
            }
        )
    return root / "reference", job, attempts


@pytest.fixture(scope="module")
def local_checkpoints(tmp_path_factory):
    """The committed checkpoints of one in-process run (1 process x 8 devices)."""
    workdir = tmp_path_factory.mktemp("local")
    train.run(CONFIG, workdir)
    return workdir / "checkpoints"


LOCAL_DAMAGES = [
    "remove data/process_0-of-1.json",
    "truncate data/process_0-of-1.json",
    "remove state/_METADATA",
    "truncate state/_METADATA",
]


@pytest.mark.claims(
    "check-step-state-item",
    "check-step-data-item",
    "check-step-intact-ok",
    "damaged-checkpoint-never-restored",
)
@pytest.mark.parametrize("how", LOCAL_DAMAGES)
def test_a_damaged_step_is_rejected_with_its_reason(evidence, local_checkpoints, tmp_path, how):
    """check_step rejects a removed or truncated item, naming it; restore falls back one step.

    `check_step` on a real checkpoint, before and after one item is damaged;
    `find_restorable` then falls back to the previous step and moves the damaged one
    aside. The multi-process sweep below repeats this through relaunches."""
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(local_checkpoints, ckpt)
    newest, previous = checkpoint.committed_steps(ckpt)[:2]
    intact = checkpoint.check_step(ckpt, newest, CONFIG, 1, True)
    damaged_step = damage(ckpt, how)
    damaged = checkpoint.check_step(ckpt, damaged_step, CONFIG, 1, True)
    restored, checks = checkpoint.find_restorable(ckpt, CONFIG, 1, primary=True)
    item = how.split(" ", 1)[1].split("/")[0]
    observed = {
        "intact_ok": intact.ok,
        "intact_reason": intact.reason,
        "damaged_ok": damaged.ok,
        "reason": damaged.reason,
        "restored_step": restored,
        "rejected_steps": [c.step for c in checks if not c.ok],
        "moved_aside": (ckpt.parent / "rejected" / f"step_{damaged_step}").is_dir(),
    }
    assert evidence.record(
        "check_step on a real checkpoint, intact and with one item damaged",
        f"{how} in step {damaged_step}",
        observed,
        {"restored_step": previous, "reason_names_item": item},
        intact.ok
        and intact.reason == ""
        and not damaged.ok
        and f"`{item}`" in damaged.reason
        and restored == previous
        and observed["rejected_steps"] == [damaged_step]
        and observed["moved_aside"],
    ), observed


@pytest.mark.claims("check-step-orbax-metadata", "damaged-checkpoint-never-restored")
def test_a_step_without_orbax_metadata_is_rejected(evidence, local_checkpoints, tmp_path):
    """check_step rejects a step whose `_CHECKPOINT_METADATA` is gone; restore falls back.

    Orbax's step file `<step>/_CHECKPOINT_METADATA` removed from a real checkpoint,
    every item left intact: `check_step` is not ok, with one problem whose phrase
    names `_CHECKPOINT_METADATA`, and `find_restorable` moves the step aside and
    restores the previous one."""
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(local_checkpoints, ckpt)
    newest, previous = checkpoint.committed_steps(ckpt)[:2]
    damaged_step = damage(ckpt, "remove _CHECKPOINT_METADATA")
    damaged = checkpoint.check_step(ckpt, damaged_step, CONFIG, 1, True)
    restored, checks = checkpoint.find_restorable(ckpt, CONFIG, 1, primary=True)
    observed = {
        "damaged_step": damaged_step,
        "damaged_ok": damaged.ok,
        "reason": damaged.reason,
        "restored_step": restored,
        "checks": [(c.step, c.ok) for c in checks],
        "moved_aside": (ckpt.parent / "rejected" / f"step_{damaged_step}").is_dir(),
    }
    assert evidence.record(
        "check_step on a real checkpoint without Orbax's step file",
        f"remove _CHECKPOINT_METADATA in step {damaged_step}",
        observed,
        {"restored_step": previous, "reason_names": "_CHECKPOINT_METADATA", "problems": 1},
        damaged_step == newest
        and not damaged.ok
        and "`_CHECKPOINT_METADATA`" in damaged.reason
        and "; " not in damaged.reason
        and restored == previous
        and observed["checks"] == [(newest, False), (previous, True)]
        and observed["moved_aside"],
    ), observed


@pytest.mark.claims("check-step-data-unchecked-without-data", "check-step-data-item")
@pytest.mark.parametrize("how", LOCAL_DAMAGES[:2])
def test_without_data_the_data_item_is_not_checked(evidence, local_checkpoints, tmp_path, how):
    """With `data` False a step whose Grain state is damaged passes; with `data` True it fails.

    `data/process_0-of-1.json` removed or truncated in the newest step of a real
    checkpoint: `check_step(..., data=False)` is ok with reason "" (a run without
    an iterator restores no Grain state), `data=True` rejects the same step naming
    `data`. `find_restorable(..., data=False)` restores that step and moves nothing."""
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(local_checkpoints, ckpt)
    newest = checkpoint.committed_steps(ckpt)[0]
    damaged_step = damage(ckpt, how)
    without = checkpoint.check_step(ckpt, damaged_step, CONFIG, 1, False)
    with_data = checkpoint.check_step(ckpt, damaged_step, CONFIG, 1, True)
    restored, checks = checkpoint.find_restorable(ckpt, CONFIG, 1, primary=True, data=False)
    observed = {
        "without_data": {"ok": without.ok, "reason": without.reason},
        "with_data": {"ok": with_data.ok, "reason": with_data.reason},
        "restored_step_without_data": restored,
        "checks_without_data": [(c.step, c.ok) for c in checks],
        "rejected_dir": (ckpt.parent / "rejected").exists(),
    }
    assert evidence.record(
        "check_step with and without `data` on a step whose Grain state is damaged",
        f"{how} in step {damaged_step}",
        observed,
        {"without_data_ok": True, "with_data_ok": False, "restored_step": newest},
        damaged_step == newest
        and without == checkpoint.StepCheck(newest, True, "")
        and not with_data.ok
        and "`data`" in with_data.reason
        and restored == newest
        and observed["checks_without_data"] == [(newest, True)]
        and not observed["rejected_dir"],
    ), observed


@pytest.mark.claims("damaged-checkpoint-never-restored")
def test_two_damaged_steps_fall_back_to_the_third(local_checkpoints, tmp_path):
    """Two newer steps damaged: the third is restored; only the primary moves them aside.

    Both newer steps damaged (an item missing, an item unreadable): both are moved
    aside under `rejected/`, and the oldest step is the one to restore."""
    ckpt = tmp_path / "checkpoints"
    shutil.copytree(local_checkpoints, ckpt)
    steps = checkpoint.committed_steps(ckpt)
    assert len(steps) == 3 and steps == sorted(steps, reverse=True)
    damage(ckpt, "remove data/process_0-of-1.json")
    shutil.move(str(ckpt / str(steps[0])), str(tmp_path / "aside"))
    damage(ckpt, "truncate state/_METADATA")
    shutil.move(str(tmp_path / "aside"), str(ckpt / str(steps[0])))
    # A process that is not the primary checks the same steps but moves nothing.
    assert checkpoint.find_restorable(ckpt, CONFIG, 1, primary=False)[0] == steps[2]
    assert checkpoint.committed_steps(ckpt) == steps
    assert not (tmp_path / "rejected").exists()
    restored, checks = checkpoint.find_restorable(ckpt, CONFIG, 1, primary=True)
    assert restored == steps[2]
    assert [(c.step, c.ok) for c in checks] == [
        (steps[0], False),
        (steps[1], False),
        (steps[2], True),
    ]
    assert sorted(p.name for p in (tmp_path / "rejected").iterdir()) == sorted(
        f"step_{s}" for s in steps[:2]
    )
    assert checkpoint.committed_steps(ckpt) == [steps[2]]
    assert checkpoint.committed_steps(tmp_path / "no such folder") == []


def test_find_restorable_takes_primary_by_name_only(local_checkpoints):
    """find_restorable refuses `primary` passed by position with a TypeError."""
    with pytest.raises(TypeError):
        checkpoint.find_restorable(local_checkpoints, CONFIG, 1, True)


def _digest_order(sign: int) -> Config:
    """A config whose digest sorts after (`sign` 1) or before (-1) CONFIG's; only its
    seed differs."""
    ours = CONFIG.digest()
    for seed in range(1, 100):
        other = CONFIG.model_copy(update={"seed": seed})
        if (other.digest() > ours) == (sign > 0):
            return other
    raise AssertionError("no such seed")


@pytest.mark.claims("check-step-other-config-raises", "check-step-intact-ok")
@pytest.mark.parametrize("sign", [1, -1], ids=["digest-after", "digest-before"])
def test_a_step_of_another_config_names_both_digests_and_the_field(local_checkpoints, sign):
    """A step of another config or process count raises naming both values and the field."""
    other = _digest_order(sign)
    step = checkpoint.committed_steps(local_checkpoints)[0]
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.check_step(local_checkpoints, step, other, 1, True)
    message = str(err.value)
    assert (
        f"(config sha256 `{CONFIG.digest()[:12]}`, this run `{other.digest()[:12]}`: "
        f"`seed` {CONFIG.seed!r} there vs {other.seed!r} here); use a new workdir" in message
    ), message
    # The same config passes; another process count is refused with both counts.
    assert checkpoint.check_step(local_checkpoints, step, CONFIG, 1, True) == checkpoint.StepCheck(
        step, True, ""
    )
    with pytest.raises(checkpoint.CheckpointError, match=r"by `1` processes, .* has `2`"):
        checkpoint.check_step(local_checkpoints, step, CONFIG, 2, True)


# One other valid value per field of `Config`, every other field as in CONFIG. The
# digest is "sha256 of the canonical JSON form" (`Config.digest`): every field.
CONFIG_CHANGES = {
    "seed": 1,
    "data_seed": 2,
    "num_examples": 45,
    "num_features": 17,
    "hidden_size": 64,
    "num_classes": 5,
    "dropout_rate": 0.2,
    "learning_rate": 0.02,
    "batch_size": 24,
    "num_steps": 13,
    "mesh_shape": (4, 2),
    "checkpoint_every": 4,
    "max_to_keep": 4,
    "heartbeat_timeout_s": 11,
}


def test_the_config_changes_name_every_field():
    """CONFIG_CHANGES has one case for every field of Config, and each is another value."""
    assert sorted(CONFIG_CHANGES) == sorted(Config.model_fields)
    assert all(getattr(CONFIG, k) != v for k, v in CONFIG_CHANGES.items())


@pytest.mark.parametrize("field", ["nothing", *CONFIG_CHANGES])
def test_the_config_digest_changes_when_any_one_field_changes(evidence, field):
    """Config.digest differs when any one field alone differs; equal for an equal config.

    The other config is validated from CONFIG's fields with the one field replaced
    (`nothing`: none replaced, and also read back from CONFIG's JSON). A checkpoint
    records the digest, so a field the digest left out would let a run of another
    config resume it. Expected by hand: equal digests exactly when nothing differs."""
    fields = CONFIG.model_dump()
    if field != "nothing":
        fields[field] = CONFIG_CHANGES[field]
    other = Config.model_validate(fields)
    digests_equal = other.digest() == CONFIG.digest()
    expected_equal = field == "nothing"
    if expected_equal:
        digests_equal &= Config.from_json(CONFIG.to_json()).digest() == CONFIG.digest()
    observed = {
        "field": field,
        "ours": getattr(CONFIG, field, None),
        "theirs": getattr(other, field, None),
        "differing_fields": sorted(k for k in fields if getattr(other, k) != getattr(CONFIG, k)),
        "digests_equal": digests_equal,
    }
    assert evidence.record(
        "config digest of two configs differing in at most one field",
        f"differs: {field}",
        observed,
        {"digests_equal": expected_equal},
        digests_equal == expected_equal
        and observed["differing_fields"] == ([] if expected_equal else [field]),
    ), observed


@pytest.mark.claims("check-step-other-config-raises")
def test_a_run_with_another_data_seed_is_refused_the_checkpoint(
    evidence, local_checkpoints, tmp_path
):
    """train.run with only `data_seed` changed refuses the checkpoint; the same config resumes.

    `data_seed` decides the data set and Grain's shuffle, so a checkpoint of one
    data seed is not a point of a run with another: `train.run` (what `train` and
    every worker call) raises CheckpointError naming `data_seed` with both values
    and moves no step aside; the unchanged config then resumes the newest step."""
    workdir = tmp_path / "job"
    shutil.copytree(local_checkpoints, workdir / "checkpoints")
    steps = checkpoint.committed_steps(workdir / "checkpoints")
    other = CONFIG.model_copy(update={"data_seed": CONFIG.data_seed + 1})
    with pytest.raises(checkpoint.CheckpointError) as err:
        train.run(other, workdir)
    message = str(err.value)
    kept = checkpoint.committed_steps(workdir / "checkpoints")
    resumed = train.run(CONFIG, workdir)
    observed = {
        "message": message,
        "steps_before": steps,
        "steps_after_refusal": kept,
        "rejected_dir": (workdir / "rejected").exists(),
        "same_config_restored_step": resumed["restored_step"],
        "same_config_losses": resumed["losses"],
    }
    assert evidence.record(
        "a relaunch differing only in data_seed is refused; the same config resumes",
        f"data_seed {CONFIG.data_seed} in the checkpoint vs {other.data_seed} in the run",
        observed,
        None,
        "written by another config" in message
        and f"`data_seed` {CONFIG.data_seed} there vs {other.data_seed} here" in message
        and CONFIG.digest()[:12] in message
        and other.digest()[:12] in message
        and kept == steps
        and not observed["rejected_dir"]
        and resumed["restored_step"] == CONFIG.num_steps == steps[0]
        and resumed["losses"] == {},
    ), observed


@pytest.mark.claims("checkpoint-async-full-state")
def test_saves_are_written_in_the_background(evidence, tmp_path):
    """checkpoint.manager's save returns before Orbax finalizes the step on another thread.

    `checkpoint.manager` saves asynchronously: `save` returns while the step is
    still being written, and Orbax finalizes it on a thread of its own. Orbax's
    `_finalize` (orbax-checkpoint pinned) is held until `save` has returned, so what
    is observed is an order, not a race; a synchronous save finalizes on the caller's
    thread, before `save` returns."""
    mgr = checkpoint.manager(tmp_path / "ckpt", CONFIG)
    caller, returned, seen = threading.current_thread(), threading.Event(), {}
    finalize = mgr._finalize

    def held_finalize(step, steps_to_remove):
        seen["finalized_off_the_caller_thread"] = threading.current_thread() is not caller
        if seen["finalized_off_the_caller_thread"]:
            returned.wait()
        return finalize(step, steps_to_remove)

    mgr._finalize = held_finalize
    state = {"w": np.arange(4096, dtype=np.float32)}
    try:
        mgr.save(
            1,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"step": 1})
            ),
        )
        seen["in_progress_when_save_returned"] = mgr.is_saving_in_progress()
    finally:  # Never leave Orbax's finalize thread waiting, whatever happened above.
        returned.set()
    mgr.wait_until_finished()
    seen["committed_after_wait"] = checkpoint.committed_steps(tmp_path / "ckpt")
    mgr.close()
    expected = {
        "finalized_off_the_caller_thread": True,
        "in_progress_when_save_returned": True,
        "committed_after_wait": [1],
    }
    assert evidence.record(
        "checkpoint.manager's save returns before the step is finalized",
        "one save of a 16 KiB state, Orbax's finalize held until save returns",
        seen,
        expected,
        seen == expected,
    ), seen


@pytest.mark.claims("survivor-exits")
def test_the_configured_heartbeat_reaches_jax_distributed(evidence):
    """The worker passes the configured heartbeat timeout to jax.distributed.initialize.

    The worker's options for `jax.distributed.initialize` carry the configured
    heartbeat timeout, under a name the installed JAX's `initialize` takes."""
    config = CONFIG.model_copy(update={"heartbeat_timeout_s": 7})
    argv = ["--config", "c.json", "--workdir", "w", "--process-id", "1", "--num-processes", "2"]
    args = worker.build_parser().parse_args([*argv, "--coordinator", "127.0.0.1:9"])
    options = worker.distributed_options(args, config)
    inspect.signature(jax.distributed.initialize).bind(**options)
    assert evidence.record(
        "jax.distributed.initialize options vs the config",
        "heartbeat_timeout_s = 7, process 1 of 2",
        options,
        {"heartbeat_timeout_seconds": 7, "process_id": 1, "num_processes": 2},
        options.get("heartbeat_timeout_seconds") == 7
        and options["process_id"] == 1
        and options["num_processes"] == 2,
    ), options


def _small_state(step: int, seed: int, scale: float) -> train.TrainState:
    """A hand-built state: two small params, their fresh Adam state, a step and a key."""
    params = {
        "w1": scale * jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
        "b1": jnp.full((3,), scale, jnp.float32),
    }
    opt_state = train.make_optimizer(CONFIG).init(params)
    return train.TrainState(params, opt_state, jnp.asarray(step, jnp.int32), jax.random.key(seed))


# (one state, the other): equal but for at most one field.
DIGEST_PAIRS = {
    "nothing": ({"step": 5, "seed": 0, "scale": 1.0}, {"step": 5, "seed": 0, "scale": 1.0}),
    "step 0 vs 1": ({"step": 0, "seed": 0, "scale": 1.0}, {"step": 1, "seed": 0, "scale": 1.0}),
    "step 7 vs 8": ({"step": 7, "seed": 0, "scale": 1.0}, {"step": 8, "seed": 0, "scale": 1.0}),
    "dropout key": ({"step": 5, "seed": 0, "scale": 1.0}, {"step": 5, "seed": 1, "scale": 1.0}),
    "params": ({"step": 5, "seed": 0, "scale": 1.0}, {"step": 5, "seed": 0, "scale": 2.0}),
}


@pytest.mark.claims("kill-resume-bitwise-equal")
@pytest.mark.parametrize("field", list(DIGEST_PAIRS))
def test_the_state_digest_changes_when_any_one_field_changes(evidence, field):
    """train.digest differs when the step, the PRNG key or the params alone differ, else equal.

    Two states built independently, equal except for the one field named (the step
    across 0 -> 1 and between two non-zero counts, the dropout key, the params): a
    resumed run with another step counter or dropout key must not pass for the
    uninterrupted one. Expected by hand: equal digests exactly when nothing differs."""
    one, other = DIGEST_PAIRS[field]
    ours, theirs = train.digest(_small_state(**one)), train.digest(_small_state(**other))
    expected_equal = field == "nothing"
    observed = {"one": one, "other": other, "digests_equal": ours == theirs}
    assert evidence.record(
        "state digest of two states differing in at most one field",
        f"differs: {field}",
        observed,
        {"digests_equal": expected_equal},
        (ours == theirs) == expected_equal,
    ), observed


def _adam_state_after_one_update() -> train.TrainState:
    """`_small_state` after one Adam update of its moments (grads = the params + 1, all
    positive), so that both moments are non-zero; params, step and key stay as built."""
    state = _small_state(step=5, seed=0, scale=1.0)
    grads = jax.tree.map(lambda p: p + 1.0, state.params)
    _, opt_state = train.make_optimizer(CONFIG).update(grads, state.opt_state, state.params)
    return state._replace(opt_state=opt_state)


def _nudge_opt_leaf(state: train.TrainState, field: str) -> train.TrainState:
    """The state with ONE element of ONE optimizer-state leaf changed: the first element of
    Adam's `mu` or `nu` for `w1` moved to the next float32 up, or the Adam `count` + 1;
    `nothing` rewrites that element with its own value. Every other leaf is the same."""

    def nudge(path, leaf):
        where = jax.tree_util.keystr(path)
        if field == "count" and where.endswith(".count"):
            return leaf + 1
        if field in ("mu", "nu", "nothing") and where.endswith((".mu['w1']", ".nu['w1']")):
            if field == "nothing" or f".{field}[" in where:
                value = np.array(leaf)
                if field != "nothing":
                    value.flat[0] = np.nextafter(value.flat[0], np.float32(np.inf))
                return jnp.asarray(value)
        return leaf

    return state._replace(opt_state=jax.tree_util.tree_map_with_path(nudge, state.opt_state))


@pytest.mark.claims("kill-resume-bitwise-equal")
@pytest.mark.parametrize("field", ["nothing", "mu", "nu", "count"])
def test_the_state_digest_changes_when_the_adam_state_alone_changes(evidence, field):
    """train.digest differs when one Adam moment element or the Adam count alone differs.

    The documented rule (train.digest): "equal digests mean bitwise-equal params,
    optimizer state, step and PRNG key". Two states built independently after one
    Adam update (both moments non-zero), equal in params, step and key; the other
    differs only in the optimizer state: one element of `mu` (or of `nu`) moved by
    one float32 ulp (`np.nextafter`), or the Adam step count + 1. A resume that
    restored wrong Adam moments must not pass for the uninterrupted run. Expected by
    hand: equal digests exactly when nothing differs (`nothing` rewrites the same
    element with its own value)."""
    ours = _adam_state_after_one_update()
    theirs = _nudge_opt_leaf(_adam_state_after_one_update(), field)
    ours_leaves = jax.tree_util.tree_leaves(ours.opt_state)
    theirs_leaves = jax.tree_util.tree_leaves(theirs.opt_state)
    differing = sum(
        int(np.sum(np.asarray(a) != np.asarray(b)))
        for a, b in zip(ours_leaves, theirs_leaves, strict=True)
    )
    expected_equal = field == "nothing"
    observed = {
        "differs": field,
        "differing_optimizer_elements": differing,
        "moments_nonzero": all(
            bool(np.all(np.asarray(leaf) != 0))
            for leaf in ours_leaves
            if np.asarray(leaf).dtype == np.float32
        ),
        "digests_equal": train.digest(ours) == train.digest(theirs),
    }
    assert evidence.record(
        "state digest of two states differing at most in one optimizer-state element",
        f"differs: {field}",
        observed,
        {"digests_equal": expected_equal, "differing_optimizer_elements": 1 - expected_equal},
        observed["digests_equal"] == expected_equal
        and differing == (0 if expected_equal else 1)
        and observed["moments_nonzero"],
    ), observed


@pytest.mark.claims("kill-resume-bitwise-equal", "checkpoint-async-full-state")
def test_every_resumed_loss_and_the_final_state_are_bitwise_equal(evidence, sweep):
    """After 10 random SIGKILLs and resumes, every loss and the final state match bitwise."""
    ref_dir, job, attempts = sweep
    ref = {p: {r["step"]: r for r in read_log(ref_dir, 0, p) if "step" in r} for p in range(2)}
    ref_final = json.loads((ref_dir / "final_p0.json").read_text())
    final = json.loads((job / "final_p0.json").read_text())
    rows = []
    for a in attempts:
        logs = [read_log(job, a["attempt"], p) for p in range(2)]
        start = next(r for r in logs[0] if r.get("event") == "start")
        steps = [r for r in logs[0] if "step" in r]
        mismatched = [
            r["step"]
            for p in range(2)
            for r in logs[p]
            if "step" in r and r["loss_bits"] != ref[p][r["step"]]["loss_bits"]
        ]
        first = start["restored_step"] + 1
        first_ids_equal = (
            all(
                next((r["ids"] for r in logs[p] if r.get("step") == first), None)
                == ref[p][first]["ids"]
                for p in range(2)
            )
            if steps
            else None
        )
        rows.append(
            {
                **a,
                "restored_step": start["restored_step"],
                "rejected": start["rejected"],
                "steps_run": len(steps),
                "losses_compared": 2 * len(steps),
                "loss_bit_mismatches": mismatched,
                "first_batch_ids_equal": first_ids_equal,
            }
        )
    killed = [r for r in rows if r["kill_at"]]
    passed = (
        len(killed) == NUM_KILLS
        and all(-9 in r["returncodes"] for r in killed)
        and rows[-1]["returncodes"] == [0, 0]
        and all(not r["loss_bit_mismatches"] for r in rows)
        and all(r["first_batch_ids_equal"] is not False for r in rows)
        and all(r["first_batch_ids_equal"] for r in rows[1:] if r["steps_run"])
        and final["digest"] == ref_final["digest"]
    )
    assert evidence.record(
        "resumed run vs uninterrupted run: every loss after each restore point (float32 bits), "
        "first-batch sample IDs, final state digest",
        f"{NUM_KILLS} SIGKILL points drawn with seed {KILL_SEED}; environment "
        f"{json.dumps(final['environment'])}",
        {
            "attempts": rows,
            "final_digest": final["digest"],
            "reference_digest": ref_final["digest"],
            "reference_environment": ref_final["environment"],
        },
        {"loss_bits": "equal", "digest": "equal"},
        passed,
    )
    assert final["environment"] == ref_final["environment"]


@pytest.mark.claims("kill-resume-bitwise-equal")
def test_kills_during_checkpoint_writes_leave_no_committed_step(evidence, sweep):
    """A kill while Orbax writes step s leaves s a temporary folder, never a committed step.

    A kill right after the save of step s was started, while Orbax still writes
    in the background, must leave step s unfinished: Orbax's temporary directory
    for s, and no committed `s`. A synchronous save (finished before `save`
    returns) would leave `s` committed, and fails this test."""
    _, _, attempts = sweep
    during_save = [a for a in attempts if a["kill_at"].split(":")[1:2] == ["save"]]
    observed = []
    for a in during_save:
        step = a["kill_at"].split(":")[0]
        after = a["checkpoint_dir_after"]
        observed.append(
            {
                "kill_at": a["kill_at"],
                "checkpoint_dir_after": after,
                "step_committed": step in after,
                "step_left_unfinished": any(
                    name.startswith(f"{step}.") and "tmp" in name for name in after
                ),
            }
        )
    assert evidence.record(
        "kills while Orbax writes: the step is left unfinished, never committed",
        "kill points with phase `save`",
        {"kills": observed},
        {"step_committed": False, "step_left_unfinished": True},
        len(during_save) >= 1
        and all(o["step_left_unfinished"] and not o["step_committed"] for o in observed),
    ), observed


@pytest.mark.claims(
    "damaged-checkpoint-never-restored", "check-step-state-item", "check-step-data-item"
)
def test_damaged_checkpoints_are_rejected_and_fall_back(evidence, sweep):
    """A damaged latest checkpoint is rejected at relaunch, saying so; an older one restores."""
    _, _, attempts = sweep
    rows = []
    for a in [a for a in attempts if a["damaged_before"]]:
        attempt, how = a["attempt"], a["damaged_before"]["how"]
        damaged = a["damaged_before"]["step"]
        log = read_log(sweep[1], attempt, 0)
        start = next(r for r in log if r.get("event") == "start")
        out = launch.read_output(sweep[1], attempt, 0)
        rows.append(
            {
                "attempt": attempt,
                "damage": how,
                "damaged_step": damaged,
                "rejected": start["rejected"],
                "restored_step": start["restored_step"],
                "said": [line for line in out.splitlines() if "checkpoint" in line],
            }
        )
    passed = len(rows) == len(DAMAGES) and all(
        r["rejected"]
        and r["rejected"][0]["step"] == r["damaged_step"]
        and r["restored_step"] < r["damaged_step"]
        and any("rejected" in line for line in r["said"])
        and any("fell back" in line for line in r["said"])
        for r in rows
    )
    assert evidence.record(
        "a damaged latest checkpoint is never restored",
        "item file removed; item metadata truncated",
        {"cases": rows},
        None,
        passed,
    )


@pytest.mark.claims("check-step-other-config-raises")
def test_checkpoint_from_another_config_is_a_clear_error(sweep):
    """Resuming with another learning rate raises CheckpointError naming the field."""
    ref_dir, _, _ = sweep
    other = CONFIG.model_copy(update={"learning_rate": 0.5})
    copy = ref_dir.parent / "other-config"
    shutil.copytree(ref_dir / "checkpoints", copy / "checkpoints")
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"written by another config .*`learning_rate` 0\.01 there vs 0\.5 here",
    ):
        train.run(other, copy)


@pytest.mark.claims("survivor-exits")
def test_the_survivor_of_a_killed_peer_stops_with_a_message(evidence, tmp_path):
    """The survivor of a SIGKILLed peer exits 1 with one message within heartbeat + 15 s.

    Each of the two processes SIGKILLed while the other sits idle outside any
    collective (`idle` kill point, `train.IDLE_S` = 120 s): only the heartbeat, or
    the coordinator's loss, can tell the survivor. It must end with exit code 1
    and one clear message (no native stack trace) within heartbeat_timeout_s + 15 s.
    The bound is far below the idle time, and JAX's own default heartbeat timeout
    is 100 s: the test fails unless the configured 3 s reaches
    `jax.distributed.initialize`."""
    config = CONFIG.model_copy(update={"heartbeat_timeout_s": 3})
    limit = config.heartbeat_timeout_s + 15
    assert limit < train.IDLE_S and limit < 100
    cases = {
        "process 1 (peer) killed": (
            "1:idle:1",
            0,
            "saw no heartbeat from it within heartbeat_timeout_s = 3 s",
        ),
        "process 0 (coordinator) killed": ("1:idle:0", 1, "coordination service reported"),
    }
    results = {}

    def run(name: str, kill_at: str) -> None:
        results[name] = launch.launch(
            config,
            tmp_path / name.split()[1],
            kill_at=kill_at,
            kill_survivors=False,
            timeout_s=900,  # A hang guard only; the bound below is what is tested.
            compilation_cache=tmp_path / "jax-cache",
        )

    # Both jobs at once: the survivors' deadlines are measured from each job's own death.
    threads = [threading.Thread(target=run, args=(n, k)) for n, (k, _, _) in cases.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    observed, passed = {}, True
    for name, (_, survivor, words) in cases.items():
        result = results[name]
        out = launch.read_output(tmp_path / name.split()[1], 0, survivor)
        last = [line for line in out.splitlines() if line.strip()][-1:]
        victim = 1 - survivor
        seconds = result.exit_s[survivor] - result.first_death_s
        observed[name] = {
            "returncodes": result.returncodes,
            "survivor_exit_after_death_s": round(seconds, 2),
            "survivor_last_line": last,
            "native_trace_shown": "Check failure" in out or "terminate called" in out,
        }
        passed &= (
            result.returncodes[victim] == -9
            and result.returncodes[survivor] == 1
            and seconds <= limit
            and bool(last)
            and last[0].startswith(f"process {survivor}: stopped: ")
            and words in last[0]
            and not observed[name]["native_trace_shown"]
        )
    assert evidence.record(
        "the survivor of a SIGKILLed peer ends with one message and exit code 1",
        f"heartbeat_timeout_s={config.heartbeat_timeout_s}, either process killed after step 1, "
        f"the other idle for {train.IDLE_S:g} s",
        observed,
        {"seconds_at_most": limit, "survivor_exit_code": 1},
        passed,
    ), observed
