"""`engineering-release bench`: requests during switches vs steady state, and `verify` time.

Set-up (not timed): a fresh state in a temporary directory with two tiny
models stored, evaluated, approved and the first released, and a serving
host in a child process (`engineering-release serve`), so the load
generator in this process does not share an interpreter with the router.
The host runs every candidate server in a process of its own
(`engineering_release.candidate`), as it always does.

Serving: `clients` threads send one-row requests for the whole run. Windows
alternate, interleaved: a steady window (no release, `window_s` seconds),
then a switch window (one release or rollback, from its start to its return
plus `window_s / 4`), `switches` times. The releases run in an operator
process of their own (started and warmed once, before the windows), as an
operator's `engineering-release release` would: the load generator's
latencies count the serving path, not the release command's Python work in
their own interpreter. Reported: failed requests (non-200 or transport
errors) in each kind of window, p50/p99 latency, and
`steady_vs_switch_p99 = p99(steady) / p99(switch)` (1 means a switch costs
nothing at p99; the goal, >= 0.8, means a switch adds at most a quarter to
it). Its baseline is the steady state of the same host in the same run. The
A/A control `steady_vs_steady_p99` compares the odd and even steady windows:
its distance from 1 is the noise of the measurement. `ratio_details` gives,
per ratio, the baseline, the A/A, and the per-round ratios with their min,
median and max (a round: one steady window and the switch window after it;
for the A/A, two consecutive steady windows).

Verify: a log of `verify_entries` entries (approvals and alternating
releases and rollbacks, written directly) and its registry; `release.verify`
timed 20 times after a first call (which pays for loading the held-out set
and compiling nothing else).
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engineering_release import evaluation, ledger, registry, release, signing, train
from engineering_release.config import TrainConfig
from engineering_release.loadgen import LoadGenerator, p99


def _identity(config: TrainConfig) -> dict:
    import jax

    code = evaluation.code_identity()
    return {
        "jax": jax.__version__,
        "jaxlib": evaluation.runtime_identity()["jaxlib"],
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "commit": code["commit"],
        "source_sha256": code["source_sha256"],
        "config_sha256": config.sha256(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def _setup(root: Path, config: TrainConfig, echo) -> tuple[release.State, list[str]]:
    state = release.State(root)
    models = []
    for seed in (0, 1):
        trained = train.train(config.model_copy(update={"seed": seed}))
        with tempfile.TemporaryDirectory() as tmp:
            train.write_model(trained, Path(tmp) / "m")
            models.append(release.register(state, Path(tmp) / "m")[0])
    _, pem = signing.generate_key(state.keys, "bench")
    for model_id in models:
        evaluation_id, _ = release.evaluate(state, model_id)
        release.approve(state, model_id, evaluation_id, pem, "bench")
    release.release(state, models[0])
    echo(f"set-up: models {models[0][:12]} and {models[1][:12]}, the first released")
    return state, models


def _start_host(root: Path, candidate_nice: int, echo) -> subprocess.Popen:
    log = root.parent / "host.log"  # A file, not a pipe: nobody reads while it runs.
    command = [sys.executable, "-m", "engineering_release.cli", "--root", str(root), "serve"]
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*command, "--candidate-nice", str(candidate_nice)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + 300
    from engineering_release import serve

    while time.monotonic() < deadline:
        client = serve.find_host(root / "host.json")
        if client is not None:
            try:
                if client.state()["serving"]:
                    echo(f"serving host on port {client.port} (pid {proc.pid})")
                    return proc
            finally:
                client.close()
        if proc.poll() is not None:
            raise RuntimeError(f"The serving host exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("The serving host did not start serving within 300 s.")


BASELINE_STEADY = (
    "The same host, clients and model in steady state: the steady windows interleaved "
    "with the switch windows in the same run (no release running)."
)
GOAL_STEADY_VS_SWITCH_P99 = 0.8


def _details(baseline: str, value: float, aa: float, rounds: list[float], round_is: str) -> dict:
    """A ratio's record: its baseline (a sentence), its A/A control, and the spread
    of the per-round ratio (`min <= median <= max`; NaN when no round had samples)."""
    spread = (
        {"min": min(rounds), "median": statistics.median(rounds), "max": max(rounds)}
        if rounds
        else {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    )
    return {
        "baseline": baseline,
        "value": value,
        "aa": aa,
        "round_is": round_is,
        "rounds": rounds,
        **spread,
    }


def _stats(latencies: list[float]) -> dict:
    if not latencies:
        return {"n": 0}
    a = np.asarray(latencies)
    return {
        "n": int(a.size),
        "median_s": float(np.median(a)),
        "p90_s": float(np.percentile(a, 90)),
        "p99_s": p99(latencies),
        "max_s": float(a.max()),
    }


def _operator(root: str, conn) -> None:
    """The release operator, in a process of its own: a release or rollback per
    request on `conn`, answered with its outcome, until `None` arrives. Like an
    operator's `engineering-release release`, it shares no interpreter with the
    load generator, so its Python work never holds the clients' lock."""
    state = release.State(Path(root))
    release.verify(state)  # Warm: imports and the evaluation's programs, before any window.
    conn.send("ready")
    while (request := conn.recv()) is not None:
        kind, model_id = request
        try:
            outcome = (
                release.rollback(state) if kind == "rollback" else release.release(state, model_id)
            )
            conn.send(
                {
                    "kind": outcome.kind,
                    "model_id": outcome.model_id,
                    "timings": outcome.timings,
                    "startup": (outcome.readiness or {}).get("startup", {}),
                }
            )
        except Exception as err:  # noqa: BLE001 - reported to the bench, which stops.
            conn.send({"error": f"{type(err).__name__}: {err}"})


def _serving(
    state: release.State, models: list[str], switches: int, clients: int, window_s: float, echo
) -> dict:
    import multiprocessing

    from engineering_release import serve

    host = serve.find_host(state.host_file)
    port = host.port
    host.close()
    ours, theirs = multiprocessing.Pipe()
    operator = multiprocessing.get_context("spawn").Process(
        target=_operator, args=(str(state.root), theirs), daemon=True
    )
    operator.start()
    if not ours.poll(300) or ours.recv() != "ready":
        raise RuntimeError("The release operator process did not start within 300 s.")
    load = LoadGenerator(
        port, clients=clients, max_requests=10**6, max_seconds=60 + switches * (window_s * 2 + 30)
    ).start()
    load.wait_for(50)
    steady, switch, ops = [], [], []
    try:
        for i in range(switches):
            serving = ledger.serving_model(state.entries())
            if ledger.previous_model(state.entries()) and i % 2 == 1:
                request = ("rollback", None)
            else:
                request = ("release", models[1] if serving == models[0] else models[0])
            t0 = time.perf_counter()
            time.sleep(window_s)
            t1 = time.perf_counter()
            steady.append((t0, t1))
            ours.send(request)
            outcome = ours.recv()
            t2 = time.perf_counter()
            if "error" in outcome:
                raise RuntimeError(f"The {request[0]} failed: {outcome['error']}")
            time.sleep(window_s / 4)  # The tail of the switch: the old backend drains and stops.
            t3 = time.perf_counter()
            switch.append((t1, t3))
            ops.append(
                {
                    "kind": outcome["kind"],
                    "model_id": outcome["model_id"][:12],
                    "seconds": t2 - t1,
                    **{k: round(v, 4) for k, v in outcome["timings"].items()},
                    "candidate_startup": {
                        k: round(v, 4) if isinstance(v, float) else v
                        for k, v in outcome["startup"].items()
                    },
                }
            )
            echo(
                f"switch {i + 1}/{switches}: {outcome['kind']} to {outcome['model_id'][:12]} "
                f"in {t2 - t1:.2f} s"
            )
    finally:
        ours.send(None)
        operator.join(60)
    samples = load.stop()

    def window(spans: list[tuple[float, float]]) -> list:
        return [s for s in samples if any(a <= s.start and s.end <= b for a, b in spans)]

    def ok(group: list) -> list[float]:
        return [s.end - s.start for s in group if s.status == 200]

    steady_s, switch_s = window(steady), window(switch)
    odd, even = window(steady[0::2]), window(steady[1::2])
    lat = {
        name: ok(group)
        for name, group in (
            ("steady", steady_s),
            ("switch", switch_s),
            ("odd", odd),
            ("even", even),
        )
    }
    # Per round: the steady window against the switch window that follows it; the
    # A/A pairs two consecutive steady windows (rounds 1-2, 3-4, ...).
    per_steady = [ok(window([w])) for w in steady]
    per_switch = [ok(window([w])) for w in switch]
    rounds = [p99(a) / p99(b) for a, b in zip(per_steady, per_switch, strict=True) if a and b]
    aa_rounds = [
        p99(a) / p99(b) for a, b in zip(per_steady[0::2], per_steady[1::2], strict=False) if a and b
    ]
    ratios = {
        "steady_vs_switch_p99": p99(lat["steady"]) / p99(lat["switch"]),
        "steady_vs_steady_p99": p99(lat["odd"]) / p99(lat["even"]),
    }
    details = {
        "steady_vs_switch_p99": _details(
            BASELINE_STEADY,
            ratios["steady_vs_switch_p99"],
            ratios["steady_vs_steady_p99"],
            rounds,
            "p99 of one steady window / p99 of the switch window after it",
        ),
        "steady_vs_steady_p99": _details(
            "A/A: the odd steady windows against the even ones (no release in either).",
            ratios["steady_vs_steady_p99"],
            ratios["steady_vs_steady_p99"],
            aa_rounds,
            "p99 of steady window 2j+1 / p99 of steady window 2j+2",
        ),
    }
    return {
        "failed": {
            "steady": sum(s.status != 200 for s in steady_s),
            "switch": sum(s.status != 200 for s in switch_s),
            "total": sum(s.status != 200 for s in samples),
        },
        "requests": len(samples),
        "measurements": {f"requests/{k}": _stats(v) for k, v in lat.items()},
        "ratios": ratios,
        "ratio_details": details,
        "operations": ops,
    }


def _long_log(root: Path, models: list[str], entries: int, config: TrainConfig) -> release.State:
    """A state whose log holds `entries` entries: two approvals, then alternating
    releases and rollbacks (written directly, without gates: only verify is timed)."""
    state = release.State(root)
    for seed, model_id in zip((0, 1), models, strict=True):
        trained = train.train(config.model_copy(update={"seed": seed}))
        with tempfile.TemporaryDirectory() as tmp:
            train.write_model(trained, Path(tmp) / "m")
            assert release.register(state, Path(tmp) / "m")[0] == model_id
    _, pem = signing.generate_key(state.keys, "bench")
    approvals = [
        release.approve(state, m, release.evaluate(state, m)[0], pem, "bench") for m in models
    ]
    rows = ledger.read(state.ledger_path)
    releases = {}
    while len(rows) < entries:
        i = len(rows)
        model_id = models[i % 2]
        if model_id in releases:
            body = ledger.rollback_body(rows, releases[model_id])
            kind = "rollback"
        else:
            body = ledger.release_body(rows, approvals[i % 2])
            kind = "release"
        rows.append(ledger.make_entry(rows, kind, body))
        releases[model_id] = rows[-1]
    state.ledger_path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in rows))
    registry.sync(state.client, rows)
    return state


def _verify_timing(state: release.State, reps: int = 20) -> dict:
    start = time.perf_counter()
    problems = release.verify(state)
    first = time.perf_counter() - start
    if problems:
        raise RuntimeError(f"The benchmark's own log does not verify: {problems}")
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        release.verify(state)
        times.append(time.perf_counter() - start)
    return {
        "first_call_s": first,
        "median_s": statistics.median(times),
        "p90_s": float(np.percentile(times, 90)),
        "min_s": min(times),
        "max_s": max(times),
        "n": reps,
        "entries": len(state.entries()),
    }


def run_bench(
    out: Path,
    *,
    switches: int = 10,
    clients: int = 4,
    verify_entries: int = 100,
    window_s: float = 2.0,
    candidate_nice: int = 0,
    echo: Callable[[str], None] = print,
) -> dict:
    config = TrainConfig.tiny()
    identity = _identity(config)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "release"
        state, models = _setup(root, config, echo)
        host = _start_host(root, candidate_nice, echo)
        try:
            serving = _serving(state, models, switches, clients, window_s, echo)
        finally:
            host.terminate()
            host.wait(60)
        echo(f"verify: building a {verify_entries}-entry log ...")
        long_state = _long_log(Path(tmp) / "long", models, verify_entries, config)
        verify = _verify_timing(long_state)
    identity["loadavg_at_end"] = list(os.getloadavg())
    ratios = serving.pop("ratios")
    goal = GOAL_STEADY_VS_SWITCH_P99
    verdicts = {
        "failed_requests": f"{serving['failed']['total']} failed of {serving['requests']} "
        f"({'goal met' if serving['failed']['total'] == 0 else 'GOAL MISSED'})",
        "steady_vs_switch_p99": f"{ratios['steady_vs_switch_p99']:.3f} vs goal >= {goal}: "
        f"{'met' if ratios['steady_vs_switch_p99'] >= goal else 'MISSED'}",
        "verify_100_entries": f"median {verify['median_s']:.3f} s vs goal < 1 s: "
        f"{'met' if verify['median_s'] < 1.0 else 'MISSED'}",
    }
    report = {
        "identity": identity,
        "settings": {
            "switches": switches,
            "clients": clients,
            "window_s": window_s,
            "verify_entries": verify_entries,
            "candidates": "one process per candidate server (engineering_release.candidate)",
            "candidate_nice": candidate_nice,
        },
        "measurements": {**serving.pop("measurements"), "verify/log": verify},
        "ratios": ratios,
        "ratio_details": serving.pop("ratio_details"),
        "serving": serving,
        "verdicts": verdicts,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    _plot(report, out.with_suffix(".png"))
    return report


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = report["measurements"]
    names = ["requests/steady", "requests/switch"]
    fig, ax = plt.subplots(figsize=(5, 3))
    for i, name in enumerate(names):
        if m[name].get("n"):
            ax.bar(
                [i - 0.2, i + 0.2],
                [m[name]["median_s"] * 1e3, m[name]["p99_s"] * 1e3],
                width=0.35,
                color=["tab:blue", "tab:orange"],
            )
    ax.set_xticks(range(len(names)), ["steady", "during a switch"])
    ax.set_ylabel("latency (ms): median, p99")
    ax.set_title(
        f"failed: {report['serving']['failed']['total']}, "
        f"steady_vs_switch_p99 {report['ratios']['steady_vs_switch_p99']:.2f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
