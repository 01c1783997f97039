"""The documented table: every primitive the audit accepts, what it does, and
which differentiation modes JAX supports for it.

`jvp` is forward mode (`jax.jvp`, `jacfwd`), `vjp` reverse mode (`jax.vjp`,
`grad`, `jacrev`). Sources: the `jax.lax` reference (one page per operator)
and the autodiff cookbook of the JAX documentation; the two entries with a
single mode are the documented exceptions (`while_loop`: "reverse-mode
differentiation does not work"; `custom_vjp`: "forward-mode autodiff cannot
be used on the function").

A primitive missing from this table is rejected by the audit: its derivative
rules have not been reviewed here, so nothing is claimed about them.
"""

import dataclasses

BOTH = frozenset({"jvp", "vjp"})


@dataclasses.dataclass(frozen=True)
class PrimitiveDoc:
    """One row of the table."""

    summary: str  # what the primitive computes
    modes: frozenset[str]  # differentiation modes JAX supports for it
    note: str = ""  # why a mode is missing, or what to use instead


def _rows(names: str, summary: str, modes: frozenset[str] = BOTH, note: str = "") -> dict:
    return {name: PrimitiveDoc(summary, modes, note) for name in names.split()}


_NO_DERIVATIVE = (
    "Integer or boolean result: it has no tangent, and its inputs receive zero cotangent."
)

TABLE: dict[str, PrimitiveDoc] = {
    # Elementwise arithmetic.
    **_rows(
        "add add_any sub mul div neg max min pow integer_pow square sqrt rsqrt cbrt",
        "Elementwise arithmetic.",
    ),
    **_rows(
        "exp exp2 log log1p expm1 tanh logistic sin cos tan asin acos atan atan2 "
        "sinh cosh asinh acosh atanh erf erfc erf_inv lgamma digamma",
        "Elementwise transcendental function.",
    ),
    **_rows(
        "abs sign floor ceil round clamp nextafter rem",
        "Elementwise piecewise function (derivative zero or one-sided at the kinks).",
    ),
    **_rows(
        "eq ne lt le gt ge and or not xor is_finite",
        "Elementwise comparison or logic.",
        note=_NO_DERIVATIVE,
    ),
    **_rows(
        "select_n",
        "Picks elements from several arrays by an index array (`jnp.where`).",
        note="Differentiates the selected branch only; a NaN in the other branch's "
        "derivative still propagates (0 * inf = NaN).",
    ),
    # Structure.
    **_rows(
        "broadcast_in_dim reshape transpose squeeze expand_dims concatenate pad rev "
        "slice dynamic_slice dynamic_update_slice gather scatter scatter-add "
        "convert_element_type copy copy_p iota split",
        "Moves, copies or converts elements without arithmetic.",
    ),
    # Reductions and contractions.
    **_rows(
        "reduce_sum reduce_max reduce_min reduce_prod cumsum cumprod cummax cumlogsumexp "
        "argmax argmin reduce_precision",
        "Reduction over axes.",
    ),
    **_rows("dot_general", "Tensor contraction (matmul, matvec, inner product)."),
    **_rows("sort", "Sorts along an axis; the derivative permutes the tangents."),
    # Linear algebra.
    **_rows(
        "lu triangular_solve cholesky custom_linear_solve eigh svd qr householder_product "
        "lu_pivots_to_permutation",
        "Matrix factorization or solve (`jnp.linalg`).",
    ),
    # Control flow and calls: the audit walks into their sub-jaxprs.
    **_rows(
        "jit pjit closed_call core_call remat remat2 checkpoint",
        "A call of a sub-program (`jax.jit`, `jax.checkpoint`); the audit walks into it.",
    ),
    **_rows(
        "scan",
        "A loop with a static trip count (`lax.scan`, `fori_loop` with static "
        "bounds); reverse mode stores every iteration.",
    ),
    **_rows("cond", "Runs one of several branches (`lax.cond`, `lax.switch`)."),
    "while": PrimitiveDoc(
        "A loop that runs until a condition fails (`lax.while_loop`, `fori_loop` with "
        "traced bounds).",
        frozenset({"jvp"}),
        "Reverse mode needs every iterate, and the trip count is unknown when tracing; "
        "use `lax.scan` or `fori_loop` with static bounds, or wrap the loop in a "
        "`custom_vjp` (implicit differentiation) so JAX never differentiates the loop.",
    ),
    **_rows(
        "custom_jvp_call",
        "A function with a custom JVP rule (`jax.custom_jvp`); JAX "
        "transposes the linear rule for reverse mode.",
    ),
    "custom_vjp_call": PrimitiveDoc(
        "A function with a custom VJP rule (`jax.custom_vjp`).",
        frozenset({"vjp"}),
        "The rule gives only the transposed map; JAX cannot recover the forward map J t "
        "from it, so `jvp`, `jacfwd` and reverse-over-forward are refused (forward over "
        "reverse works: `grad` first replaces the call by its rules).",
    ),
    "stop_gradient": PrimitiveDoc("Identity with a zero derivative.", BOTH),
    # Randomness: fine in a function that declares it, refused in a deterministic one.
    **_rows(
        "random_seed random_bits random_wrap random_unwrap random_split random_fold_in "
        "threefry2x32 shift_right_logical shift_left or_ bitcast_convert_type",
        "Random bits (a PRNG key or its counter-based hash) or bit manipulation.",
        note=_NO_DERIVATIVE,
    ),
    # Host callbacks: Python runs on the host; JAX knows no derivative for it.
    **_rows(
        "pure_callback io_callback debug_callback",
        "Calls back into Python on the host.",
        frozenset(),
        "JAX has no derivative for a Python function it cannot see; reverse mode also "
        "cannot replay side effects. Write the computation in JAX, or give it a "
        "`custom_jvp`/`custom_vjp` rule.",
    ),
}

# Primitives whose outputs are random bits (refused under a deterministic policy).
RANDOM_PRIMITIVES = frozenset(
    {"random_seed", "random_bits", "random_split", "random_fold_in", "threefry2x32"}
)
# Host callbacks (always refused: not differentiable, and they leave the program).
CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback", "debug_callback"})
# Calls whose body JAX does not differentiate: the custom rule is used instead.
CUSTOM_RULE_PRIMITIVES = frozenset({"custom_jvp_call", "custom_vjp_call"})
