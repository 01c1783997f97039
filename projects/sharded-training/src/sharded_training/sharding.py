"""Meshes, shardings, count-weighted reductions and the collectives of a compiled step.

Mesh axes: `data` splits the batch, `model` splits the hidden layer of the MLP
(`w1` by columns, `b1`, `w2` by rows). A loss over a sharded, padded batch must
be weighted by the number of VALID examples: the global mean is
`psum(sum of losses) / psum(count)`. The mean of per-shard means
(`pmean(local mean)`) gives every shard the same weight whatever its count, and
is wrong as soon as the counts differ; `naive_mean_of_means` exists to show it.
"""

import re
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sharded_training import model


class MeshError(ValueError):
    """A mesh that does not fit the devices, or a batch that does not fit the mesh."""


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, model) mesh over `devices` (default: every device of every process)."""
    shape = tuple(shape)
    if len(shape) != 2 or not all(type(s) is int and s >= 1 for s in shape):
        raise MeshError(
            f"The mesh shape `{shape}` must be two positive whole numbers (data, model)."
        )
    devices = list(jax.devices() if devices is None else devices)
    data, model_size = shape
    if data * model_size != len(devices):
        raise MeshError(
            f"The mesh shape `({data}, {model_size})` needs {data * model_size} devices, but "
            f"there are `{len(devices)}`; choose (data, model) sizes whose product is "
            f"{len(devices)}."
        )
    return jax.make_mesh(
        (data, model_size),
        ("data", "model"),
        devices=devices,
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
    )


def param_specs() -> dict[str, P]:
    return {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}


def param_shardings(mesh: Mesh) -> dict[str, NamedSharding]:
    return {name: NamedSharding(mesh, spec) for name, spec in param_specs().items()}


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def check_batch(batch_size: int, mesh: Mesh) -> None:
    data = mesh.shape["data"]
    if batch_size < 1 or batch_size % data:
        raise MeshError(
            f"The batch of `{batch_size}` examples does not divide over the data axis of size "
            f"`{data}`; use a batch size that is a multiple of {data}."
        )


def global_batch(local: dict[str, np.ndarray], mesh: Mesh, batch_size: int) -> dict:
    """Global arrays from this process's rows (`jax.make_array_from_process_local_data`):
    each process passes only the rows it loaded; none is copied to another process.

    Cases:
      key `ids` -> left out: the sample IDs stay on the host [claim:global-batch-ids-stay-on-host].
      any other key (`x`, `y`, `mask`, or a further per-row field) -> a global array
        of shape `(batch_size, *value.shape[1:])`, sharded by `batch_sharding(mesh)`:
        the device at data index i holds rows `[i * B / d, (i + 1) * B / d)`, and
        devices that differ only in the model index hold the same rows
        [claim:global-batch-rows-by-data-index].
    """
    # --- exercise stage 1: Split rows over the data axis; build global arrays from local rows. ---
    sharding = batch_sharding(mesh)
    out = {}
    for name, value in local.items():
        if name == "ids":
            continue
        shape = (batch_size, *value.shape[1:])
        out[name] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out
    # --- end exercise ---


def per_shard_counts(mask: np.ndarray, data_size: int) -> list[int]:
    """Valid examples held by each data shard of a global `mask` `(batch,)`."""
    return [int(c) for c in np.asarray(mask).reshape(data_size, -1).sum(axis=1)]


def _local_sums(params, x, y, mask, dropout_rate):
    losses = model.per_example_loss(params, x, y, None, dropout_rate)
    return jnp.sum(losses * mask), jnp.sum(mask)


@partial(jax.jit, static_argnames=("mesh",))
def count_weighted_mean_loss(params, x, y, mask, mesh: Mesh):
    """`psum(local sum) / psum(local count)` in `shard_map` over the data axis."""

    def body(params, x, y, mask):
        total, count = _local_sums(params, x, y, mask, 0.0)
        return jax.lax.psum(total, "data") / jax.lax.psum(count, "data")

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P("data"), P("data"), P("data")),
        out_specs=P(),
        axis_names={"data"},
    )(params, x, y, mask)


@partial(jax.jit, static_argnames=("mesh",))
def naive_mean_of_means(params, x, y, mask, mesh: Mesh):
    """The WRONG reduction: every shard's own mean, averaged with equal weights."""

    def body(params, x, y, mask):
        total, count = _local_sums(params, x, y, mask, 0.0)
        return jax.lax.pmean(total / jnp.maximum(count, 1.0), "data")

    return jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(P(), P("data"), P("data"), P("data")),
        out_specs=P(),
        axis_names={"data"},
    )(params, x, y, mask)


_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|\w+\[[^\]]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\("
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "f64": 8, "s64": 8, "pred": 1}


def collectives(hlo_text: str) -> list[dict]:
    """Every collective of a compiled module's HLO text: op, result shapes, bytes,
    replica groups. Bytes count each result array once (what one device sends
    into an all-reduce)."""
    found = []
    for line in hlo_text.splitlines():
        match = _COLLECTIVE.search(line)
        if match is None:
            continue
        arrays, elements = [], []
        total = 0
        for array in _ARRAY.finditer(match.group("shape")):
            dims = [int(d) for d in array.group("dims").split(",") if d]
            nbytes = int(np.prod(dims, dtype=np.int64)) * _BYTES.get(array.group("dtype"), 4)
            arrays.append(f"{array.group('dtype')}[{','.join(map(str, dims))}]")
            elements.append(int(np.prod(dims, dtype=np.int64)))
            total += nbytes
        groups = re.search(r"replica_groups=(.*?), (?:use_global|to_apply|channel)", line)
        found.append(
            {
                "op": match.group("op"),
                "arrays": arrays,
                "elements": elements,
                "bytes": total,
                "replica_groups": groups.group(1) if groups else "",
            }
        )
    return found


def param_shard_elements(config, mesh: Mesh) -> list[int]:
    """Elements of each parameter's shard on one device: what one device's gradient
    all-reduce over the data axis must carry."""
    shapes = {
        "w1": (config.num_features, config.hidden_size),
        "b1": (config.hidden_size,),
        "w2": (config.hidden_size, config.num_classes),
        "b2": (config.num_classes,),
    }
    out = []
    for name, spec in param_specs().items():
        shape = list(shapes[name])
        for dim, axis in enumerate(spec):
            if axis is not None:
                shape[dim] //= mesh.shape[axis]
        out.append(int(np.prod(shape, dtype=np.int64)))
    return sorted(out)
