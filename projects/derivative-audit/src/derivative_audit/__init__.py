"""Derivative audit: JVPs, VJPs and custom derivative rules checked by
independent means, and programs inspected through their jaxprs.

float64 is switched on here, at import, because every stage compares against
float64 references (finite differences, NumPy formulas). Every array in this
package is created with an explicit dtype, so the switch changes no float32
result: a float32 check runs in float32.
"""

import jax

jax.config.update("jax_enable_x64", True)

__all__ = ["__version__"]
__version__ = "0.1.0"
