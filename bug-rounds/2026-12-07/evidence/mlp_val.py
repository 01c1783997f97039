from mlp_classifier.config import Config
from mlp_classifier import train
r = train.train_and_evaluate(Config.tiny())
e = r.metrics["epochs"][-1]
print("val_loss", repr(e["val_loss"]), "val_acc", e["val_accuracy"], "test", r.metrics["test"])
