import sys, dataclasses
import numpy as np
from engineering_release import data
held = data.heldout_set(0, 0.25)
imgs = held.images.copy(); imgs[0, 10] += 1.0   # one pixel of one held-out image changed
alt = dataclasses.replace(held, images=imgs)
blank = dataclasses.replace(held, images=np.zeros_like(held.images))
print("n", len(held.ids), "digest", held.digest()[:16], "one pixel changed", alt.digest()[:16], "all images zero", blank.digest()[:16])
print("equal after pixel change:", held.digest() == alt.digest(), "equal with blank images:", held.digest() == blank.digest())
