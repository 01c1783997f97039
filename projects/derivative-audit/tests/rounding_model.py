"""Whether a backend's float32 `tanh` errs like rounding, the premise of the sweep's
round-off slope.

A central difference's round-off branch falls as 1/h (slope -1 on a log-log plot)
when the function's evaluation errors at x + h u and at x - h u are independent,
as rounding errors are. A backend whose `tanh` is a coarser approximation errs by a
*smooth* function of its argument instead: neighbouring arguments err alike, the
two errors nearly cancel in the difference and leave a bias that does not scale with
1/h, so the branch flattens or bends (a TPU v5e read slopes -0.17, +0.22 and -1.80
where the premise gives -1).

`tanh_error_profile` measures that on the running backend, over 131,072 evenly
spaced float32 arguments in [-3, 3] (steps of 4.6e-5, the suite's pre-activations),
errors in float32 units in the last place against float64:
- `smooth_ulps`: the root mean square of the error averaged over 64 neighbouring
  arguments, the part a difference of nearby evaluations does not cancel at random.
  Independent errors of A ulps leave about A / 14 there; a smooth error about 0.7 A.
- `total_ulps`: the root mean square of the error itself.
The premise holds (`roundoff_slope_judged`) where the smooth part is at most
`SMOOTH_ULPS_AT_MOST` = 2 ulps (a correctly rounded tanh leaves 0.36, XLA's CPU tanh
0.46: their smooth part is rounding's own pattern near 0) or at most half of the
total (independent noise, however large). A TPU v5e's float32 tanh errs by 178 ulps
on average with a lag-one correlation of 0.995 (measured on [-3, 3] against float64):
smooth, and far above 2 ulps; there this module measured 219.6 ulps smooth of 222.9.
"""

from collections.abc import Callable

import jax
import numpy as np

SMOOTH_ULPS_AT_MOST = 2.0
SMOOTH_SHARE_AT_MOST = 0.5
WINDOW = 64
GRID = np.linspace(-3.0, 3.0, 1 << 17).astype(np.float32)


def error_profile(float32_fn: Callable[[np.ndarray], np.ndarray], exact_fn) -> dict:
    """`{"smooth_ulps", "total_ulps"}` of `float32_fn`'s error on `GRID`, in float32
    ulps of the exact value `exact_fn` (evaluated in float64)."""
    exact = exact_fn(GRID.astype(np.float64))
    got = np.asarray(float32_fn(GRID), np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = (got - exact) / ulp
    smooth = np.convolve(err, np.full(WINDOW, 1.0 / WINDOW), mode="valid")
    return {
        "smooth_ulps": float(np.sqrt(np.mean(smooth**2))),
        "total_ulps": float(np.sqrt(np.mean(err**2))),
    }


def tanh_error_profile() -> dict:
    """The running backend's float32 `tanh` (jitted): `error_profile` against NumPy's
    float64 `tanh`."""
    return error_profile(jax.jit(jax.numpy.tanh), np.tanh)


def roundoff_slope_judged(profile: dict) -> bool:
    """The round-off slope's premise holds where the error is rounding-like: its
    smooth part small in ulps, or small against the error itself."""
    return (
        profile["smooth_ulps"] <= SMOOTH_ULPS_AT_MOST
        or profile["smooth_ulps"] <= SMOOTH_SHARE_AT_MOST * profile["total_ulps"]
    )
