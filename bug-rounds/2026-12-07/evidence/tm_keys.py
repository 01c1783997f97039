import jax, jax.numpy as jnp, numpy as np
# Set True (as tests/conftest.py does) to see fit raise KeyReuseError at step 2 with the bug.
jax.config.update("jax_debug_key_reuse", False)
from training_methods import train, data, mlm, model
from training_methods.config import Config
c = Config.tiny()
splits = data.split_ids(c)
corpus = data.generate(c, splits["train"])
net = model.build(c, key=jax.random.key(1))
loss_fn = mlm.make_loss_fn(c.mask_rate, c.num_symbols) if hasattr(c, "mask_rate") else mlm.make_loss_fn(0.15, c.num_symbols)
seen, masks = [], []
orig = train._cached_step
def spy_cached(graphdef, lf, lr):
    step = orig(graphdef, lf, lr)
    def wrapped(state, batch, key):
        kd = np.asarray(jax.random.key_data(key)).tolist()
        seen.append(kd)
        return step(state, batch, key)
    return wrapped
train._cached_step = spy_cached
_, hist = train.fit(net, loss_fn, c, corpus, splits["train"], splits["heldout"], steps=4, key=jax.random.key(0), objective="mlm")
print("step keys distinct:", len({tuple(k) for k in seen}), "of", len(seen))
print("losses", [round(x, 4) for x in hist["loss"]])
