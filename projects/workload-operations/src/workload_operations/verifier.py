"""The acceptance judgement of recovery points, run as its own process:
`python -m workload_operations.verifier --workdir W` (or `workload-operations verify`).

For every requested step without a verdict, `judge` restores the step from
disk in this process (not the job's memory), and accepts it only if:
- the step was completed: Orbax committed its directory [claim:accept-only-committed];
- it restores: every item reads back [claim:accept-only-restorable];
- its array checksums and its Grain iterator state digest equal the request
  record's [claim:accept-matching-checksums];
- the held-out evaluation of the restored parameters is bitwise the one
  recorded when the save was requested (loss bits and predictions digest)
  [claim:accept-matching-heldout].

Checksums alone can be regenerated after damage; the held-out evaluation
cannot, without the data and the original parameters. Verdicts are appended
to `ledger/verdicts.jsonl`; exit status 0 when every verdict was written
(accepting or rejecting), 2 for a workdir with no checkpoint ledger.
"""

import argparse
import json
import sys
from pathlib import Path

from workload_operations import checkpoint, data, train
from workload_operations.config import Config, ConfigError, load

# What `judge` reads from a request record, with the JSON types.
REQUEST_FIELDS = {"checksums": dict, "data_state_sha256": str, "heldout": dict}
HELDOUT_FIELDS = {"loss_bits": str, "predictions_sha256": str}


def judge(workdir: Path, step: int, config: Config, dataset: dict) -> dict:
    """The verdict on one step: `accepted`, the `reasons` against it, and the figures;
    a step with no request record is rejected [claim:accept-only-requested], and
    so is any step that fails a condition of the module docstring, each failure a
    reason [claim:judge-verdict-with-reasons]."""
    workdir = Path(workdir)
    requested = checkpoint.Ledger(workdir).by_step("requested").get(step)
    figures: dict = {"committed": checkpoint.is_committed(workdir, step)}
    reasons: list[str] = []
    # --- exercise stage 3: Restore, then compare sums and held-out bits. ---
    if requested is None:
        reasons.append("no request record: this step was never asked for")
    elif not figures["committed"]:
        reasons.append("not completed: Orbax never committed the step directory")
    else:
        like = train.create_train_state(config)
        try:
            arrays, iterator, _ = checkpoint.restore(
                workdir, step, train.abstract_state(like), data.iterator(config, dataset)
            )
        except Exception as err:  # Any damage that stops a restore is a rejection.
            reasons.append(f"restore failed: {type(err).__name__}: {str(err).splitlines()[0]}")
        else:
            sums = checkpoint.checksums(arrays)
            bad = sorted(
                k for k in requested["checksums"] if sums.get(k) != requested["checksums"][k]
            )
            figures["checksum_mismatches"] = bad
            if bad or set(sums) != set(requested["checksums"]):
                reasons.append(f"checksums differ for {bad or 'the set of arrays'}")
            digest = checkpoint.data_state_digest(iterator.get_state())
            figures["data_state_sha256"] = digest
            if digest != requested["data_state_sha256"]:
                reasons.append("the Grain iterator state differs from the requested one")
            heldout = train.heldout_evaluation(train.TrainState(*arrays).params, dataset)
            figures["heldout"] = heldout
            figures["heldout_recorded"] = requested["heldout"]
            for key in ("loss_bits", "predictions_sha256"):
                if heldout[key] != requested["heldout"][key]:
                    reasons.append(
                        f"held-out `{key}` is `{heldout[key]}`, recorded "
                        f"`{requested['heldout'][key]}` at save time"
                    )
    accepted = not reasons
    # --- end exercise ---
    return {"step": step, "accepted": accepted, "reasons": reasons, "figures": figures}


def verify(workdir: Path, config: Config | None = None, *, rejudge: bool = False) -> list[dict]:
    """Judges every requested step without a verdict newer than its request (all of
    them with `rejudge`) and appends the verdicts to the ledger."""
    workdir = Path(workdir)
    ledger = checkpoint.Ledger(workdir)
    if not ledger.root.is_dir():
        raise checkpoint.CheckpointError(
            f"`{workdir}` has no checkpoint ledger (`ledger/`); give the workdir of a run "
            f"that saved checkpoints."
        )
    if config is None:
        config = load(workdir / "config.json")
    requested = ledger.by_step("requested")
    verdicts_so_far = {} if rejudge else ledger.by_step("verdicts")
    # A step requested again (by a continued run) after its verdict is judged again.
    pending = [
        step
        for step, request in requested.items()
        if step not in verdicts_so_far or verdicts_so_far[step]["t"] < request["t"]
    ]
    for step in sorted(pending):  # Every record is checked before any step is judged.
        problem = checkpoint.record_problem(requested[step], REQUEST_FIELDS)
        if not problem:
            problem = checkpoint.record_problem(requested[step]["heldout"], HELDOUT_FIELDS)
            problem = problem and f"`heldout` {problem}"
        if problem:
            raise checkpoint.CheckpointError(
                f"The request record of step {step} in `{ledger.root / 'requested.jsonl'}` "
                f"{problem}; it cannot be judged."
            )
    dataset = data.make_dataset(config)
    verdicts = []
    for step in sorted(pending):
        verdict = judge(workdir, step, config, dataset)
        ledger.append("verdicts", {k: verdict[k] for k in ("step", "accepted", "reasons")})
        verdicts.append(verdict)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workload_operations.verifier")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--rejudge", action="store_true")
    args = parser.parse_args(argv)
    try:
        verdicts = verify(Path(args.workdir), rejudge=args.rejudge)
    except (checkpoint.CheckpointError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = [{k: v[k] for k in ("step", "accepted", "reasons")} for v in verdicts]
    print(
        json.dumps(
            {"verdicts": summary, "latest_accepted": checkpoint.latest_accepted(Path(args.workdir))}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
