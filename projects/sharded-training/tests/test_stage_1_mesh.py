"""Stage 1: a mesh and a count-weighted global update.

Independent check: the sharded step on a padded batch (unequal valid examples
per shard) against the same step on ONE device fed only the valid rows, with a
plain mean and no mask. Repeated on 1, 2, 4 and 8 devices, on (n, 1) and (n/2, 2)
data x model meshes, and under two padding patterns. A NumPy float64 loss is a
second reference. The naive mean of per-shard means is shown to be wrong under
unequal counts (and right when the counts are equal, which is why it hides).

Tolerance: the sharded sums add the same float32 terms in another order (per
shard, then across shards), so results differ in the last bits: a sum of n
float32 terms moves by up to about n * 6e-8 of the sum of magnitudes. With at
most 16 terms per sum we allow rtol 1e-5 and an atol of 1e-5 of the largest
reference magnitude; a wrong reduction (shown below) is off by percents.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_training import data, model, sharding, train
from sharded_training.cli import main
from sharded_training.config import Config, ConfigError

CONFIG = Config.tiny().model_copy(update={"dropout_rate": 0.0})
RTOL, ATOL_FRACTION = 1e-5, 1e-5


def padded_batch(config: Config, pattern: str) -> dict[str, np.ndarray]:
    """A global batch of `batch_size` rows with some padding rows (mask 0)."""
    if pattern == "pipeline":
        # The pipeline's own last batch of the first epoch: 44 % 16 = 12 valid rows at the
        # front, padding at the back, so the last shards hold fewer (or no) valid rows.
        it = data.local_iterator(config)
        batches = [next(it) for _ in range(3)]
        return data.batch_as_numpy(batches[2])
    # `scattered`: valid rows drawn at random, a different count on every shard.
    features, labels = data.make_dataset(config)
    key_rows, key_mask = jax.random.split(jax.random.key(7))
    rows = np.asarray(jax.random.choice(key_rows, config.num_examples, (config.batch_size,)))
    mask = np.asarray(jax.random.bernoulli(key_mask, 0.6, (config.batch_size,)), np.float32)
    mask[0] = 1.0
    return {"ids": rows, "x": features[rows], "y": labels[rows], "mask": mask}


def unpadded(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keep = batch["mask"] > 0
    return {"x": batch["x"][keep], "y": batch["y"][keep]}


def single_device_step(config: Config, batch: dict[str, np.ndarray]):
    """Reference: one device, only the valid rows, a plain mean (no mask, no counts)."""
    device = jax.devices()[0]
    init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
    params = jax.device_put(model.init_params(config, init_key), device)
    optimizer = train.make_optimizer(config)
    opt_state = optimizer.init(params)
    rows = jax.device_put(unpadded(batch), device)

    def loss(p):
        return jnp.mean(model.per_example_loss(p, rows["x"], rows["y"], None, 0.0))

    value, grads = jax.value_and_grad(loss)(params)
    updates, _ = optimizer.update(grads, opt_state, params)
    del dropout_key
    return value, grads, jax.tree.map(lambda p, u: p + u, params, updates)


def numpy_loss(params, batch) -> float:
    """Float64 NumPy loss over the valid rows: a reference that shares no JAX code."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    rows = unpadded(batch)
    hidden = np.maximum(rows["x"].astype(np.float64) @ p["w1"] + p["b1"], 0.0)
    logits = hidden @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(rows["y"])), rows["y"]].mean())


def sharded_step(config: Config, mesh, batch):
    state = train.init_state(config, mesh)
    gbatch = sharding.global_batch(batch, mesh, config.batch_size)
    grad_fn = jax.jit(jax.grad(lambda p, b: train.loss_fn(p, b, None, 0.0)[0]))
    grads = grad_fn(state.params, gbatch)
    step_fn = train.make_step_fn(config, mesh, state)
    new_state, metrics = step_fn(state, gbatch)
    return state, grads, new_state, metrics


def close(evidence, check, condition, actual, reference) -> bool:
    scale = max(float(np.max(np.abs(np.asarray(r)))) for r in jax.tree.leaves(reference))
    return evidence.allclose(
        check,
        condition,
        np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(actual)]),
        np.concatenate([np.ravel(np.asarray(r)) for r in jax.tree.leaves(reference)]),
        rtol=RTOL,
        atol=ATOL_FRACTION * scale,
    )


DATA_SIZES = (1, 2, 4, 8)
FAST = settings(max_examples=60, derandomize=True, deadline=None, database=None)


@pytest.fixture(scope="module")
def data_meshes():
    """One (d, 1) mesh over the first d devices, per data size d."""
    return {d: sharding.make_mesh((d, 1), jax.devices()[:d]) for d in DATA_SIZES}


def divides(batch_size: int, d: int) -> bool:
    """Plain-Python reference: a batch fits the data axis iff it is a positive multiple."""
    return batch_size >= 1 and batch_size % d == 0


@pytest.mark.parametrize(
    ("batch_size", "d"),
    [(0, 1), (1, 1), (-1, 1), (2, 1), (0, 8), (8, 8), (12, 8), (16, 8), (1, 2), (2, 2)],
)
def test_check_batch_boundaries(data_meshes, batch_size, d):
    """check_batch accepts only positive multiples of the data axis, tested at the boundaries.

    Both sides of both conditions: 0 and 1 rows (the lower bound), one multiple of
    the data axis and a non-multiple, on data sizes 1, 2 and 8."""
    if divides(batch_size, d):
        sharding.check_batch(batch_size, data_meshes[d])
    else:
        with pytest.raises(sharding.MeshError, match=rf"batch of `{batch_size}` examples"):
            sharding.check_batch(batch_size, data_meshes[d])


@FAST
@given(batch_size=st.integers(-4, 40), d=st.sampled_from(DATA_SIZES))
def test_check_batch_accepts_exactly_the_positive_multiples(data_meshes, batch_size, d):
    """check_batch accepts exactly the positive multiples of the data size, like a Python rule."""
    try:
        sharding.check_batch(batch_size, data_meshes[d])
        accepted = True
    except sharding.MeshError:
        accepted = False
    assert accepted == divides(batch_size, d), (batch_size, d)


@FAST
@given(
    d=st.sampled_from(DATA_SIZES),
    per_shard=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_per_shard_counts_against_python(d, per_shard, seed):
    """per_shard_counts equals a plain-Python count of valid rows per contiguous block."""
    mask = np.random.default_rng(seed).integers(0, 2, d * per_shard).astype(np.float32)
    expected = [int(sum(mask[i * per_shard : (i + 1) * per_shard])) for i in range(d)]
    assert sharding.per_shard_counts(mask, d) == expected


def test_each_step_advances_the_step_counter_by_one():
    """`train_step` counts optimizer steps: 0, then 1, then 2, int32, a scalar."""
    config = CONFIG.model_copy(update={"mesh_shape": (1, 1)})
    mesh = sharding.make_mesh((1, 1), jax.devices()[:1])
    state = train.init_state(config, mesh)
    batch = padded_batch(config, "scattered")
    gbatch = sharding.global_batch(batch, mesh, config.batch_size)
    optimizer = train.make_optimizer(config)
    steps = [state.step]
    for _ in range(2):
        state, _ = train.train_step(state, gbatch, optimizer, 0.0)
        steps.append(state.step)
    assert [int(s) for s in steps] == [0, 1, 2]
    assert all(s.dtype == jnp.int32 and s.shape == () for s in steps)


MESHES = [(1, (1, 1)), (2, (2, 1)), (4, (4, 1)), (8, (8, 1)), (4, (2, 2)), (8, (4, 2))]


@pytest.mark.claims(
    "mesh-data-model-layout", "global-batch-ids-stay-on-host", "global-batch-rows-by-data-index"
)
@pytest.mark.parametrize("mesh_shape", [(8, 1), (4, 2)])
def test_the_batch_is_split_over_the_data_axis(evidence, mesh_shape):
    """global_batch puts rows [i*B/d, (i+1)*B/d) of every field but ids on data index i.

    Each device holds exactly its block of rows: the device at data coordinate
    i (read from the mesh's device grid) holds rows [i*B/d, (i+1)*B/d) of the
    batch, and devices that differ only in the model coordinate hold the same
    rows. Checked for features, labels and mask on two meshes."""
    config = CONFIG.model_copy(update={"mesh_shape": mesh_shape})
    mesh = sharding.make_mesh(mesh_shape)
    local = padded_batch(config, "scattered")
    # A further per-row field (its name sorts before `ids`) is split like the others;
    # only the sample IDs stay on the host.
    local["aux"] = np.arange(config.batch_size, dtype=np.int32) * 3
    gbatch = sharding.global_batch(local, mesh, config.batch_size)
    assert sorted(gbatch) == ["aux", "mask", "x", "y"]
    d = mesh_shape[0]
    rows = config.batch_size // d
    coordinate = {
        dev.id: int(i) for i, row in enumerate(np.asarray(mesh.devices)) for dev in np.ravel(row)
    }
    wrong = []
    for name in ("x", "y", "mask", "aux"):
        shards = gbatch[name].addressable_shards
        if len(shards) != jax.device_count():
            wrong.append(f"{name}: {len(shards)} shards")
        for shard in shards:
            i = coordinate[shard.device.id]
            expected = local[name][i * rows : (i + 1) * rows]
            got = np.asarray(shard.data)
            if got.shape != expected.shape or not np.array_equal(got, expected):
                wrong.append(f"{name} on device {shard.device.id}: shape {got.shape}")
    assert evidence.record(
        "the global batch is split over the data axis, one block of rows per data index",
        f"mesh {mesh_shape}, batch {config.batch_size}, {rows} rows per data shard",
        {"problems": wrong[:8], "rows_per_shard": rows},
        {"rows_per_shard": rows},
        not wrong,
    ), wrong


def _range(index: slice, size: int) -> tuple[int, int]:
    """A shard's index along one dimension as (start, stop) of a dimension of `size`."""
    start, stop, _ = index.indices(size)
    return start, stop


@pytest.mark.claims("mesh-data-model-layout")
@pytest.mark.parametrize("mesh_shape", [(4, 2), (2, 4)])
def test_the_model_axis_splits_the_hidden_layer(evidence, mesh_shape):
    """`model` splits the hidden units: w1 by columns, b1, w2 by rows; params replicated over data.

    The documented layout (sharding.py): "`data` splits the batch, `model` splits
    the hidden layer of the MLP (`w1` by columns, `b1`, `w2` by rows)". Condition
    varied: the mesh, (4, 2) and (2, 4), so that splitting w2's class columns instead
    gives other shard shapes on both. Expected, computed here from the mesh sizes
    (h = hidden / model): w1 (features, h), b1 (h,), w2 (h, classes), b2 (classes,)
    on every device, for the fresh state, its Adam moments ("sharded like params")
    and the state after one sharded step. Placement: on each device w1's columns,
    b1 and w2's rows are the same block of h hidden units; the blocks of the model
    coordinates tile [0, hidden), and devices differing only in the data coordinate
    hold the same block. Shapes and index ranges are read from the arrays' shards,
    not from the PartitionSpec, so any equivalent way of writing the layout passes."""
    config = CONFIG.model_copy(update={"mesh_shape": mesh_shape})
    mesh = sharding.make_mesh(mesh_shape)
    d, m = mesh_shape
    f, hidden, c = config.num_features, config.hidden_size, config.num_classes
    h = hidden // m
    expected = {"w1": (f, h), "b1": (h,), "w2": (h, c), "b2": (c,)}
    hidden_dim = {"w1": 1, "b1": 0, "w2": 0}  # The dimension that indexes hidden units.
    coordinate = {
        dev.id: (int(i), int(j)) for (i, j), dev in np.ndenumerate(np.asarray(mesh.devices))
    }
    state = train.init_state(config, mesh)
    batch = padded_batch(config, "scattered")
    new_state, _ = train.make_step_fn(config, mesh, state)(
        state, sharding.global_batch(batch, mesh, config.batch_size)
    )
    leaves = [("params", name, state.params[name]) for name in expected]
    leaves += [("params after one step", name, new_state.params[name]) for name in expected]
    # The Adam moments: every optimizer-state leaf stored under a parameter's name.
    for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        if names and names[-1] in expected:
            leaves.append((f"opt_state{jax.tree_util.keystr(path[:-1])}", names[-1], leaf))
    assert len(leaves) == 4 * len(expected), [(label, name) for label, name, _ in leaves]
    wrong, shard_shapes, hidden_blocks = [], {}, {}
    for label, name, array in leaves:
        shape = expected[name]
        blocks = {}  # device id -> hidden range of this leaf's shard on it
        shards = array.addressable_shards
        if len(shards) != jax.device_count():
            wrong.append(f"{label} {name}: {len(shards)} shards")
        for shard in shards:
            got = tuple(shard.data.shape)
            shard_shapes[f"{label} {name}"] = list(got)
            if got != shape:
                wrong.append(f"{label} {name} on device {shard.device.id}: {got} != {shape}")
            # Every dimension but the hidden one is whole on every device.
            for dim, (index, size) in enumerate(zip(shard.index, array.shape, strict=True)):
                if dim != hidden_dim.get(name) and _range(index, size) != (0, size):
                    wrong.append(f"{label} {name} dim {dim} split on {shard.device.id}")
            if name in hidden_dim:
                blocks[shard.device.id] = _range(shard.index[hidden_dim[name]], hidden)
        if name not in hidden_dim:
            continue
        by_model = {}
        for dev_id, block in blocks.items():
            by_model.setdefault(coordinate[dev_id][1], set()).add(block)
        if any(len(v) != 1 for v in by_model.values()):
            wrong.append(f"{label} {name}: differs across the data axis: {by_model}")
        tiles = sorted(b for v in by_model.values() for b in v)
        if len(by_model) != m or tiles != [(k * h, (k + 1) * h) for k in range(m)]:
            wrong.append(f"{label} {name}: hidden blocks {tiles} do not tile [0, {hidden})")
        hidden_blocks.setdefault(label, {})[name] = blocks
    # On each device, w1's columns, b1 and w2's rows are the same hidden units.
    for label, by_name in hidden_blocks.items():
        if not by_name["w1"] == by_name["b1"] == by_name["w2"]:
            wrong.append(f"{label}: w1, b1 and w2 hold different hidden units on a device")
    assert evidence.record(
        "parameter shards: model splits the hidden units (w1 columns, b1, w2 rows)",
        f"mesh {mesh_shape}: {d} data x {m} model, hidden {hidden}, classes {c}",
        {"problems": wrong[:8], "shard_shapes": shard_shapes},
        {"shard_shapes": expected},
        not wrong,
    ), wrong


@pytest.mark.claims("naive-mean-of-means-wrong", "loss-unequal-shards-plain-mean")
@pytest.mark.parametrize("pattern", ["pipeline", "scattered", "no padding"])
def test_naive_mean_of_means_differs_under_unequal_counts(evidence, pattern):
    """The count-weighted loss equals NumPy's; a mean of shard means fails under unequal counts."""
    config = CONFIG
    mesh = sharding.make_mesh((8, 1))
    if pattern == "no padding":
        batch = padded_batch(config, "scattered")
        batch["mask"] = np.ones_like(batch["mask"])
    else:
        batch = padded_batch(config, pattern)
    counts = sharding.per_shard_counts(batch["mask"], 8)
    state = train.init_state(config, mesh)
    g = sharding.global_batch(batch, mesh, config.batch_size)
    weighted = float(
        sharding.count_weighted_mean_loss(state.params, g["x"], g["y"], g["mask"], mesh)
    )
    naive = float(sharding.naive_mean_of_means(state.params, g["x"], g["y"], g["mask"], mesh))
    reference = numpy_loss(state.params, batch)
    equal_counts = len(set(counts)) == 1
    naive_error = abs(naive - reference) / abs(reference)
    weighted_error = abs(weighted - reference) / abs(reference)
    # Unequal counts: the naive mean must be off by far more than reduction-order noise
    # (1e-3 is 100x the tolerance); equal counts: both are right.
    passed = weighted_error <= 1e-5 and (
        naive_error <= 1e-5 if equal_counts else naive_error >= 1e-3
    )
    assert evidence.record(
        "count-weighted psum(sum)/psum(count) vs naive pmean(per-shard mean), against NumPy",
        f"{pattern}: per-shard counts {counts}",
        {
            "reference": reference,
            "count_weighted": weighted,
            "naive": naive,
            "count_weighted_rel_error": weighted_error,
            "naive_rel_error": naive_error,
        },
        {
            "count_weighted_rel_error": 1e-5,
            "naive_rel_error": "<= 1e-5 with equal counts, >= 1e-3 with unequal counts",
        },
        passed,
    )


@pytest.mark.claims(
    "global-update-equals-single-device",
    "loss-padding-weight-zero",
    "loss-unequal-shards-plain-mean",
    "loss-returns-valid-count",
)
@pytest.mark.parametrize("pattern", ["pipeline", "scattered"])
@pytest.mark.parametrize(("n_devices", "mesh_shape"), MESHES)
def test_global_update_equals_single_device_update(evidence, n_devices, mesh_shape, pattern):
    """Sharded loss, grads and Adam step equal 1 device on the unpadded rows, on 1-8 devices."""
    config = CONFIG.model_copy(update={"mesh_shape": mesh_shape})
    mesh = sharding.make_mesh(mesh_shape, jax.devices()[:n_devices])
    batch = padded_batch(config, pattern)
    counts = sharding.per_shard_counts(batch["mask"], mesh_shape[0])
    state, grads, new_state, metrics = sharded_step(config, mesh, batch)
    ref_loss, ref_grads, ref_params = single_device_step(config, batch)
    condition = f"{n_devices} devices, mesh {mesh_shape}, {pattern} padding, counts {counts}"
    ok_loss = close(
        evidence,
        "loss: sharded count-weighted vs 1 device unpadded",
        condition,
        metrics["loss"],
        ref_loss,
    )
    ok_np = evidence.allclose(
        "loss vs NumPy float64 on the valid rows",
        condition,
        metrics["loss"],
        numpy_loss(state.params, batch),
        rtol=1e-5,
        atol=0,
    )
    ok_grads = close(
        evidence, "gradients: sharded vs 1 device unpadded", condition, grads, ref_grads
    )
    ok_params = close(
        evidence,
        "params after one Adam step: sharded vs 1 device",
        condition,
        new_state.params,
        ref_params,
    )
    assert float(metrics["count"]) == float(batch["mask"].sum())
    assert ok_loss and ok_np and ok_grads and ok_params
    if n_devices > 1:
        # The params really are laid out over the mesh as declared.
        assert new_state.params["w1"].sharding.spec == sharding.param_specs()["w1"]


def test_dropout_masks_do_not_depend_on_the_sharding(evidence):
    """With dropout on, the (4, 2)-mesh step equals the 1-device step on the same batch.

    With dropout on, the (4, 2)-mesh step equals the 1-device step on the same padded
    batch: the masks come from the state's key, not from the device layout."""
    config = Config.tiny().model_copy(update={"mesh_shape": (4, 2)})
    batch = padded_batch(config, "pipeline")
    losses = {}
    for label, shape, devices in [
        ("8 devices", (4, 2), jax.devices()),
        ("1 device", (1, 1), jax.devices()[:1]),
    ]:
        mesh = sharding.make_mesh(shape, devices)
        state = train.init_state(config, mesh)
        new_state, metrics = train.make_step_fn(config, mesh, state)(
            state, sharding.global_batch(batch, mesh, config.batch_size)
        )
        losses[label] = (float(metrics["loss"]), new_state.params)
    assert close(
        evidence,
        "dropout step: (4, 2) mesh vs 1 device",
        "dropout 0.1, padded batch",
        losses["8 devices"][1],
        losses["1 device"][1],
    )


def test_dropout_loss_equals_numpy_with_the_documented_mask(evidence):
    """With dropout on, the (4, 2)-mesh step's loss equals a NumPy float64 recomputation.

    The documented contract: the step splits `state.key` and draws the dropout mask
    from the second half as `bernoulli(key, 1 - rate, (batch, hidden))` over the
    GLOBAL hidden activations, and scales kept units by 1 / (1 - rate). The test draws
    that mask itself, does the forward pass and the count-weighted loss over the
    valid rows in float64 from the state's parameters, and compares. A mask with the
    wrong keep probability, the wrong scale, the unsplit key, or one drawn per shard
    with the local shape gives a different loss. The no-dropout loss of the same
    params and batch is shown to differ, so dropout really applies.
    Tolerance: float32 against float64 over 16 rows and 32 hidden units, rtol 1e-5."""
    rate = 0.25  # Not 0.5, so that a mask drawn with `rate` differs in its keep rate too.
    config = Config.tiny().model_copy(update={"mesh_shape": (4, 2), "dropout_rate": rate})
    mesh = sharding.make_mesh((4, 2))
    # Scattered padding: unequal valid counts per data shard, no data pipeline to start.
    batch = padded_batch(config, "scattered")
    state = train.init_state(config, mesh)
    gbatch = sharding.global_batch(batch, mesh, config.batch_size)
    # A clone of the key: the step consumes `state.key`, and key-reuse checking is on.
    key = jax.random.clone(state.key)
    _, metrics = train.make_step_fn(config, mesh, state)(state, gbatch)

    # The documented mask, from the documented subkey, over the global (batch, hidden) shape.
    dropout_key = jax.random.split(key)[1]
    keep = np.asarray(
        jax.random.bernoulli(dropout_key, 1.0 - rate, (config.batch_size, config.hidden_size))
    )
    p = {k: np.asarray(v, np.float64) for k, v in state.params.items()}
    hidden = np.maximum(batch["x"].astype(np.float64) @ p["w1"] + p["b1"], 0.0)
    hidden = np.where(keep, hidden / (1.0 - rate), 0.0)
    logits = hidden @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    # Count-weighted mean over the valid rows only; the mask rows stay aligned with the batch.
    nll = -log_probs[np.arange(config.batch_size), batch["y"]]
    valid = batch["mask"] > 0
    reference = float(nll[valid].mean())

    condition = f"mesh (4, 2), dropout {rate}, scattered padding, {int(valid.sum())} valid rows"
    ok = evidence.allclose(
        "dropout loss vs NumPy float64 with the documented mask",
        condition,
        metrics["loss"],
        reference,
        rtol=1e-5,
        atol=0,
    )
    loss = float(metrics["loss"])
    # The rate-0 loss of the same params and batch (NumPy, no mask; the rate-0 step is
    # checked against it in `test_global_update_equals_single_device_update`). The
    # dropout loss must be far from it (1e-3 relative is 100x the tolerance), so the
    # comparison with the masked reference really tests the dropout path.
    loss_0 = numpy_loss(state.params, batch)
    assert evidence.record(
        "dropout changes the loss: rate 0.25 vs rate 0",
        condition,
        {"loss": loss, "loss_rate_0": loss_0, "reference": reference},
        {"min_rel_difference": 1e-3},
        abs(loss - loss_0) >= 1e-3 * abs(loss_0),
    ), (loss, loss_0)
    assert ok, (loss, reference)


def test_same_seed_same_bits_other_seed_other_bits(evidence):
    """Two 12-step runs of one seed give bitwise-equal losses and state; seed 1 differs."""
    runs = {
        "seed 0, first": train.run(Config.tiny(), None),
        "seed 0, second": train.run(Config.tiny(), None),
        "seed 1": train.run(Config.tiny().model_copy(update={"seed": 1}), None),
    }
    digests = {k: v["digest"] for k, v in runs.items()}
    bits = {k: [train.float_bits(x) for x in v["losses"].values()] for k, v in runs.items()}
    passed = (
        digests["seed 0, first"] == digests["seed 0, second"]
        and bits["seed 0, first"] == bits["seed 0, second"]
        and digests["seed 1"] != digests["seed 0, first"]
    )
    assert evidence.record(
        "bitwise determinism of a 12-step 8-device run",
        "seeds 0, 0, 1",
        {"digests": digests, "loss_bits": bits},
        None,
        passed,
    )


def test_bad_mesh_and_batch_are_clear_errors(tmp_path):
    """A mesh without its devices or a batch off the data axis is refused naming both sizes."""
    with pytest.raises(sharding.MeshError, match=r"mesh shape `\(3, 2\)` needs 6 devices.*`8`"):
        sharding.make_mesh((3, 2))
    with pytest.raises(ValueError, match=r"`batch_size` = `12` does not divide .* size `8`"):
        Config.tiny().model_copy(update={"batch_size": 12}).model_validate(
            {**Config.tiny().model_dump(), "batch_size": 12}
        )
    with pytest.raises(sharding.MeshError, match=r"batch of `12` examples .* size `8`"):
        sharding.check_batch(12, sharding.make_mesh((8, 1)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"mesh_shape": [3, 2], "batch_size": 12}')
    result = CliRunner().invoke(
        main, ["train", "--config", str(bad), "--workdir", str(tmp_path / "run")]
    )
    assert result.exit_code == 2 and "mesh shape `(3, 2)` needs 6 devices" in result.output
    with pytest.raises(ConfigError, match=r"Unknown field `mesh`"):
        Config.from_json('{"mesh": [8, 1]}')


def test_cli_train_runs_and_checkpoints(tmp_path):
    """The train CLI runs the tiny config, prints the final loss, plots and checkpoints step 12."""
    cfg = tmp_path / "tiny.json"
    cfg.write_text(Config.tiny().to_json())
    result = CliRunner().invoke(
        main, ["train", "--config", str(cfg), "--workdir", str(tmp_path / "run")]
    )
    assert result.exit_code == 0, result.output
    assert "final loss" in result.output and (tmp_path / "run" / "loss.png").is_file()
    assert (tmp_path / "run" / "checkpoints" / "12").is_dir()
