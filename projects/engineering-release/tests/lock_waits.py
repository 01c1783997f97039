"""How long commands wait for the state's lock: 8 clients x 10 mixed commands.

    python tests/lock_waits.py [--clients 8] [--commands 10] [--out FILE.json]

Run on demand (pytest does not collect it). Set-up, through the command line
as an operator would: two tiny models registered (seeds 0 and 1), each
evaluated and approved, model 0 released. Then `tests/stress_worker.py` forks
the clients and releases them together; each runs its commands in turn,
cycling through approve, evaluate, status, keygen, verify, release and
rollback from a different starting point, with `ENGINEERING_RELEASE_LOCK_LOG`
set, so every hold of the lock leaves one line: how long it waited and how
long it held. Reported: the longest wait, the median and 99th percentile of
the waits, the longest hold, the commands by exit code, and whether nothing
was lost: every approve, release and rollback a client reported is an entry of
the final log, the log holds no other new entry, and `verify` passes. Exit 1
when anything was lost or `verify` fails; the waits are figures, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
# Each client starts at another of these and cycles through them.
COMMANDS = [
    ["approve", "{m1}", "{e1}", "--key", "{pem}", "--signer", "client-{p}"],
    ["evaluate", "{m1}"],
    ["status"],
    ["keygen", "operator-{p}-{i}"],
    ["verify"],
    ["release", "{m1}"],
    ["rollback"],
    ["approve", "{m0}", "{e0}", "--key", "{pem}"],
]
WRITES = re.compile(r"(?:approved: |  )log entry (\d+) ([0-9a-f]{64})")


def cli(root: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "engineering_release.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT,
    )
    if done.returncode != 0:
        sys.exit(f"set-up `{' '.join(args)}` failed: {done.stderr[-2000:]}")
    return done.stdout


def set_up(root: Path) -> dict[str, str]:
    tiny = str(PROJECT / "configs" / "tiny.json")
    ids = {}
    for seed in (0, 1):
        out = cli(root, "register", "--config", tiny, "--seed", str(seed))
        ids[f"m{seed}"] = re.search(r"model ([0-9a-f]{64})", out).group(1)
        out = cli(root, "evaluate", ids[f"m{seed}"])
        ids[f"e{seed}"] = re.search(r"evaluation ([0-9a-f]{64})", out).group(1)
    cli(root, "keygen", "approver")
    ids["pem"] = str(root / "keys" / "approver.pem")
    for seed in (0, 1):
        cli(root, "approve", ids[f"m{seed}"], ids[f"e{seed}"], "--key", ids["pem"])
    cli(root, "release", ids["m0"])
    return ids


def held_out_split(path: Path) -> None:
    """The held-out split the clients read (JAX must not run on both sides of a fork)."""
    code = (
        "import sys, numpy as np; from engineering_release import data; "
        "t, h = data.split_ids(0, 0.2); np.savez(sys.argv[1], train=t, heldout=h)"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=PROJECT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--commands", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lock-waits-") as tmp:
        root = Path(tmp) / "release"
        began = time.perf_counter()
        ids = set_up(root)
        print(f"set up in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        split = Path(tmp) / "split.npz"
        held_out_split(split)
        sys.path.insert(0, str(PROJECT / "src"))
        from engineering_release import ledger

        before = ledger.read(root / "ledger.jsonl")
        log = Path(tmp) / "lock.jsonl"
        argv = [str(HERE / "stress_worker.py"), str(root), str(args.clients)]
        argv += [str(args.commands), str(split)]
        for command in COMMANDS:
            # `{p}` and `{i}` stay for the worker: the client's and the command's number.
            argv += ["--", *[a.format(p="{p}", i="{i}", **ids) for a in command]]
        env = dict(os.environ, ENGINEERING_RELEASE_LOCK_LOG=str(log))
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=PROJECT
        )
        wall = time.perf_counter() - began
        if proc.returncode != 0:
            sys.exit(f"a client crashed: {proc.stderr[-3000:]}")
        records = [json.loads(line) for line in proc.stdout.splitlines()]
        holds = [json.loads(line) for line in log.read_text().splitlines()]
        reported = {
            (int(seq), digest)
            for r in records
            if r["exit"] == 0
            for seq, digest in WRITES.findall(r["output"])
        }
        final = ledger.read(root / "ledger.jsonl")
        added = {(e["seq"], e["hash"]) for e in final[len(before) :]}
        verify = subprocess.run(
            [sys.executable, "-m", "engineering_release.cli", "--root", str(root), "verify"],
            capture_output=True,
            text=True,
            cwd=PROJECT,
        )
    waits = sorted(h["waited_s"] for h in holds)
    by_exit: dict[str, dict[str, int]] = {}
    for r in records:
        counts = by_exit.setdefault(r["args"][0], {})
        counts[str(r["exit"])] = counts.get(str(r["exit"]), 0) + 1
    report = {
        "command": "python tests/lock_waits.py " + " ".join(argv_list(args)),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
        "clients": args.clients,
        "commands_per_client": args.commands,
        "wall_s": round(wall, 1),
        "lock_holds": len(holds),
        "longest_wait_s": round(waits[-1], 3) if waits else None,
        "median_wait_s": round(statistics.median(waits), 3) if waits else None,
        "p99_wait_s": round(waits[int(0.99 * (len(waits) - 1))], 3) if waits else None,
        "longest_hold_s": round(max(h["held_s"] for h in holds), 3) if holds else None,
        "exit_codes": by_exit,
        "crashed": [r["args"][0] for r in records if r["exception"]],
        "reported_writes": len(reported),
        "lost_writes": sorted(reported - added),
        "unreported_entries": sorted(added - reported),
        "verify_exit": verify.returncode,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    bad = report["lost_writes"] or report["unreported_entries"] or report["crashed"]
    return 1 if bad or verify.returncode != 0 else 0


def argv_list(args: argparse.Namespace) -> list[str]:
    return [f"--clients {args.clients}", f"--commands {args.commands}"]


if __name__ == "__main__":
    sys.exit(main())
