import jax, jax.numpy as jnp, numpy as np
from bayesian_regression import hmc
W, S = 40, 4
flags = []
orig = hmc._welford_update
def spy(w, x, on):
    jax.debug.callback(lambda o: flags.append(bool(o)), on, ordered=True)
    return orig(w, x, on)
hmc._welford_update = spy
target = lambda q: -0.5 * jnp.sum(q**2 / jnp.array([1.0, 100.0]))
s = hmc.run_chain(jax.random.key(0), jnp.array([0.5, 3.0]), target, W, S, 8, 0.8)
jax.effects_barrier()
idx = np.flatnonzero(flags)
print(f"W={W}: variance window = iterations {idx.min()}..{idx.max()} ({len(idx)} draws); docstring: [{W//4}, {W//2})")
print("adapted inverse mass", np.asarray(s.inv_mass), "sampling step size", float(s.step_size))
