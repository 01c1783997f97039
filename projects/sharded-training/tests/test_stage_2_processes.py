"""Stage 2: the same training as several real processes (`jax.distributed`, gloo).

Independent checks: the 2-process x 4-device run against the single-process
8-device run in this test process (losses and final params); the sample IDs
each process fed, checked as a property of the data (disjoint per step, each
global batch covered exactly once, every example exactly once per epoch,
process p holding rows [p*B/2, (p+1)*B/2) of each global batch); the gradient
all-reduce in the compiled HLO against the parameter shard sizes computed from
the config. Repeated on a (8, 1) and a (4, 2) mesh.

Tolerance for parity: the cross-process all-reduce (gloo) may add the shard
sums in another order than the in-process one, so the last float32 bits may
differ and compound over 12 Adam steps; we allow rtol 1e-4 and atol 1e-5 on
losses and params, and record whether they came out bitwise equal.
"""

import json
import socket
import subprocess
import sys
from collections import Counter

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_training import data, launch, sharding, train
from sharded_training.cli import main
from sharded_training.config import Config

MESHES = [(8, 1), (4, 2)]
FAST = settings(max_examples=80, derandomize=True, deadline=None, database=None)


def expected_shard_elements(config: Config, mesh_shape) -> list[int]:
    """Per-device elements of each parameter, from the layout the README states:
    `w1` split by columns, `b1` and `w2` by the hidden axis, `b2` whole."""
    f, h, c = config.num_features, config.hidden_size, config.num_classes
    m = mesh_shape[1]
    return sorted([f * (h // m), h // m, (h // m) * c, c])


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_parameter_shard_sizes_from_the_layout(mesh_shape):
    """param_shard_elements equals per-device sizes from the stated layout, on 2 meshes."""
    config = Config.tiny().model_copy(update={"mesh_shape": mesh_shape})
    mesh = sharding.make_mesh(mesh_shape)
    assert sharding.param_shard_elements(config, mesh) == expected_shard_elements(
        config, mesh_shape
    )


def row_block_reference(batch_size: int, index: int, count: int) -> list[int] | None:
    """Plain Python: the rows process `index` of `count` owns, or None when refused."""
    if count < 1 or not 0 <= index < count or batch_size < 1 or batch_size % count:
        return None
    per = batch_size // count
    return list(range(index * per, (index + 1) * per))


@pytest.mark.claims("process-rows-refusals", "process-rows-contiguous-blocks")
@FAST
@given(
    count=st.integers(-1, 8),
    batch_size=st.integers(-2, 40),
    index=st.integers(-2, 9),
)
def test_process_rows_against_a_reference(count, batch_size, index):
    """process_rows gives the rows a plain-Python block reference gives, and refuses as it does.

    Over process counts 1-8 (and 0, -1), batch sizes on and off the multiples
    (0 and negative included), indices inside and just outside [0, count)."""
    expected = row_block_reference(batch_size, index, count)
    if expected is None:
        with pytest.raises(ValueError):
            data.process_rows(batch_size, index, count)
        return
    rows = list(range(batch_size))[data.process_rows(batch_size, index, count)]
    assert rows == expected


@pytest.mark.claims("process-rows-refusals")
@pytest.mark.parametrize(
    ("batch_size", "index", "count", "message"),
    [
        (16, 0, 0, r"`process_count` must be at least 1, not `0`"),
        (16, 2, 2, r"`process_index` must be from 0 to 1, not `2`"),
        (16, -1, 4, r"`process_index` must be from 0 to 3, not `-1`"),
        (16, 8, 8, r"`process_index` must be from 0 to 7, not `8`"),
        (0, 0, 2, r"`batch_size` = `0` does not divide into 2"),
        (15, 0, 2, r"`batch_size` = `15` does not divide into 2"),
    ],
)
def test_process_rows_refusals_name_the_value(batch_size, index, count, message):
    """A bad process count, index or batch size raises ValueError naming the value."""
    with pytest.raises(ValueError, match=message):
        data.process_rows(batch_size, index, count)


@pytest.mark.claims("processes-feed-own-rows")
@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_local_shard_keeps_its_rows_and_masks_the_padding(process_count):
    """LocalShard.map gives each process its block of padded IDs; padding is masked, example 0.

    `LocalShard.map` on a short global batch (the end of an epoch): each process
    gets its block of the padded IDs; valid rows look up their own example, padding
    rows hold ID -1, mask 0 and example 0's features and label (a real example, so
    every value stays finite)."""
    config = Config.tiny()
    b = config.batch_size
    features = np.arange(44 * 3, dtype=np.float32).reshape(44, 3) + 1.0
    labels = (np.arange(44, dtype=np.int32) * 7) % 5
    ids = np.array([40, 3, 17, 0, 25, 9, 33, 12, 41, 5, 21], np.int64)  # 11 of 16 rows
    padded = list(ids) + [-1] * (b - len(ids))
    per = b // process_count
    for p in range(process_count):
        shard = data.LocalShard(config, p, process_count, data=(features, labels))
        got = shard.map(ids)
        mine = padded[p * per : (p + 1) * per]
        lookup = [i if i >= 0 else 0 for i in mine]
        assert got["ids"].tolist() == mine and got["ids"].dtype == np.int32
        assert got["mask"].tolist() == [1.0 if i >= 0 else 0.0 for i in mine]
        assert got["mask"].dtype == np.float32
        assert np.array_equal(got["x"], features[lookup])
        assert got["y"].tolist() == labels[lookup].tolist()


HLO = "\n".join(
    [
        "  %p = f32[16,32]{1,0} parameter(0)",
        "  %all-reduce.3 = (f32[16,32]{1,0}, f32[32]{0}, bf16[32,4]{1,0}, f32[]) all-reduce("
        "%a, %b, %c, %d), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, "
        "use_global_device_ids=true, to_apply=%add",
        "  %ar-start = s32[8]{0} all-reduce-start(%e), channel_id=2, "
        "replica_groups={{0,1},{2,3}}, to_apply=%add",
        "  %ag = pred[2,3]{1,0} all-gather(%f), channel_id=3, replica_groups={{0,1}}, "
        "dimensions={0}",
        "  %dot = f32[16,4]{1,0} dot(%p, %q)",
    ]
)


@pytest.mark.claims("data-seed-alone-orders-the-data")
def test_the_feeding_order_follows_the_data_seed_alone():
    """Every process cuts its rows from one global order of sample IDs, which
    `data_seed` decides: another `seed` (init and dropout) feeds the same IDs in
    the same order, another `data_seed` another order. Checked over the first two
    epochs of a small config, each epoch a permutation of every ID."""
    config = Config(num_examples=40, batch_size=8, num_steps=10)
    per_epoch = 5

    def order(c: Config) -> list[int]:
        return [i for s in range(c.num_steps) for i in data.global_ids_for_step(c, s)]

    base = order(config)
    for e in range(2):
        assert sorted(base[e * 40 : (e + 1) * 40]) == list(range(40)), f"epoch {e}"
    assert len(base) == 2 * per_epoch * 8
    for seed in (config.seed + 1, config.seed + 7):
        assert order(config.model_copy(update={"seed": seed})) == base, seed
    other = order(config.model_copy(update={"data_seed": config.data_seed + 1}))
    assert other[:40] != base[:40]


@pytest.mark.claims("hlo-gradient-all-reduce-sized")
def test_collectives_parsed_from_hlo_text():
    """collectives reads op, arrays, elements, bytes and groups of 3 collectives from HLO text.

    Op, arrays, elements, bytes (each dtype's own width) and replica groups of
    three collectives; the parameter and the dot are not collectives."""
    found = sharding.collectives(HLO)
    assert [c["op"] for c in found] == ["all-reduce", "all-reduce", "all-gather"]
    grad, ints, gather = found
    assert grad["arrays"] == ["f32[16,32]", "f32[32]", "bf16[32,4]", "f32[]"]
    assert grad["elements"] == [512, 32, 128, 1]
    assert grad["bytes"] == 512 * 4 + 32 * 4 + 128 * 2 + 4
    assert grad["replica_groups"] == "{{0,1,2,3,4,5,6,7}}"
    assert (ints["elements"], ints["bytes"]) == ([8], 32)
    assert ints["replica_groups"] == "{{0,1},{2,3}}"
    assert (gather["elements"], gather["bytes"]) == ([6], 6)


def _write_job(workdir, config: Config, fed: list[dict[str, list[int]]]) -> None:
    """The files `launch.summarize` reads, for processes that fed `fed[p][step]`."""
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    (workdir / "collectives.json").write_text(json.dumps({"collectives": []}))
    for p, ids in enumerate(fed):
        final = {"ids": ids, "losses": {"1": 1.0}, "digest": "same"}
        (workdir / f"final_p{p}.json").write_text(json.dumps(final))


def _split(batch: list[int], batch_size: int, count: int) -> list[list[int]]:
    """Each process's block of the padded global batch (what the workers feed)."""
    padded = batch + [data.PAD_ID] * (batch_size - len(batch))
    per = batch_size // count
    return [padded[p * per : (p + 1) * per] for p in range(count)]


# Tiny config: 44 examples in batches of 16, so step 3 is 12 IDs + 4 padding rows.
# Each case: how the fed rows of steps 1-3 are altered, and the verdict by hand
# (True exactly when every ID of every step's batch is fed once, and nothing else).
COVERAGE_CASES = {
    "each process its block": (2, None, True),
    "each process its block, 4 processes": (4, None, True),
    "the blocks swapped between the processes": (2, "swap", True),
    "a row fed by both processes": (2, "duplicate-across", False),
    "both processes feed the first block, nobody the second": (2, "copy-other", False),
    "a row fed twice by one process": (2, "duplicate-within", False),
    "a row never fed": (2, "missing", False),
    "a row of the padded batch never fed": (2, "missing-last", False),
    "a row from outside the batch": (2, "outside", False),
    "a row from another step's batch": (2, "other-step", False),
}


def _alter(how: str | None, fed: list[dict[str, list[int]]], batches: dict[str, list[int]]):
    """Changes the fed rows as the case says; step 2 unless the case names step 3."""
    a, b = fed[0]["2"], fed[1]["2"]
    if how == "swap":
        fed[0]["2"], fed[1]["2"] = b, a
    elif how == "duplicate-across":
        b[-1] = a[0]  # The batch's last row is lost, its first fed twice.
    elif how == "copy-other":
        fed[1]["2"] = list(a)
    elif how == "duplicate-within":
        a[-1] = a[0]
    elif how == "missing":
        b[-1] = data.PAD_ID
    elif how == "missing-last":
        real = [i for i, v in enumerate(fed[1]["3"]) if v != data.PAD_ID]
        fed[1]["3"][real[-1]] = data.PAD_ID
    elif how == "outside":
        b[-1] = next(i for i in range(1000) if i not in batches["2"])
    elif how == "other-step":
        b[-1] = next(i for i in batches["1"] if i not in batches["2"])


@pytest.mark.parametrize("case", list(COVERAGE_CASES))
def test_summary_coverage_flag_from_constructed_ids(evidence, tmp_path, case):
    """summarize's `ids_cover_each_batch_once` is True exactly when each batch row is fed once.

    Hand-built `final_p<i>.json` files for steps 1-3 of the tiny config (step 3 a
    padded batch): the workers' exact blocks, or the blocks swapped, give True; a
    row fed by two processes or twice by one, a row never fed, a row from outside
    the batch or from another step give False, although every ID fed still lies in
    some batch."""
    count, how, expected = COVERAGE_CASES[case]
    config = Config.tiny()
    batches = {str(s): data.global_ids_for_step(config, s - 1) for s in (1, 2, 3)}
    assert [len(b) for b in batches.values()] == [16, 16, 12]
    fed: list[dict[str, list[int]]] = [{} for _ in range(count)]
    for step, batch in batches.items():
        for p, rows in enumerate(_split(batch, config.batch_size, count)):
            fed[p][step] = rows
    _alter(how, fed, batches)
    _write_job(tmp_path / "job", config, fed)
    summary = launch.summarize(tmp_path / "job", count)
    observed = {"fed_step_2": [f["2"] for f in fed], "fed_step_3": [f["3"] for f in fed]}
    observed["ids_cover_each_batch_once"] = summary["ids_cover_each_batch_once"]
    assert evidence.record(
        "coverage flag of `summarize` on constructed per-process sample IDs",
        f"{count} processes, steps 1-3 of the tiny config: {case}",
        observed,
        {"ids_cover_each_batch_once": expected},
        summary["ids_cover_each_batch_once"] is expected,
    ), observed


@pytest.fixture(scope="module", params=MESHES, ids=lambda m: f"mesh{m[0]}x{m[1]}")
def launched(request, tmp_path_factory):
    """A 2 x 4 job started through the CLI, as a user would."""
    config = Config.tiny().model_copy(update={"mesh_shape": request.param})
    root = tmp_path_factory.mktemp(f"launch{request.param[0]}")
    (root / "tiny.json").write_text(config.to_json())
    result = CliRunner().invoke(
        main,
        [
            "launch",
            "--config",
            str(root / "tiny.json"),
            "--workdir",
            str(root / "run"),
            "--processes",
            "2",
            "--devices-per-process",
            "4",
            "--timeout",
            "900",  # A hang guard only: a loaded machine compiles slowly.
        ],
    )
    assert result.exit_code == 0, result.output
    finals = [json.loads((root / "run" / f"final_p{i}.json").read_text()) for i in range(2)]
    return config, root / "run", finals


@pytest.mark.claims("processes-match-one-process")
def test_parity_with_single_process_8_devices(evidence, launched):
    """A 2-process x 4-device run matches 1 process x 8 devices: losses and params to 1e-4."""
    config, workdir, finals = launched
    reference = train.run(config, None)
    steps = sorted(reference["losses"])
    multi = np.array([finals[0]["losses"][str(s)] for s in steps])
    single = np.array([reference["losses"][s] for s in steps])
    condition = f"mesh {config.mesh_shape}, 2 processes x 4 devices vs 1 process x 8 devices"
    ok_losses = evidence.allclose("per-step losses", condition, multi, single, rtol=1e-4, atol=1e-5)
    params = {k: train.host_value(v) for k, v in reference["state"].params.items()}
    multi_state = np.load(workdir / "final_params_p0.npz")
    ok_params = evidence.allclose(
        "final params",
        condition,
        np.concatenate([multi_state[k].ravel() for k in sorted(params)]),
        np.concatenate([params[k].ravel() for k in sorted(params)]),
        rtol=1e-4,
        atol=1e-5,
    )
    evidence.record(
        "bitwise equality (informational)",
        condition,
        {
            "digest_multi": finals[0]["digest"],
            "digest_single": reference["digest"],
            "bitwise_equal": finals[0]["digest"] == reference["digest"],
        },
        None,
        True,
    )
    assert finals[0]["digest"] == finals[1]["digest"], "the two processes disagree on the state"
    assert finals[0]["environment"]["processes"] == 2 and finals[0]["devices"] == 8
    assert ok_losses and ok_params


@pytest.mark.claims("processes-feed-own-rows")
def test_each_process_feeds_only_its_own_rows(evidence, launched):
    """Each process fed only its slice of every global batch; each example once per epoch."""
    config, _, finals = launched
    features, labels = data.make_dataset(config)
    per_epoch = -(-config.num_examples // config.batch_size)
    half = config.batch_size // 2
    seen_per_epoch: dict[int, list[int]] = {}
    problems = []
    for step in sorted(finals[0]["ids"], key=int):
        own = [[i for i in f["ids"][step] if i != data.PAD_ID] for f in finals]
        if set(own[0]) & set(own[1]):
            problems.append(f"step {step}: processes share IDs")
        batch = data.global_ids_for_step(config, int(step) - 1)
        padded = batch + [data.PAD_ID] * (config.batch_size - len(batch))
        for p in range(2):
            if finals[p]["ids"][step] != padded[p * half : (p + 1) * half]:
                problems.append(f"step {step}: process {p} fed rows outside its slice")
        seen_per_epoch.setdefault((int(step) - 1) // per_epoch, []).extend(own[0] + own[1])
    complete = {
        e: sorted(ids) == list(range(config.num_examples))
        for e, ids in seen_per_epoch.items()
        if len(ids) >= config.num_examples or e < max(seen_per_epoch)
    }
    passed = not problems and all(complete.values()) and len(complete) >= 1
    assert evidence.record(
        "sample IDs: disjoint per step, each process its own slice, each example once per epoch",
        f"mesh {config.mesh_shape}, 2 processes, {len(finals[0]['ids'])} steps",
        {
            "problems": problems,
            "complete_epochs_exactly_once": complete,
            "ids_p0_step1": finals[0]["ids"]["1"],
            "ids_p1_step1": finals[1]["ids"]["1"],
        },
        None,
        passed,
    )
    del features, labels


@pytest.mark.claims("processes-feed-own-rows")
def test_the_run_ids_partition_every_batch_and_the_summary_agrees(evidence, launched):
    """The recorded IDs, pooled per step, are that batch's IDs once each; summarize agrees.

    Recomputed with plain Python from `final_p<i>.json`: for every step the
    multiset of non-padding IDs the two processes fed equals the multiset of the
    step's global batch, and no process fed an ID another one fed. The summary's
    `ids_cover_each_batch_once` must say the same."""
    config, workdir, finals = launched
    steps = sorted(finals[0]["ids"], key=int)
    partitions = {}
    for step in steps:
        own = [[i for i in f["ids"][step] if i != data.PAD_ID] for f in finals]
        pooled = Counter(own[0]) + Counter(own[1])
        batch = Counter(data.global_ids_for_step(config, int(step) - 1))
        partitions[step] = pooled == batch and not set(own[0]) & set(own[1])
    flag = launch.summarize(workdir, 2)["ids_cover_each_batch_once"]
    observed = {"steps": steps, "partitions": partitions, "summary_flag": flag}
    assert evidence.record(
        "recorded per-process sample IDs partition every global batch; summary flag agrees",
        f"mesh {config.mesh_shape}, 2 processes, {len(steps)} steps",
        observed,
        None,
        steps == [str(s) for s in range(1, config.num_steps + 1)]
        and all(partitions.values())
        and all(sorted(f["ids"]) == sorted(finals[0]["ids"]) for f in finals)
        and flag is True,
    ), observed


@pytest.mark.claims("hlo-gradient-all-reduce-sized")
def test_gradient_all_reduce_matches_parameter_shards(evidence, launched):
    """The compiled gradient all-reduce carries exactly the per-device parameter shards."""
    config, workdir, _ = launched
    report = json.loads((workdir / "collectives.json").read_text())
    expected = expected_shard_elements(config, config.mesh_shape)
    reduces = [c for c in report["collectives"] if c["op"] == "all-reduce"]
    grad = max(reduces, key=lambda c: c["bytes"])
    carried = sorted(e for e in grad["elements"] if e > 1)
    expected_bytes = 4 * sum(expected)
    scalar_bytes = grad["bytes"] - 4 * sum(carried)
    # Bytes, not elements: at least the shards' f32 bytes, at most two f32 scalars more.
    passed = carried == expected and 0 <= grad["bytes"] - expected_bytes <= 8
    assert evidence.record(
        "collectives in the compiled HLO: the gradient all-reduce carries exactly the "
        "per-device parameter shards (+ the loss scalar)",
        f"mesh {config.mesh_shape}, 2 processes",
        {
            "collectives": report["collectives"],
            "expected_elements": expected,
            "expected_gradient_bytes": expected_bytes,
            "observed_bytes": grad["bytes"],
            "scalar_bytes": scalar_bytes,
        },
        {"extra_bytes_at_least": 0, "extra_bytes_at_most": 8},
        passed,
    )


def test_port_in_use_and_missing_coordinator_are_clear_errors(tmp_path):
    """A busy port, an absent coordinator and too few devices each stop with a clear error."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(launch.LaunchError, match=rf"Port `{port}` on 127.0.0.1 is in use"):
            launch.launch(Config.tiny(), tmp_path / "busy", port=port)
    (tmp_path / "tiny.json").write_text(Config.tiny().to_json())
    free = launch.free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharded_training.worker",
            "--config",
            str(tmp_path / "tiny.json"),
            "--workdir",
            str(tmp_path / "w"),
            "--process-id",
            "1",
            "--num-processes",
            "2",
            "--devices-per-process",
            "4",
            "--coordinator",
            f"127.0.0.1:{free}",
            "--init-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=900,  # A hang guard only.
    )
    assert done.returncode == 2
    assert f"no coordinator answered at `127.0.0.1:{free}` within 2 s" in done.stderr
    with pytest.raises(launch.LaunchError, match=r"mesh shape `\(8, 1\)` needs 8 devices.*`6`"):
        launch.launch(Config.tiny(), tmp_path / "x", processes=2, devices_per_process=3)
    assert jax.device_count() == 8
