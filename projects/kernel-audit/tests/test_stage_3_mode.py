"""Stage 3: the bench report's claims follow the execution mode the kernels ran in.

`run_bench` is run end to end at the `tiny` size with its timer, its ceilings and
XLA's cost analysis replaced by constructed figures (no kernel runs, so this holds
on any machine), in both modes and under a `cpu` and a `tpu` backend as the code
sees it (`jax.default_backend` and the device kind patched: a CPU, a TPU that is
not a v5e, and a TPU v5e, the one chip whose published figures the report adds as a
second roofline). Whether the report speaks of kernel speed must follow the mode
only, never the backend: the README's "Interpret mode" and
"Compiled mode" paragraphs, read literally, give the expected report, and every
ratio, roofline figure and blocking verdict is worked out here from the
constructed medians.
"""

import jax
import pytest

from kernel_audit import bench, bench_settings, reference

# The `tiny` size's four settings, known by the operand shape and dtype.
MM32, MM16 = "matmul_64x256x128_float32_highest", "matmul_64x256x128_bfloat16"
LN32, LN16 = "layer_norm_32x256_float32", "layer_norm_32x256_bfloat16"
K1, K2, UNFUSED = "pallas_32x128x128", "pallas_64x128x256", "pallas_unfused_32x128x128"

# Constructed medians (seconds) per setting and path. float32 matmul: the best kernel 2x
# faster than XLA; bfloat16 matmul: the best 1.25x slower; float32 layer norm: the best
# row block 4x faster; bfloat16 layer norm (its 8-row block refused): 2x slower.
MEDIANS = {
    MM32: {"xla": 1.0e-3, "xla_aa": 1.25e-3, K1: 0.5e-3, K2: 0.8e-3, UNFUSED: 0.9e-3},
    MM16: {"xla": 1.0e-3, "xla_aa": 0.8e-3, K1: 2.0e-3, K2: 1.25e-3, UNFUSED: 2.5e-3},
    LN32: {"xla": 1.0e-3, "xla_aa": 1.0e-3, "pallas_rows8": 0.5e-3, "pallas_rows16": 0.25e-3},
    LN16: {"xla": 1.0e-3, "xla_aa": 0.5e-3, "pallas_rows16": 2.0e-3},
}
SETTING_OF = {
    ((64, 256), "float32"): MM32,
    ((64, 256), "bfloat16"): MM16,
    ((32, 256), "float32"): LN32,
    ((32, 256), "bfloat16"): LN16,
}
CEILINGS = {"flops_per_s": 4e12, "bytes_per_s": 1e12}
# The TPU v5e's published figures (Google's chip specification): 197 TFLOP/s bfloat16
# peak, 819 GB/s HBM. The README's rule: the report places every run against them too
# exactly when the device is a TPU v5e (device kind `TPU v5 lite`), and otherwise says
# they do not apply.
V5E = {"flops_per_s": 197e12, "bytes_per_s": 819e9}
# backend case -> (what `jax.default_backend` says, the device kind, nominal figures).
DEVICES = {
    "cpu": ("cpu", "cpu", None),
    "tpu": ("tpu", "TPU v4", None),
    "tpu_v5e": ("tpu", "TPU v5 lite", V5E),
}
XLA_COST = {"flops": 3e5, "bytes_accessed": 1e5}  # What every XLA path's cost analysis says.

# The matmul tiling as the README describes it, (M, K, N) = (64, 256, 128): each of the
# ceil(64/bm) x ceil(128/bn) programs reads a (bm, 256) strip of x and a (256, bn) strip
# of w over its K steps and bn bias entries; the (64, 128) output is written once.
# FLOPs 2MNK + 2MN. Per element: 4 bytes in float32, 2 in bfloat16.
MM_FLOPS = 2.0 * 64 * 128 * 256 + 2.0 * 64 * 128
MM_ELEMENTS = {
    K1: 64 * 256 * 1 + 256 * 128 * 2 + 128 * 2 + 64 * 128,  # 2 x 1 programs, 2 K steps
    K2: 64 * 256 * 1 + 256 * 128 * 1 + 128 * 1 + 64 * 128,  # 1 x 1 program, 1 K step
}
# The layer norm: x read and y written once, gamma and beta once, two float32 statistics
# per row; 8 operations per entry.
LN_FLOPS = 8.0 * 32 * 256
LN_BYTES = {"float32": 4.0 * (2 * 32 * 256 + 2 * 256) + 8 * 32}
LN_BYTES["bfloat16"] = 2.0 * (2 * 32 * 256 + 2 * 256) + 8 * 32


def _scripted_measure(paths, orders, log, failed=None):
    """Stands in for `bench_timing.measure`: every round of a path takes its constructed
    median; its output is the `jax.numpy` reference's (so the kernels never run, and
    none fails)."""
    del log, failed
    results = {}
    for path in paths:
        x, second, third = path.args
        setting = SETTING_OF[(tuple(x.shape), x.dtype.name)]
        median = MEDIANS[setting][path.name]
        if second.ndim == 2:
            path.output = reference.matmul_bias_act_jnp(x, second, third, "gelu", "highest")
        else:
            path.output = reference.layer_norm_jnp(x, second, third)
        path.compiled = None
        results[path.name] = {
            "execution_mode": path.execution_mode,
            "lower_s": 1e-3,
            "compile_s": 1e-3,
            "first_call_s": median,
            "median_s": median,
            "p90_s": median,
            "min_s": median,
            "max_s": median,
            "n": len(orders),
            "times_s": [median] * len(orders),
            "compiles_during_timed_rounds": 0,
        }
    return results


def _same(got, expected, where="") -> None:
    """Equal structure, numbers to 1e-12 relative."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), (where, got, expected)
        for key in expected:
            _same(got[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got, expected)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _same(g, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


def _against(peaks, flops, bytes_, median):
    """One placement under `peaks` (FLOP/s and bytes/s): attainable = min(peak,
    intensity x bandwidth), compute-limited where the peak is the smaller (ties too)."""
    intensity = flops / bytes_
    attainable = min(peaks["flops_per_s"], intensity * peaks["bytes_per_s"])
    return {
        "flops_per_s": peaks["flops_per_s"],
        "bytes_per_s": peaks["bytes_per_s"],
        "attainable_flops_per_s": attainable,
        "limited_by": "compute"
        if peaks["flops_per_s"] <= intensity * peaks["bytes_per_s"]
        else "memory bandwidth",
        "fraction_of_roofline": flops / median / attainable,
        "fraction_of_flops_ceiling": flops / median / peaks["flops_per_s"],
        "fraction_of_bytes_ceiling": bytes_ / median / peaks["bytes_per_s"],
    }


def _placed(mode, flops, bytes_, median, source, nominal=None):
    """A roofline entry placed against the measured ceilings and, on a TPU v5e
    (`nominal` given), against the chip's published figures as well."""
    entry = {
        "execution_mode": mode,
        "flops": flops,
        "bytes": bytes_,
        "source": source,
        "intensity_flops_per_byte": flops / bytes_,
        "achieved_flops_per_s": flops / median,
        "achieved_bytes_per_s": bytes_ / median,
        "vs_measured_ceilings": _against(CEILINGS, flops, bytes_, median),
    }
    if nominal is not None:
        entry["vs_nominal_chip"] = _against(nominal, flops, bytes_, median)
    return entry


def _kernel_costs() -> dict[str, tuple[float, float, float]]:
    """`<setting>/<kernel path>` -> (FLOPs, bytes, median) from the hand-worked tiling."""
    costs = {}
    for setting, itemsize in ((MM32, 4.0), (MM16, 2.0)):
        for path in (K1, K2):
            costs[f"{setting}/{path}"] = (
                MM_FLOPS,
                itemsize * MM_ELEMENTS[path],
                MEDIANS[setting][path],
            )
    for setting, dtype, rows in ((LN32, "float32", (8, 16)), (LN16, "bfloat16", (16,))):
        for r in rows:
            path = f"pallas_rows{r}"
            costs[f"{setting}/{path}"] = (LN_FLOPS, LN_BYTES[dtype], MEDIANS[setting][path])
    return costs


class _Device:
    """A device as the code sees it: the real one, but of `device_kind`."""

    def __init__(self, device, device_kind):
        self._device, self.device_kind = device, device_kind

    def __getattr__(self, name):
        return getattr(self._device, name)


@pytest.mark.claims(
    "bench-labels-execution-mode",
    "interpret-mode-claims-no-speed",
    "tpu-roofline-measured-and-nominal",
)
@pytest.mark.parametrize("backend", sorted(DEVICES))
@pytest.mark.parametrize("mode", ["interpret", "compiled"])
def test_report_speed_claims_follow_the_mode_not_the_backend(monkeypatch, mode, backend):
    """run_bench claims kernel speed exactly when the kernels ran compiled, never by the backend,
    against the README's mode paragraphs and hand-worked ratios, both modes x cpu and tpu backends.

    Interpret mode (README): `speed_claims` reads "none", the only ratios are the A/A
    controls, no kernel is placed on the roofline (its intensity given, its placement
    marked unmeasured), every optimization, blocking verdict and
    `where_kernel_stops_helping` unmeasured, the kernel timings labelled `interpret`.
    Compiled mode: the `*_vs_xla` and fused-vs-unfused ratios (XLA median / kernel
    median), every kernel placed on the roofline, every optimization measured, the best
    and worst block per setting, and the settings whose best kernel is slower than XLA
    (the bfloat16 matmul and layer norm) listed. A `tpu` backend must not make interpret
    timings count, nor a `cpu` one hide compiled ones. On a TPU v5e every placed run is
    also placed against the chip's published figures, in either mode; elsewhere the
    report says they do not apply. The device identity is patched everywhere the code
    reads it (`jax.default_backend`, `jax.devices`), so the expected report is the same
    on any machine."""
    platform, device_kind, nominal = DEVICES[backend]
    real_devices = jax.devices
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    monkeypatch.setattr(
        jax, "devices", lambda *a, **k: [_Device(d, device_kind) for d in real_devices(*a, **k)]
    )
    monkeypatch.setattr(bench_settings, "measure", _scripted_measure)
    monkeypatch.setattr(bench_settings, "cost_analysis", lambda compiled: dict(XLA_COST))
    monkeypatch.setattr(
        bench, "measure_ceilings", lambda size, seed, log: {**CEILINGS, "measurements": {}}
    )
    report = bench.run_bench("tiny", interpret=mode == "interpret", repeats=3)

    # The code saw the backend and the mode this case sets.
    assert report["identity"]["backend"] == platform
    assert report["identity"]["device_kind"] == device_kind
    assert report["kernel_execution_mode"] == report["identity"]["kernel_execution_mode"] == mode
    labels = {name: m["execution_mode"] for name, m in report["measurements"].items()}
    _same(
        labels,
        {
            f"{s}/{p}": ("xla" if p.startswith("xla") else mode)
            for s, paths in MEDIANS.items()
            for p in paths
        },
    )
    ratios = {
        f"{MM32}/xla_vs_xla_aa": 1.25,
        f"{MM16}/xla_vs_xla_aa": 0.8,
        f"{LN32}/xla_vs_xla_aa": 1.0,
        f"{LN16}/xla_vs_xla_aa": 0.5,
    }
    roofline = {
        f"{s}/xla": _placed("xla", 3e5, 1e5, MEDIANS[s]["xla"], "XLA cost analysis", nominal)
        for s in MEDIANS
    }
    tiling = "the kernel's tiling"
    valid = {MM32: [K1, K2], MM16: [K1, K2], LN32: ["pallas_rows8", "pallas_rows16"]}
    valid[LN16] = ["pallas_rows16"]
    refused = {MM32: ["32x64x128"], MM16: ["32x64x128"], LN32: [], LN16: ["rows8"]}
    if mode == "compiled":
        ratios |= {
            f"{MM32}/{K1}_vs_xla": 2.0,
            f"{MM32}/{K2}_vs_xla": 1.25,
            f"{MM32}/{K1}_vs_{UNFUSED}": 1.8,
            f"{MM16}/{K1}_vs_xla": 0.5,
            f"{MM16}/{K2}_vs_xla": 0.8,
            f"{MM16}/{K1}_vs_{UNFUSED}": 1.25,
            f"{LN32}/pallas_rows8_vs_xla": 2.0,
            f"{LN32}/pallas_rows16_vs_xla": 4.0,
            f"{LN16}/pallas_rows16_vs_xla": 0.5,
        }
        for name, (flops, bytes_, median) in _kernel_costs().items():
            roofline[name] = _placed("compiled", flops, bytes_, median, tiling, nominal)
        # Both sides of the roofline's min(): the layer norm bandwidth-bound, 64x128x256
        # in float32 compute-bound.
        assert roofline[f"{LN32}/pallas_rows8"]["vs_measured_ceilings"]["limited_by"] == (
            "memory bandwidth"
        )
        assert roofline[f"{MM32}/{K2}"]["vs_measured_ceilings"]["limited_by"] == "compute"
        assert not report["speed_claims"].startswith("none"), report["speed_claims"]
        assert [o["status"] for o in report["optimizations"]] == ["measured"] * 6
        best = {MM32: (K1, K2), MM16: (K2, K1), LN32: ("pallas_rows16", "pallas_rows8")}
        best[LN16] = ("pallas_rows16", "pallas_rows16")
        _same(
            report["blocking"],
            {
                s: {
                    "status": "measured",
                    "best": b,
                    "worst": w,
                    "best_median_s": MEDIANS[s][b],
                    "worst_median_s": MEDIANS[s][w],
                    "best_vs_worst": MEDIANS[s][w] / MEDIANS[s][b],
                    "valid": valid[s],
                    "refused": refused[s],
                }
                for s, (b, w) in best.items()
            },
        )
        _same(
            report["where_kernel_stops_helping"],
            {
                "status": "measured",
                "settings_where_xla_is_faster": [
                    {"setting": MM16, "best_blocks": K2, "best_kernel_vs_xla": 0.8},
                    {"setting": LN16, "best_blocks": "pallas_rows16", "best_kernel_vs_xla": 0.5},
                ],
                "best_kernel_vs_xla": {MM32: 2.0, MM16: 0.8, LN32: 4.0, LN16: 0.5},
            },
        )
    else:
        unmeasured = report["where_kernel_stops_helping"]["status"]
        for name, (flops, bytes_, _) in _kernel_costs().items():
            roofline[name] = {
                "execution_mode": "interpret",
                "flops": flops,
                "bytes": bytes_,
                "source": tiling,
                "intensity_flops_per_byte": flops / bytes_,
                "placement": unmeasured,
            }
        assert report["speed_claims"].startswith("none"), report["speed_claims"]
        assert unmeasured.startswith("unmeasured")
        assert sorted(report["where_kernel_stops_helping"]) == ["status"]
        statuses = [o["status"] for o in report["optimizations"]]
        assert len(statuses) == 6 and all(s.startswith("unmeasured") for s in statuses), statuses
        _same(
            report["blocking"],
            {s: {"status": unmeasured, "valid": valid[s], "refused": refused[s]} for s in valid},
        )
    _same(report["ratios"], ratios)
    assert sorted(report["ratio_details"]) == sorted(ratios)
    _same(report["roofline"], roofline)
    _same(report["failed_paths"], {s: {} for s in MEDIANS})
    if nominal is None:
        assert sorted(report["nominal_chip"]) == ["status"], report["nominal_chip"]
        assert report["nominal_chip"]["status"].startswith("not applicable")
        assert device_kind in report["nominal_chip"]["status"]
    else:
        source = report["nominal_chip"].pop("source")
        assert "nominal" in source and "197" in source and "819" in source, source
        _same(report["nominal_chip"], {"device_kind": device_kind, **nominal})
