"""The float64 scope every numerical entry point runs in.

Why float64: the checks of this project measure convergence slopes (errors
from 1e-2 down to 1e-12), central finite differences (whose truncation and
round-off errors balance near eps**(1/3), about 1e-4 relative in float32 but
6e-6 in float64) and least-squares estimates refined until they move by
1e-10. In float32 all of these sink into round-off (eps 1.2e-7) before the
asymptotic regime is reached. The switch is scoped (`jax.enable_x64`, the
context-manager form of the `jax_enable_x64` flag) rather than global, so that
importing this package changes nothing for other code in the same process.
"""

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import jax

P = ParamSpec("P")
R = TypeVar("R")


def float64() -> object:
    """Context manager: inside it JAX creates and traces float64 arrays."""
    return jax.enable_x64(True)


def in_float64(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: runs `fn` (and everything it traces or jits) in the float64 scope."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with float64():
            return fn(*args, **kwargs)

    return wrapper
