from sharded_training.config import Config
from sharded_training import data
c = Config()
a = data.global_ids_for_step(c, 0)[:8]
b = data.global_ids_for_step(c.model_copy(update={"seed": 5}), 0)[:8]
d = data.global_ids_for_step(c.model_copy(update={"data_seed": 7}), 0)[:8]
print("seed 0 / data_seed 1:", a)
print("seed 5 / data_seed 1:", b, "same order as seed 0:", a == b)
print("seed 0 / data_seed 7:", d, "same order as data_seed 1:", a == d)
