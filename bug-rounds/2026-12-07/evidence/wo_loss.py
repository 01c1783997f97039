import tempfile, pathlib, numpy as np
from workload_operations import checkpoint, data, verifier
from workload_operations.config import Config
from workload_operations.supervisor import Supervisor
config = Config.tiny_recovery().replace(steps_per_second=0.0)
workdir = pathlib.Path(tempfile.mkdtemp()) / "run"
out = Supervisor(config, workdir, detect=False).run()
print("job", out.status)
dataset = data.make_dataset(config)
ledger = checkpoint.Ledger(workdir)
records = ledger.read("requested")
rec = next(r for r in records if r["step"] == 12)
true_bits = rec["heldout"]["loss_bits"]
for ulps in (1, 4, 16):
    new = (int(true_bits, 16) + ulps).to_bytes(4, "big").hex()
    rec["heldout"]["loss_bits"] = new
    ledger.rewrite("requested", records)
    v = verifier.judge(workdir, 12, config, dataset)
    f = lambda h: float(np.frombuffer(bytes.fromhex(h), ">f4")[0])
    print(f"recorded loss_bits {new} ({f(new)!r}) vs restored {true_bits} ({f(true_bits)!r}), +{ulps} ulp: accepted={v['accepted']} reasons={v['reasons']}")
