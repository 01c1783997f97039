"""What bounds the layer norm's bandwidth on a TPU: the same (block_rows, C) row
blocks streamed by a Pallas kernel that only copies, one that only takes row
statistics and centres, and XLA's elementwise read+write of the same array.

Prints and writes a JSON of GB/s (bytes = one read + one write of the array),
median of 20 timed calls after a compile and a warm call, each waited for.
Run on the chip: `python probes/layer_norm_limit.py OUT.json`.
"""

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _centre(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    o_ref[...] = (x - mean).astype(o_ref.dtype)


def _stats(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    o_ref[...] = ((x - mean) * jax.lax.rsqrt(var + 1e-5)).astype(o_ref.dtype)


def rows_kernel(body, shape, dtype, block_rows):
    r, c = shape
    return jax.jit(
        pl.pallas_call(
            body,
            grid=(r // block_rows,),
            in_specs=[pl.BlockSpec((block_rows, c), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((block_rows, c), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(shape, dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )
    )


def timed(fn, x, calls=20):
    fn.lower(x).compile()
    fn(x).block_until_ready()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(out):
    rows = []
    for shape in ((8192, 8192), (16384, 4096)):
        for dtype in (jnp.float32, jnp.bfloat16):
            x = jax.random.normal(jax.random.key(0), shape, dtype)
            nbytes = 2 * x.size * x.dtype.itemsize
            paths = {"xla_scale": jax.jit(lambda a: a * 2)}
            for br in (32, 128, 512):
                for name, body in (("copy", _copy), ("centre", _centre), ("normalise", _stats)):
                    paths[f"pallas_{name}_rows{br}"] = rows_kernel(body, shape, dtype, br)
            for name, fn in paths.items():
                try:
                    s = timed(fn, x)
                    row = {
                        "shape": shape,
                        "dtype": str(x.dtype),
                        "path": name,
                        "seconds": s,
                        "gb_per_s": nbytes / s / 1e9,
                    }
                except Exception as e:  # a block the chip refuses is recorded, not fatal
                    row = {
                        "shape": shape,
                        "dtype": str(x.dtype),
                        "path": name,
                        "error": str(e)[:200],
                    }
                rows.append(row)
                print(row, flush=True)
    d = jax.devices()[0]
    json.dump(
        {"device_kind": d.device_kind, "jax": jax.__version__, "rows": rows},
        open(out, "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(sys.argv[1])
