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

Also: one of two processes killed with no launcher help, the survivor exits
within the heartbeat timeout + 15 s; a checkpoint from another config is a
clear error.
"""

import json
import random
import shutil
from pathlib import Path

import pytest

from sharded_training import checkpoint, launch, train
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
    step = checkpoint.committed_steps(ckpt_dir)[0]
    if how.startswith("remove"):
        (ckpt_dir / str(step) / "data" / "process_1-of-2.json").unlink()
    else:
        (ckpt_dir / str(step) / "state" / "_METADATA").write_text('{"tree_metadata": ')
    return step


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("recovery")
    cache = root / "jax-cache"  # Shared: every launch after the first loads its executables.
    reference = launch.launch(CONFIG, root / "reference", timeout_s=180, compilation_cache=cache)
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
        result = launch.launch(
            CONFIG, job, attempt=attempt, kill_at=kill_at, timeout_s=180, compilation_cache=cache
        )
        attempts.append(
            {
                "attempt": attempt,
                "kill_at": kill_at,
                "returncodes": result.returncodes,
                "damaged_before": damaged,
                "wall_s": round(result.wall_s, 2),
                "checkpoint_dir_after": sorted(p.name for p in (job / "checkpoints").iterdir()),
            }
        )
    return root / "reference", job, attempts


def test_every_resumed_loss_and_the_final_state_are_bitwise_equal(evidence, sweep):
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


def test_kills_during_checkpoint_writes_leave_no_committed_step(evidence, sweep):
    _, _, attempts = sweep
    during_save = [a for a in attempts if a["kill_at"].split(":")[1:2] == ["save"]]
    observed = [
        {"kill_at": a["kill_at"], "checkpoint_dir_after": a["checkpoint_dir_after"]}
        for a in during_save
    ]
    # A kill right after the async save of step s started leaves step s unfinished
    # (a temporary directory) or, if Orbax finished in time, complete; never a bare `s`
    # that fails the checks (that would be rejected at the next start, see the next test).
    assert evidence.record(
        "kills while Orbax writes: what is left on disk",
        "kill points with phase `save`",
        {"kills": observed},
        None,
        len(during_save) >= 1,
    )


def test_damaged_checkpoints_are_rejected_and_fall_back(evidence, sweep):
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


def test_checkpoint_from_another_config_is_a_clear_error(sweep):
    ref_dir, _, _ = sweep
    other = CONFIG.model_copy(update={"learning_rate": 0.5})
    copy = ref_dir.parent / "other-config"
    shutil.copytree(ref_dir / "checkpoints", copy / "checkpoints")
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"written by another config .*`learning_rate` 0\.01 there vs 0\.5 here",
    ):
        train.run(other, copy)


def test_survivor_exits_within_heartbeat_timeout(evidence, tmp_path):
    config = CONFIG.model_copy(update={"heartbeat_timeout_s": 3})
    result = launch.launch(
        config, tmp_path / "job", kill_at="3:step:1", kill_survivors=False, timeout_s=120
    )
    survivor_s = result.exit_s[0] - result.first_death_s
    limit = config.heartbeat_timeout_s + 15
    tail = launch.read_output(tmp_path / "job", 0, 0).strip().splitlines()[-2:]
    assert evidence.record(
        "survivor of a SIGKILLed peer exits instead of hanging",
        f"heartbeat_timeout_s={config.heartbeat_timeout_s}, process 1 killed after step 3",
        {
            "returncodes": result.returncodes,
            "survivor_exit_after_death_s": survivor_s,
            "survivor_last_lines": tail,
        },
        {"seconds_at_most": limit},
        result.returncodes[1] == -9 and result.returncodes[0] != 0 and survivor_s <= limit,
    )
