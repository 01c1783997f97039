"""Reports: the precision policy table and the capacity report, as JSON, text
tables and PNG plots.

The capacity report keeps three things apart, in three top-level sections:
  `observed_cpu`        what was measured on this CPU (client and server
                        sharing it): latencies, throughput, server CPU time.
  `simulated_queue`     what the queue model, fitted to the measured service
                        times, predicts for the same arrival schedules, and
                        how the prediction compares with the measurement.
  `edge_device_claims`  statements about an edge device that nothing here
                        measured; each is marked `measured: false` and carries
                        no time or throughput figure.
"""

from pathlib import Path
from typing import Any

import numpy as np

from deployment_audit import checkpoint, data, precision, queue_model, train
from deployment_audit.config import LoadConfig, ServeConfig

# --- PRECISION ---------------------------------------------------------------


def precision_report(workdir: str | Path) -> dict[str, Any]:
    """All policies on the held-out split of the stage-1 workdir, against f32.

    The split is read and checked (`metrics.json`: sample IDs of the data set)
    before the checkpoint is restored; a damaged part is a `CheckpointError`."""
    metrics_path = Path(workdir) / "metrics.json"
    split = train.read_json(metrics_path, "training metrics").get("split")
    if not isinstance(split, dict) or not {"train", "test"} <= set(split):
        raise checkpoint.CheckpointError(
            f"The training metrics `{metrics_path}` lack the `split` (`train` and `test` "
            f"sample IDs) of the run."
        )
    digits = data.load()
    ids = {}
    for name in ("test", "train"):
        try:
            ids[name] = np.asarray(split[name])
        except ValueError:
            ids[name] = np.asarray([None])  # Ragged: refused just below.
        if ids[name].ndim != 1 or ids[name].size == 0 or ids[name].dtype.kind not in "iu":
            raise checkpoint.CheckpointError(
                f"The `{name}` split of `{metrics_path}` must be a non-empty list of sample IDs."
            )
        if ids[name].min() < 0 or ids[name].max() >= len(digits.labels):
            raise checkpoint.CheckpointError(
                f"The `{name}` split of `{metrics_path}` holds sample IDs outside "
                f"0..{len(digits.labels) - 1} (from {ids[name].min()} to {ids[name].max()})."
            )
    params, spec, _golden = train.load_trained(workdir)
    mean, scale = data.spec_arrays(spec["preprocessing"])

    def normalized(sample_ids: np.ndarray) -> np.ndarray:
        return ((digits.images[sample_ids] - mean) * scale).astype(np.float32)

    test, train_ids = ids["test"], ids["train"]
    result = precision.compare(
        params, normalized(test), digits.labels[test], test, normalized(train_ids)
    )
    result["held_out"] = "the test split of the stage-1 workdir"
    result["calibration"] = "int8_w8a8 activation scales from the training split"
    return result


def precision_table(result: dict[str, Any]) -> str:
    head = (
        f"{'policy':<10} {'weights B':>9} {'scales B':>8} {'act B/ex':>8} {'acc B/ex':>8} "
        f"{'accuracy':>8} {'change':>8} {'max|dlogit|':>11} flipped (id: f32 -> policy)"
    )
    lines = [f"held-out examples: {result['count']}", head]
    for row in result["rows"]:
        flips = ", ".join(
            f"{f['id']}: {f['f32_prediction']}->{f['prediction']}" for f in row["flipped"]
        )
        lines.append(
            f"{row['policy']:<10} {row['weights_bytes']:>9} {row['scales_bytes']:>8} "
            f"{row['activations_bytes_per_example']:>8} {row['accumulator_bytes_per_example']:>8} "
            f"{row['accuracy']:>8.4f} {row['accuracy_change']:>+8.4f} "
            f"{row['max_abs_logit_error']:>11.4g} {flips or '-'}"
        )
    return "\n".join(lines)


def plot_precision(result: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [r["policy"] for r in rows]
    kinds = [
        ("weights_bytes", "weights"),
        ("scales_bytes", "scales"),
        ("activations_bytes_per_example", "activations / example"),
        ("accumulator_bytes_per_example", "accumulators / example"),
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.2
    for k, (key, label) in enumerate(kinds):
        ax1.bar(
            np.arange(len(rows)) + (k - 1.5) * width, [r[key] for r in rows], width, label=label
        )
    ax1.set_xticks(range(len(rows)), names)
    ax1.set_yscale("log")
    ax1.set_ylabel("bytes")
    ax1.set_title("Bytes by kind")
    ax1.legend(fontsize=8)
    ax2.bar(names, [r["max_abs_logit_error"] for r in rows], color="tab:red")
    for i, r in enumerate(rows):
        ax2.text(
            i, r["max_abs_logit_error"], f"{len(r['flipped'])} flipped", ha="center", va="bottom"
        )
    ax2.set_ylabel("max |logit - f32 logit|")
    ax2.set_title(f"Error vs f32 on {result['count']} held-out digits")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- CAPACITY ----------------------------------------------------------------

EDGE_CLAIMS = [
    {
        "claim": "An int8 edge accelerator could run the int8_w8a8 policy "
        "(int8 x int8 products, int32 accumulation).",
        "basis": "the precision table's arithmetic and byte counts; no such device was used",
    },
    {
        "claim": "The int8 weights and scales fit in a few tens of KiB of on-chip memory.",
        "basis": "byte accounting of the quantized arrays, not a measurement on a device",
    },
    {
        "claim": "Latency and throughput on an edge device.",
        "basis": "none: no edge device was available; CPU figures do not transfer",
    },
]


def capacity_report(
    runs: list[dict[str, Any]],
    config: LoadConfig,
    serve_config: ServeConfig,
    ready: dict[str, Any],
    identity: dict[str, Any],
    idle_cpu_fraction: float = 0.0,
) -> dict[str, Any]:
    """Fits the queue model to the measured runs and assembles the three sections.

    `idle_cpu_fraction`: the server's CPU seconds per second with no load (measured
    before the runs); it is subtracted before the per-request cost is fitted.
    """
    fit_run = runs[0]
    all_batches = [b for run in runs for b in run["batch_records"]]
    idle_cpu = idle_cpu_fraction * fit_run["server"]["wall_s"]
    model = {
        **queue_model.fit_batch_service(all_batches),
        "h_s": queue_model.fit_request_overhead(
            fit_run["server"]["cpu_s"] - idle_cpu,
            fit_run["batch_records"],
            fit_run["server"]["requests"],
        ),
        "idle_cpu_fraction": idle_cpu_fraction,
        "mean_rows": float(np.mean(config.request_sizes)),
    }
    capacity = queue_model.capacity(model, serve_config.max_batch_size)
    simulated, checks = [], []
    for run in runs:
        sim = queue_model.simulate(
            np.asarray(run["schedule"]["arrivals"]),
            np.asarray(run["schedule"]["rows"]),
            model,
            serve_config.max_batch_size,
            serve_config.batch_timeout_ms / 1000.0,
        )
        del sim["latencies_s"]
        simulated.append({"rate_rps": run["rate_rps"], **sim})
        measured_p50 = run["server"]["latency"]["p50_s"]
        checks.append(
            {
                "rate_rps": run["rate_rps"],
                "used_for_fit": run is fit_run,
                "server_p50_measured_s": measured_p50,
                "server_p50_simulated_s": sim["p50_s"],
                "server_p50_ratio": measured_p50 / max(sim["p50_s"], 1e-9),
                "cpu_per_request_measured_s": run["server"]["cpu_s"] / max(run["ok"], 1),
                "cpu_per_request_predicted_s": sim["cpu_per_request_s"]
                + idle_cpu_fraction * run["server"]["wall_s"] / max(run["ok"], 1),
                "predicted_utilization": run["offered_rps"] / capacity["capacity_rps"],
                "sustained_measured": run["sustained"],
            }
        )
    contradicted = [
        c["rate_rps"]
        for c in checks
        if c["predicted_utilization"] < 0.5 and not c["sustained_measured"]
    ]
    capacity_check = {
        "rule": "every rate below half the predicted capacity should be sustained",
        "contradicted_at_rps": contradicted,
        "consistent": not contradicted,
    }
    sustained = [r for r in runs if r["sustained"]]
    best = max(sustained, key=lambda r: r["rate_rps"]) if sustained else None
    observed_runs = [
        {k: v for k, v in run.items() if k not in ("schedule", "batch_records")} for run in runs
    ]
    return {
        "identity": identity,
        "workload": {
            "load": config.model_dump(mode="json"),
            "serve": serve_config.model_dump(mode="json"),
            "arrivals": "Poisson (exponential gaps), open loop, latency from the scheduled time",
        },
        "server_ready": {k: ready.get(k) for k in ("status", "sha256", "buckets", "self_test")},
        "observed_cpu": {
            "what": "measured on this CPU; the load generator shares the machine with the server",
            "runs": observed_runs,
            "highest_sustained_rps": best["rate_rps"] if best else None,
            "p99_over_p50_at_highest_sustained": (
                best["latency"]["p99_s"] / best["latency"]["p50_s"] if best else None
            ),
        },
        "simulated_queue": {
            "what": "a discrete-event model fitted to the measured service times; predictions, "
            "not measurements",
            "model": model,
            "fitted_from": f"batch times of every run; per-request overhead from the "
            f"{fit_run['rate_rps']:g} req/s run only",
            "capacity": capacity,
            "capacity_check": capacity_check,
            "runs": simulated,
            "checks": checks,
        },
        "edge_device_claims": {
            "what": "unmeasured: no edge device was used; nothing here is a measured figure",
            "claims": [{**c, "measured": False, "latency_s": None} for c in EDGE_CLAIMS],
        },
    }


def load_table(result: dict[str, Any]) -> str:
    lines = [
        "OBSERVED on this CPU (client and server share it)",
        f"{'rate':>6} {'offered':>8} {'ok':>9} {'thru/s':>7} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'srv cpu':>7} {'cli cpu':>7} {'batch':>6} sustained",
    ]
    for run in result["observed_cpu"]["runs"]:
        lat = run["latency"]
        lines.append(
            f"{run['rate_rps']:>6g} {run['offered_rps']:>8.1f} {run['ok']:>4}/{run['requests']:<4} "
            f"{run['throughput_rps']:>7.1f} {1e3 * lat['p50_s']:>7.2f} {1e3 * lat['p95_s']:>7.2f} "
            f"{1e3 * lat['p99_s']:>7.2f} {run['server']['cpu_busy_fraction']:>7.2f} "
            f"{run['client_cpu_busy_fraction']:>7.2f} "
            f"{run['server']['mean_batch_rows']:>6.1f} {run['sustained']}"
        )
    obs = result["observed_cpu"]
    if obs["highest_sustained_rps"] is not None:
        lines.append(
            f"highest sustained rate {obs['highest_sustained_rps']:g} req/s: "
            f"p99/p50 = {obs['p99_over_p50_at_highest_sustained']:.2f} (target <= 5)"
        )
    sim = result["simulated_queue"]
    cap = sim["capacity"]
    m = sim["model"]
    lines += [
        "",
        "SIMULATED queue model (fitted, a prediction)",
        f"batch service {1e3 * m['a_s']:.3f} ms + {1e6 * m['c_s_per_row']:.2f} us/row; "
        f"per-request loop CPU {1e3 * m['h_s']:.3f} ms; idle CPU {m['idle_cpu_fraction']:.3f} s/s; "
        f"capacity {cap['capacity_rps']:.0f} req/s "
        f"({cap['bottleneck']})",
        f"{'rate':>6} {'sim p50 ms':>10} {'srv p50 ms':>10} {'ratio':>6} {'cpu/req pred ms':>15} "
        f"{'meas ms':>8} {'util':>5}",
    ]
    for check in sim["checks"]:
        lines.append(
            f"{check['rate_rps']:>6g} {1e3 * check['server_p50_simulated_s']:>10.3f} "
            f"{1e3 * check['server_p50_measured_s']:>10.3f} {check['server_p50_ratio']:>6.2f} "
            f"{1e3 * check['cpu_per_request_predicted_s']:>15.3f} "
            f"{1e3 * check['cpu_per_request_measured_s']:>8.3f} "
            f"{check['predicted_utilization']:>5.2f}"
        )
    check = sim["capacity_check"]
    lines.append(
        f"capacity check ({check['rule']}): "
        + (
            "consistent"
            if check["consistent"]
            else f"contradicted at {check['contradicted_at_rps']} req/s"
        )
    )
    lines += ["", "EDGE DEVICE claims: UNMEASURED"]
    lines += [f"- {c['claim']} ({c['basis']})" for c in result["edge_device_claims"]["claims"]]
    return "\n".join(lines)


def plot_load(result: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["observed_cpu"]["runs"]
    sims = result["simulated_queue"]["runs"]
    rates = [r["rate_rps"] for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for q, style in (("p50_s", "o-"), ("p99_s", "s-")):
        ax1.plot(rates, [1e3 * r["latency"][q] for r in runs], style, label=f"observed {q[:3]}")
        ax1.plot(
            rates,
            [1e3 * s[q] for s in sims],
            style.replace("-", "--"),
            alpha=0.6,
            label=f"simulated server {q[:3]}",
        )
    ax1.set_xlabel("offered rate (req/s)")
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.set_title("Latency: observed (client) vs simulated (server)")
    ax1.legend(fontsize=8)
    ax2.plot(rates, [r["offered_rps"] for r in runs], "k:", label="offered")
    ax2.plot(rates, [r["throughput_rps"] for r in runs], "o-", label="observed throughput")
    ax2.axhline(
        result["simulated_queue"]["capacity"]["capacity_rps"],
        color="tab:red",
        ls="--",
        label="simulated capacity",
    )
    ax2.set_xlabel("offered rate (req/s)")
    ax2.set_ylabel("req/s")
    ax2.set_title("Throughput")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
