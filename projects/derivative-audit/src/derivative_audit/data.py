"""Problems for the audit: each suite function with its weights, a point `x`,
and the random directions the checks use, all drawn from explicit keys.

Weights are drawn in float64 and cast, so the float32 problem is the float64
problem rounded once: the two conditions check the same mathematics. Scales
keep every intermediate O(1): matrices have entries of standard deviation
1/sqrt(n); the recurrence and the solver's weights have spectral norm below 1.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from derivative_audit import functions, model
from derivative_audit.config import Config

FLOAT_DTYPES = {"float64": jnp.float64, "float32": jnp.float32}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One suite function at one point, in one dtype."""

    name: str
    fn: Callable[[jax.Array], jax.Array]  # x (n,) -> y (m,), weights closed over
    x: jax.Array  # shape=(n,), the point where derivatives are taken
    dtype: str  # "float64" or "float32"
    weights: dict = dataclasses.field(default_factory=dict, repr=False)  # what fn closes over


def _dense(key: jax.Array, shape: tuple[int, int]) -> jax.Array:
    return jax.random.normal(key, shape, jnp.float64) / jnp.sqrt(jnp.float64(shape[1]))


def _weights(name: str, key: jax.Array, config: Config) -> dict[str, jax.Array]:
    n = config.n
    k1, k2, k3 = jax.random.split(key, 3)
    if name == "elementwise":
        return {}
    if name == "matmul_chain":
        return {"w1": _dense(k1, (n, n)), "w2": _dense(k2, (n, n)), "w3": _dense(k3, (n, n))}
    if name in ("softmax", "logsumexp"):
        return {"a": 2.0 * _dense(k1, (n, n))}
    if name == "scan_recurrence":
        w = _dense(k1, (n, n))
        w = w * (0.9 / jnp.linalg.norm(w, ord=2))
        return {"w": w, "c": 0.5 * jax.random.normal(k2, (config.scan_length, n), jnp.float64)}
    if name == "fixed_point_solver":
        return model.init(k1, n, n, contraction=0.6)._asdict()
    raise functions.UnknownFunction(f"No weights are defined for `{name}`.")


def make_problem(name: str, config: Config, dtype: str = "float64") -> Problem:
    """The suite function `name` with weights and point drawn from `config.seed`."""
    fn = functions.lookup(name)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"Unknown dtype `{dtype}`; choose one of {sorted(FLOAT_DTYPES)}.")
    # One key per function name, independent of the suite's order.
    key = jax.random.fold_in(jax.random.key(config.seed), list(functions.SUITE).index(name))
    kw, kx = jax.random.split(key)
    weights = {k: v.astype(FLOAT_DTYPES[dtype]) for k, v in _weights(name, kw, config).items()}
    if name == "fixed_point_solver":
        fn = functools.partial(fn, iterations=config.solver_iterations)
    x = jax.random.normal(kx, (config.n,), jnp.float64).astype(FLOAT_DTYPES[dtype])
    return Problem(name, jax.jit(functools.partial(fn, weights)), x, dtype, weights)


class ProblemError(ValueError):
    """A function or point the audit cannot use; the message says why."""


class NotTraceable(ProblemError, TypeError):
    """A user function JAX cannot trace; the message says why."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def problem_from_callable(
    label: str, fn: Callable, shape: tuple[int, ...], dtype: str, seed: int
) -> Problem:
    """A user function `fn(x)` at a standard-normal point of `shape` and `dtype`.

    Raises `NotTraceable` when `fn` cannot be traced by JAX (it converts a traced
    value to a Python number or NumPy array, or branches on one), and
    `ProblemError` for a dtype or shape the checks cannot use or an output that
    is not one floating-point array of shape `()` or `(m,)`."""
    if dtype not in FLOAT_DTYPES:
        raise ProblemError(f"Unknown dtype `{dtype}`; choose one of {sorted(FLOAT_DTYPES)}.")
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ProblemError(f"The shape of x must be positive sizes, got `{shape}`.")
    x = jax.random.normal(jax.random.key(seed), shape, jnp.float64).astype(dtype)
    try:
        out = jax.eval_shape(fn, x)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerBoolConversionError,
        jax.errors.TracerIntegerConversionError,
    ) as err:
        first = str(err).strip().splitlines()[0]
        raise NotTraceable(
            f"`{label}` is not JAX-traceable: it needs a concrete value where JAX has only an "
            f"abstract one ({first}). Write it with `jax.numpy` and `lax` control flow."
        ) from None
    except (TypeError, ValueError, IndexError) as err:
        raise NotTraceable(
            f"`{label}` cannot be called on a `{dtype}{list(shape)}` array: {_first_line(err)}"
        ) from None
    if not hasattr(out, "shape") or len(out.shape) > 1:
        raise ProblemError(
            f"`{label}` must return one array of shape `()` or `(m,)`, but returns `{out}`."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ProblemError(
            f"`{label}` returns `{out.dtype}` values; derivative checks need a floating-point "
            f"output (an integer or boolean result has no derivative)."
        )
    if out.shape == ():
        inner = fn
        fn = lambda y: jnp.reshape(inner(y), (1,))  # noqa: E731 - a vector output for the checks
    return Problem(label, jax.jit(fn), x, dtype)


def unit_directions(key: jax.Array, count: int, size: int, dtype) -> jax.Array:
    """`count` random unit vectors of length `size`, shape `(count, size)`."""
    v = jax.random.normal(key, (count, size), jnp.float64)
    return (v / jnp.linalg.norm(v, axis=1, keepdims=True)).astype(dtype)


def regression_data(key: jax.Array, batch: int, d_in: int, n: int) -> tuple[jax.Array, jax.Array]:
    """Inputs `(batch, d_in)` and targets `(batch, n)` for the training demo:
    targets are a fixed smooth nonlinear map of the inputs, inside (-1, 1)."""
    kx, km = jax.random.split(key)
    x = jax.random.normal(kx, (batch, d_in), jnp.float64)
    m = _dense(km, (n, d_in))
    return x, 0.8 * jnp.sin(x @ m.T)
