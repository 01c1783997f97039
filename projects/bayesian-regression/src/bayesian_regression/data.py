"""Synthetic regression data from a key, and the checks every design passes.

`make_dataset` draws a design whose features share one correlation `rho`
(equicorrelated Gaussian rows), true weights, and noisy targets. `validate`
turns a NaN, an infinite value or a shape mismatch into a `DataError` that
names it, before any of it reaches a posterior.

`check_array`, `check_count` and `check_number` are the checks every public
entry point of the package (the exact posterior, the samplers, VI, the
diagnostics) runs on its arguments: a wrong dtype or shape, an empty array, a
NaN or an infinite value, a size that is not a positive integer is a
`DataError` naming the argument. Under `jax.jit` or `jax.vmap` the values are
not known yet, so there only the shape and dtype are checked.
"""

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class DataError(ValueError):
    """A design or target that cannot be used; the message says why."""


def _is_traced(value) -> bool:
    return isinstance(value, jax.core.Tracer)


def check_array(
    value,
    name: str,
    *,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    floating: bool = False,
):
    """Checks one array argument; returns it unchanged.

    `ndim`/`shape` (with `None` for a free axis) fix its shape; it must not be
    empty; its dtype must be real (floating point when `floating`); its values
    must be finite (checked only when they are concrete, not under tracing)."""
    if _is_traced(value) or isinstance(value, jax.Array | np.ndarray):
        dtype, actual = np.dtype(value.dtype), tuple(value.shape)
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as err:  # ragged nested lists, for one
            raise DataError(f"`{name}` is not an array: {str(err).rstrip('.')}.") from None
        dtype, actual = arr.dtype, arr.shape
    is_float = jnp.issubdtype(dtype, jnp.floating)
    is_int = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_)
    real = is_float or (is_int and not floating)
    if not real:
        wanted = "floating-point" if floating else "real numeric"
        raise DataError(f"`{name}` must be a {wanted} array, but its dtype is `{dtype}`.")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and len(actual) != ndim:
        raise DataError(f"`{name}` must have {ndim} dimensions, but it has shape `{actual}`.")
    pairs = zip(shape or (), actual, strict=False)
    if shape is not None and any(s is not None and s != a for s, a in pairs):
        axes = ["n" if s is None else str(s) for s in shape]
        wanted = "(" + ", ".join(axes) + ("," if len(axes) == 1 else "") + ")"
        raise DataError(f"`{name}` must have shape `{wanted}`, but it has shape `{actual}`.")
    if math.prod(actual) == 0 and len(actual) > 0:
        raise DataError(f"`{name}` is empty (shape `{actual}`).")
    if not _is_traced(value):
        arr = np.asarray(value)
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0]) if arr.ndim else ()
            raise DataError(
                f"`{name}` holds `{int(bad.sum())}` non-finite values (NaN or inf), the first "
                f"at index `{where}`."
            )
    return value


def check_tree(tree, name: str) -> None:
    """Every array or number in the pytree `tree` (a sampler's `data`) is finite
    and non-empty, as `check_array` checks one."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        if isinstance(leaf, numbers.Number | np.ndarray | jax.Array) or _is_traced(leaf):
            check_array(leaf, f"{name}{jax.tree_util.keystr(path)}")


def check_count(value, name: str, minimum: int = 1) -> int:
    """A whole number `>= minimum` (a size, a count of steps); returns it as `int`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise DataError(f"`{name}` must be an integer, but it is `{value!r}`.")
    if value < minimum:
        raise DataError(f"`{name}` must be at least `{minimum}`, but it is `{value}`.")
    return int(value)


def check_number(
    value,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real number inside the stated bounds; returns it as `float`."""
    if _is_traced(value):
        return value
    if isinstance(value, str | bytes | bool | np.bool_) or np.ndim(value) != 0:
        raise DataError(f"`{name}` must be a number, but it is `{value!r}`.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"`{name}` must be a number, but it is `{value!r}`.") from None
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise DataError(f"`{name}` must be a finite number in `{span}`, but it is `{value}`.")
    return number


class Dataset(NamedTuple):
    x: jax.Array  # shape=(n, d), float32: the design
    y: jax.Array  # shape=(n,), float32: the targets
    true_weights: jax.Array  # shape=(d,), float32
    true_noise_scale: float


def correlated_design(key: jax.Array, num_obs: int, num_features: int, rho: float) -> jax.Array:
    """`(num_obs, num_features)` Gaussian rows with unit variances and pairwise
    correlation `rho`: `x = z L^T` with `L` the Cholesky factor of
    `(1 - rho) I + rho 1 1^T`."""
    cov = (1.0 - rho) * jnp.eye(num_features) + rho * jnp.ones((num_features, num_features))
    chol = jnp.linalg.cholesky(cov)
    z = jax.random.normal(key, (num_obs, num_features))
    return z @ chol.T


def make_dataset(
    key: jax.Array, num_obs: int, num_features: int, rho: float, noise_scale: float
) -> Dataset:
    """A synthetic data set: correlated design, weights `~ N(0, 1)`, Gaussian noise."""
    check_count(num_obs, "num_obs")
    check_count(num_features, "num_features")
    # The equicorrelation matrix is positive definite for -1/(d-1) < rho < 1.
    check_number(
        rho, "rho", low=-1.0 / max(num_features - 1, 1), high=1.0, low_open=True, high_open=True
    )
    check_number(noise_scale, "noise_scale", low=0.0)
    key_x, key_w, key_e = jax.random.split(key, 3)
    x = correlated_design(key_x, num_obs, num_features, rho)
    weights = jax.random.normal(key_w, (num_features,))
    y = x @ weights + noise_scale * jax.random.normal(key_e, (num_obs,))
    return Dataset(x, y, weights, float(noise_scale))


def from_config(config) -> Dataset:
    """The data set a `Config` describes (its `data_seed`)."""
    return make_dataset(
        jax.random.key(config.data_seed),
        config.num_obs,
        config.num_features,
        config.feature_correlation,
        config.noise_scale,
    )


def validate(x, y) -> tuple[jax.Array, jax.Array]:
    """Returns `(x, y)` as float32 arrays after checking shapes and values.

    `x`: shape `(n, d)`; `y`: shape `(n,)`; both finite. Raises `DataError`.
    """
    x_np = np.asarray(x)
    y_np = np.asarray(y)
    for name, arr in (("design `x`", x_np), ("targets `y`", y_np)):
        if arr.dtype.kind not in "fiub":
            raise DataError(f"The {name} must be numbers, but their dtype is `{arr.dtype}`.")
    if x_np.ndim != 2:
        raise DataError(
            f"The design `x` must have shape `(n, d)`, but it has shape `{x_np.shape}`."
        )
    if y_np.ndim != 1:
        raise DataError(
            f"The targets `y` must have shape `(n,)`, but they have shape `{y_np.shape}`."
        )
    if x_np.shape[0] != y_np.shape[0]:
        raise DataError(
            f"The design `x` has `{x_np.shape[0]}` rows but there are `{y_np.shape[0]}` targets; "
            f"`y` must have one per row."
        )
    if x_np.shape[0] < 1 or x_np.shape[1] < 1:
        raise DataError(f"The design `x` is empty (shape `{x_np.shape}`).")
    for name, arr in (("design `x`", x_np), ("targets `y`", y_np)):
        bad = ~np.isfinite(arr)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"The {name} hold `{int(bad.sum())}` non-finite values (NaN or inf), the first "
                f"at index `{where}`; remove or impute them first."
            )
    return jnp.asarray(x_np, jnp.float32), jnp.asarray(y_np, jnp.float32)
