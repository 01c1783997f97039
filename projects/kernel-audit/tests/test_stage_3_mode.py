"""Stage 3: the bench report's claims follow the execution mode the kernels ran in.

`run_bench` is run end to end at the `tiny` size with its timer, its ceilings and
XLA's cost analysis replaced by constructed figures (no kernel runs, so this holds
on any machine), in both modes and under a `cpu` and a `gpu` backend as the code
sees it (`jax.default_backend` patched). Whether the report speaks of kernel speed
must follow the mode only, never the backend: the README's "Interpret mode" and
"Compiled mode" paragraphs, read literally, give the expected report, and every
ratio and roofline figure is worked out here from the constructed medians.
"""

import jax
import pytest

from kernel_audit import bench, reference

MM, LN = "matmul_64x64x48", "layer_norm_32x96"  # The `tiny` size's two settings.

# Constructed medians (seconds) per setting (known by the operand shape) and path. The
# matmul's best kernel is 2x faster than XLA; the layer norm's kernel is 2x slower.
MEDIANS = {
    (64, 64): {
        "xla": 1.0e-3,
        "xla_aa": 1.25e-3,
        "pallas_16x16x16": 0.5e-3,
        "pallas_32x32x32": 0.8e-3,
        "pallas_unfused_16x16x16": 0.9e-3,
    },
    (32, 96): {"xla": 1.0e-3, "xla_aa": 0.8e-3, "pallas_rows8": 2.0e-3},
}
SETTING_OF = {(64, 64): MM, (32, 96): LN}
CEILINGS = {"flops_per_s": 4e12, "bytes_per_s": 1e12}
XLA_COST = {"flops": 3e5, "bytes_accessed": 1e5}  # What the XLA matmul's cost analysis says.

# The matmul tiling as the README describes it (float32, itemsize 4): each of the
# ceil(64/bm) x ceil(48/bn) programs reads a (bm, 64) strip of x, a (64, bn) strip of w
# and bn bias entries; the (64, 48) output is written once. FLOPs 2MNK + 2MN.
MM_FLOPS = 2.0 * 64 * 48 * 64 + 2.0 * 64 * 48
MM_BYTES = {
    "pallas_16x16x16": 4.0 * (64 * 64 * 3 + 64 * 48 * 4 + 48 * 4 + 64 * 48),  # 4 x 3 programs
    "pallas_32x32x32": 4.0 * (64 * 64 * 2 + 64 * 48 * 2 + 48 * 2 + 64 * 48),  # 2 x 2 programs
}


def _scripted_measure(paths, repeats, log):
    """Stands in for `bench_timing.measure`: every round of a path takes its constructed
    median; its output is the `jax.numpy` reference's (so the kernels never run)."""
    del log
    results = {}
    for path in paths:
        x, second, third = path.args
        median = MEDIANS[tuple(x.shape)][path.name]
        if second.ndim == 2:
            path.output = reference.matmul_bias_act_jnp(x, second, third, "gelu")
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
            "n": repeats,
            "times_s": [median] * repeats,
            "compiles_during_timed_rounds": 0,
        }
    return results


def _same(got, expected, where="") -> None:
    """Equal structure, numbers to 1e-12 relative."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), (where, got, expected)
        for key in expected:
            _same(got[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


def _placed(mode, flops, bytes_, median, source):
    """A roofline entry with its placement: attainable = min(peak, intensity x bandwidth)."""
    attainable = min(CEILINGS["flops_per_s"], flops / bytes_ * CEILINGS["bytes_per_s"])
    return {
        "execution_mode": mode,
        "flops": flops,
        "bytes": bytes_,
        "source": source,
        "intensity_flops_per_byte": flops / bytes_,
        "achieved_flops_per_s": flops / median,
        "attainable_flops_per_s": attainable,
        "fraction_of_roofline": flops / median / attainable,
    }


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("mode", ["interpret", "compiled"])
def test_report_speed_claims_follow_the_mode_not_the_backend(monkeypatch, mode, backend):
    """run_bench claims kernel speed exactly when the kernels ran compiled, never by the backend,
    against the README's mode paragraphs and hand-worked ratios, both modes x cpu and gpu backends.

    Interpret mode (README): `speed_claims` reads "none", the only ratios are the A/A
    controls, no kernel is placed on the roofline (its intensity given, its placement
    marked unmeasured), every optimization and `where_kernel_stops_helping` unmeasured,
    the kernel timings labelled `interpret`. Compiled mode: the `*_vs_xla` and fused-vs-
    unfused ratios (XLA median / kernel median), every kernel placed on the roofline,
    every optimization measured, and the setting whose best kernel is slower than XLA
    (the layer norm, 2x) listed. A `gpu` backend must not make interpret timings count,
    nor a `cpu` one hide compiled ones."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(bench, "measure", _scripted_measure)
    monkeypatch.setattr(bench, "cost_analysis", lambda compiled: dict(XLA_COST))
    monkeypatch.setattr(
        bench, "measure_ceilings", lambda size, log: {**CEILINGS, "measurements": {}}
    )
    report = bench.run_bench("tiny", interpret=mode == "interpret", repeats=3)

    # The code saw the backend and the mode this case sets.
    assert report["identity"]["backend"] == backend
    assert report["kernel_execution_mode"] == report["identity"]["kernel_execution_mode"] == mode
    labels = {name: m["execution_mode"] for name, m in report["measurements"].items()}
    _same(
        labels,
        {
            f"{SETTING_OF[s]}/{p}": ("xla" if p.startswith("xla") else mode)
            for s, paths in MEDIANS.items()
            for p in paths
        },
    )

    mm, ln = MEDIANS[(64, 64)], MEDIANS[(32, 96)]
    ratios = {f"{MM}/xla_vs_xla_aa": 1.25, f"{LN}/xla_vs_xla_aa": 0.8}
    tiling = "the kernel's tiling"
    roofline = {
        f"{MM}/xla": _placed("xla", 3e5, 1e5, mm["xla"], "XLA cost analysis"),
        f"{LN}/xla": {
            "execution_mode": "xla",
            "flops": None,
            "bytes": None,
            "source": "XLA cost analysis",
        },
    }
    kernel_costs = {f"{MM}/{p}": (MM_FLOPS, b, mm[p]) for p, b in MM_BYTES.items()}
    ln_cost = report["roofline"][f"{LN}/pallas_rows8"]
    kernel_costs[f"{LN}/pallas_rows8"] = (ln_cost["flops"], ln_cost["bytes"], ln["pallas_rows8"])
    if mode == "compiled":
        ratios |= {
            f"{MM}/pallas_16x16x16_vs_xla": 2.0,
            f"{MM}/pallas_32x32x32_vs_xla": 1.25,
            f"{MM}/pallas_16x16x16_vs_pallas_unfused_16x16x16": 1.8,
            f"{LN}/pallas_rows8_vs_xla": 0.5,
        }
        for name, (flops, bytes_, median) in kernel_costs.items():
            roofline[name] = _placed("compiled", flops, bytes_, median, tiling)
        # Both sides of the roofline's min(): 16x16x16 bandwidth-bound, 32x32x32 compute-bound.
        assert roofline[f"{MM}/pallas_16x16x16"]["attainable_flops_per_s"] < 4e12
        assert roofline[f"{MM}/pallas_32x32x32"]["attainable_flops_per_s"] == 4e12
        assert not report["speed_claims"].startswith("none"), report["speed_claims"]
        assert [o["status"] for o in report["optimizations"]] == ["measured"] * 3
        _same(
            report["where_kernel_stops_helping"],
            {
                "status": "measured",
                "settings_where_xla_is_faster": [
                    {"setting": LN, "best_blocks": "pallas_rows8", "best_kernel_vs_xla": 0.5}
                ],
            },
        )
    else:
        unmeasured = report["where_kernel_stops_helping"]["status"]
        for name, (flops, bytes_, _) in kernel_costs.items():
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
        assert len(statuses) == 3 and all(s.startswith("unmeasured") for s in statuses), statuses
    _same(report["ratios"], ratios)
    assert sorted(report["ratio_details"]) == sorted(ratios)
    _same(report["roofline"], roofline)
