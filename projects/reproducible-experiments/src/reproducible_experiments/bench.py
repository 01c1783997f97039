"""`reproducible-experiments bench`: what tracking costs, measured side by side.

Two questions, each with an A/A control (the same path timed twice) to show
the noise of the machine:

1. Metric logging: `values` metric values written with `log_batch` (1000 per
   call at most) vs one `log_metric` call per value (`batched_vs_per_metric`)
   and vs one `log_batch` per training step of `STEP_METRICS` values, what
   `mlflow.log_metrics(dict, step)` once per epoch sends
   (`batched_vs_per_step`), into a fresh SQLite store. Every call writes
   values at steps the run has not seen yet, as training does.
2. Tracking overhead on training: `train_and_evaluate(config)` untracked vs
   the same training with every epoch's metrics going to MLflow through
   `MetricBuffer` (batches of up to 300 values), timed until the store holds
   every value (`untracked_vs_tracked`: 1.0 means free, 0.98 means tracking
   added 2%); and the same with the buffer sending every 30 or 90 values in
   the background (`untracked_vs_tracked_flush_30`, `_flush_90`). The run's
   set-up and close (identities, params, artifacts, end state) happen once
   per run, outside the loop; they are timed and reported apart.

A ratio is the median of its per-round ratios: for the logging ratios round
r's baseline time over round r's time of `log_batch` (above 1: batching is
faster), for the training ratios round r's untracked time over round r's
tracked time (1.0: tracking is free; 0.98: it added 2%). `ratio_details`
records per ratio its baseline, the per-round ratios with min, median and
max, and the A/A control of the first-named path (timed twice in every round). Every path runs
in this one process: training on JAX's one CPU device, MLflow's writes on the
calling thread (the flush variants add MLflow's one background writer).

Compilation is timed apart: the first call compiles `train_epoch` and
`eval_split`; later calls must reuse the executables (the compile cache size
is checked before and after). Each training call ends when its metrics are
on the host (`jax.device_get` inside), so no timer stops early. Rounds are
interleaved (A B A' ... per repetition); each path reports median and p90.
"""

import gc
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric

from reproducible_experiments import identity, plots, record, tracking, train
from reproducible_experiments.bench_stats import per_round, ratio_detail
from reproducible_experiments.config import Config

# Metric values a training step logs at once (the default run: loss, train and
# validation accuracy per epoch).
STEP_METRICS = 3
# `MetricBuffer.flush_every` of the flush variants of the tracked training.
FLUSH_VARIANTS = (30, 90)


def _p90(values: list[float]) -> float:
    return float(np.quantile(values, 0.9))


def _summary(times: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(times), "p90_s": _p90(times), "n": len(times)}


def _interleaved(paths: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Runs each path once per repetition, in turn; each returns its own seconds.

    A garbage collection runs before every call, outside its timer, so no path
    pays for the objects another one left behind."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(reps):
        for name, run in paths.items():
            gc.collect()
            times[name].append(run())
    return times


def bench(
    out: str | Path,
    *,
    config: Config | None = None,
    reps: int = 20,
    values: int = 200,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs both benchmarks, writes `out` (JSON) and a PNG beside it; returns the report."""
    config = Config.default() if config is None else config
    say = progress or (lambda _msg: None)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="re-bench-") as tmp:
        client = tracking.connect(Path(tmp) / "bench.db")
        exp_id = tracking.experiment_id(client, "bench")

        # 1. METRIC LOGGING
        # Every timed call writes `values` rows the store has never seen (new steps):
        # logging the same (key, step, timestamp, value) again makes MLflow's insert
        # fail on the primary key and fall back to a look-up, which is not the cost
        # of logging. The metrics are built before the timer starts.
        log_run = client.create_run(exp_id, run_name="logging").info.run_id
        next_step = iter(range(0, 1 << 62, values))

        def new_metrics() -> list[Metric]:
            first, stamp = next(next_step), int(time.time() * 1000)
            return [Metric("value", float(i % 997), stamp, first + i) for i in range(values)]

        def batched() -> float:
            batch = new_metrics()
            start = time.perf_counter()
            for i in range(0, values, tracking.METRICS_PER_CALL):
                client.log_batch(log_run, metrics=batch[i : i + tracking.METRICS_PER_CALL])
            return time.perf_counter() - start

        def per_metric() -> float:
            batch = new_metrics()
            start = time.perf_counter()
            for m in batch:
                client.log_metric(log_run, m.key, m.value, timestamp=m.timestamp, step=m.step)
            return time.perf_counter() - start

        def per_step() -> float:
            batch = new_metrics()
            start = time.perf_counter()
            for i in range(0, values, STEP_METRICS):
                client.log_batch(log_run, metrics=batch[i : i + STEP_METRICS])
            return time.perf_counter() - start

        say(f"metric logging: {values} values, {reps} interleaved repetitions")
        batched(), per_metric(), per_step()  # Warm-up: first SQL statements, connection pool.
        log_times = _interleaved(
            {
                "log/batched": batched,
                "log/per_metric": per_metric,
                "log/per_step": per_step,
                "log/batched_aa": batched,
            },
            reps,
        )
        client.set_terminated(log_run)

        # 2. TRACKING OVERHEAD ON TRAINING
        cache_before = None
        start = time.perf_counter()
        train.train_and_evaluate(config)
        first_call_s = time.perf_counter() - start
        cache_before = (train.train_epoch._cache_size(), train.eval_split._cache_size())
        setup_times: list[float] = []

        def untracked() -> float:
            return _train_time(lambda: train.train_and_evaluate(config))

        def tracked(flush_every: int | None = None) -> float:
            start = time.perf_counter()
            with tracking.TrackedRun(client, exp_id, "bench tracked") as run:
                setup_times.append(time.perf_counter() - start)
                if flush_every is not None:
                    run.metrics = tracking.MetricBuffer(client, run.run_id, flush_every)

                def go() -> None:
                    train.train_and_evaluate(
                        config,
                        on_epoch=lambda r: run.metrics.log(
                            {k: v for k, v in r.items() if k != "epoch"}, int(r["epoch"])
                        ),
                    )
                    run.metrics.flush()

                return _train_time(go)

        say(f"training: {config.num_epochs} epochs, {reps} interleaved repetitions")
        train_times = _interleaved(
            {
                "train/untracked": untracked,
                "train/tracked": tracked,
                **{f"train/tracked_flush_{n}": (lambda n=n: tracked(n)) for n in FLUSH_VARIANTS},
                "train/untracked_aa": untracked,
            },
            reps,
        )
        cache_after = (train.train_epoch._cache_size(), train.eval_split._cache_size())

        # One full tracked run (identities, params, artifacts) for its set-up cost.
        start = time.perf_counter()
        record.run_tracked(client, exp_id, config, run_name="bench full run")
        full_run_s = time.perf_counter() - start

    measurements = {name: _summary(t) for name, t in {**log_times, **train_times}.items()}
    measurements["train/untracked"]["first_call_s"] = first_call_s
    med = {name: m["median_s"] for name, m in measurements.items()}
    all_times = {**log_times, **train_times}
    details = _details(all_times, values)
    ratios = {name: d["median"] for name, d in details.items()}
    ratios["aa_batched"] = details["batched_vs_per_metric"]["aa"]
    ratios["aa_untracked"] = details["untracked_vs_tracked"]["aa"]
    ident = identity.runtime_identity()
    code = identity.code_identity()
    report = {
        "identity": {
            "jax": ident["runtime.jax"],
            "jaxlib": ident["runtime.jaxlib"],
            "backend": ident["runtime.backend"],
            "devices": int(ident["runtime.device_count"]),
            "device_kind": ident["runtime.device_kind"],
            "xla_flags": ident["runtime.xla_flags"],
            "commit": code["code.git_commit"],
            "source_sha256": code["code.source_sha256"],
            "config_sha256": config.sha256(),
            "mlflow_store": "sqlite (temporary file)",
        },
        "config": config.model_dump(mode="json"),
        "values_logged": values,
        "measurements": measurements,
        "ratios": ratios,
        "ratio_details": details,
        "extra": {
            "recompiled_during_timing": cache_before != cache_after,
            "run_setup_median_s": statistics.median(setup_times),
            "full_tracked_run_s": full_run_s,
            "tracking_overhead_fraction": med["train/tracked"] / med["train/untracked"] - 1.0,
            **{
                f"tracking_overhead_fraction_flush_{n}": med[f"train/tracked_flush_{n}"]
                / med["train/untracked"]
                - 1.0
                for n in FLUSH_VARIANTS
            },
        },
        "definitions": {
            "batched_vs_per_metric": "median over rounds of (per-metric calls / log_batch); "
            "> 1: batched is faster",
            "untracked_vs_tracked": "median over rounds of (untracked / tracked training); "
            "1 - it is the share of time tracking adds",
        },
    }
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    _plot(report, out.with_suffix(".png"))
    report["report_sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    return report


def _details(times: dict[str, list[float]], values: int) -> dict[str, dict[str, Any]]:
    """`ratio_detail` of every ratio from the per-round times of its paths."""
    aa_log = per_round(times["log/batched_aa"], times["log/batched"])
    aa_train = per_round(times["train/untracked_aa"], times["train/untracked"])
    details = {
        "batched_vs_per_metric": ratio_detail(
            f"one MlflowClient.log_metric call per value ({values} calls)",
            per_round(times["log/per_metric"], times["log/batched"]),
            aa_log,
            "log/batched",
        ),
        "batched_vs_per_step": ratio_detail(
            f"one log_batch per training step of {STEP_METRICS} values, what "
            "mlflow.log_metrics(dict, step) sends once per epoch",
            per_round(times["log/per_step"], times["log/batched"]),
            aa_log,
            "log/batched",
        ),
        "untracked_vs_tracked": ratio_detail(
            "the same training with every epoch's metrics sent through MetricBuffer "
            "(every 300 values) and flushed before the clock stops",
            per_round(times["train/untracked"], times["train/tracked"]),
            aa_train,
            "train/untracked",
        ),
    }
    for n in FLUSH_VARIANTS:
        details[f"untracked_vs_tracked_flush_{n}"] = ratio_detail(
            f"the same tracked training with MetricBuffer sending every {n} values in the "
            "background (MLflow's writer thread) and flushed before the clock stops",
            per_round(times["train/untracked"], times[f"train/tracked_flush_{n}"]),
            aa_train,
            "train/untracked",
        )
    return details


def _train_time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    m = report["measurements"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
    for ax, prefix, title in (
        (axes[0], "log/", f"logging {report['values_logged']} metric values"),
        (axes[1], "train/", "training, untracked vs tracked"),
    ):
        names = [n for n in m if n.startswith(prefix)]
        medians = [m[n]["median_s"] for n in names]
        p90s = [m[n]["p90_s"] - m[n]["median_s"] for n in names]
        ax.barh(names, medians, xerr=[[0] * len(names), p90s], color="C0")
        ax.set(xlabel="seconds (bar: median, whisker: p90)", title=title)
    ratios = ", ".join(f"{k} {v:.3g}" for k, v in report["ratios"].items())
    fig.suptitle(ratios, fontsize="small")
    fig.savefig(path, dpi=110)
    plots.close(fig)
