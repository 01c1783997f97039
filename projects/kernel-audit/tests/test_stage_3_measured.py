"""Stage 3: measured, and honest about where.

On a CPU (this file's CPU tests): `kernel-audit bench` at a tiny size writes a
report in which every figure names its execution mode; the kernels' timings
are interpret-mode and the report claims no speed (no kernel-vs-XLA ratio, no
roofline placement of a kernel, every optimization marked unmeasured), while
every timed path's output is checked against the float64 reference under its
error bound. The roofline's bytes and FLOPs from the tiling are checked
against an enumeration of the grid's programs and against XLA's cost analysis;
the analysis that a GPU run would use is checked on constructed timings.

On a GPU (tests marked `gpu`, skipped with the reason elsewhere): the
compiled kernels against the references, compiled against interpreted, and
the bench timing the compiled kernel against XLA, with block sizes swept and
each run placed on a roofline against ceilings measured in the same run.
No test asserts a speed.
"""

import json
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from kernel_audit import bench, bench_timing, checkpoint, data, kernels, reference
from kernel_audit.bench_timing import cost_analysis
from kernel_audit.cli import main

ON_GPU = jax.default_backend() == "gpu"


@pytest.fixture(scope="module")
def interpret_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(
        main,
        ["bench", "--size", "tiny", "--repeats", "3", "--mode", "interpret", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    return checkpoint.load_record(out), out, result.output


# --- The analysis, on constructed timings, against figures worked out by hand ---------

CEILINGS = {"flops_per_s": 1e12, "bytes_per_s": 1e11}


def _constructed_settings() -> list[dict]:
    """`small`: two block sizes (one compute-bound, one bandwidth-bound on the
    roofline) and an unfused variant, best kernel 2x faster than XLA; `large`: the
    best kernel 1.5x slower than XLA; `tie`: a kernel exactly as fast as XLA, with no
    cost figures; `xla-only`: no kernel path at all."""

    def path(mode, median, cost=None):
        entry = {"execution_mode": mode, "median_s": median}
        if cost is not None:
            entry["cost"] = cost
        return entry

    xla_cost = {"flops": 3e9, "bytes_accessed": 5e7}
    return [
        {
            "setting": "small",
            "results": {
                "xla": path("xla", 1.0e-3, xla_cost),
                "xla_aa": path("xla", 1.2e-3),
                "pallas_32x32x32": path("compiled", 0.5e-3, {"flops": 2e9, "bytes": 4e7}),
                "pallas_64x64x32": path("compiled", 0.8e-3, {"flops": 2e9, "bytes": 8e8}),
                "pallas_unfused_32x32x32": path("compiled", 0.9e-3),
            },
        },
        {
            "setting": "large",
            "results": {
                "xla": path("xla", 1.0e-3, xla_cost),
                "xla_aa": path("xla", 0.9e-3),
                "pallas_32x32x32": path("compiled", 2.0e-3, {"flops": 2e9, "bytes": 4e7}),
                "pallas_64x64x32": path("compiled", 1.5e-3, {"flops": 2e9, "bytes": 4e7}),
            },
        },
        {
            "setting": "tie",
            "results": {
                "xla": path("xla", 2.0e-3, xla_cost),
                "xla_aa": path("xla", 2.0e-3),
                "pallas_16x16x16": path("compiled", 2.0e-3),
            },
        },
        {
            "setting": "xla-only",
            "results": {"xla": path("xla", 4.0e-3, xla_cost), "xla_aa": path("xla", 3.0e-3)},
        },
    ]


def _placed(mode, flops, bytes_, median, source):
    """A roofline entry with its placement: attainable = min(peak, intensity x bw)."""
    intensity = flops / bytes_
    attainable = min(1e12, intensity * 1e11)
    return {
        "execution_mode": mode,
        "flops": flops,
        "bytes": bytes_,
        "source": source,
        "intensity_flops_per_byte": intensity,
        "achieved_flops_per_s": flops / median,
        "attainable_flops_per_s": attainable,
        "fraction_of_roofline": flops / median / attainable,
    }


def _assert_same(got, expected, where="") -> None:
    """Equal structure, numbers to 1e-12 relative."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), (where, got, expected)
        for key in expected:
            _assert_same(got[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got, expected)
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _assert_same(g, e, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(expected, bool):
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0), (where, got, expected)
    else:
        assert got == expected and type(got) is type(expected), (where, got, expected)


XLA_SOURCE, TILING = "XLA cost analysis", "the kernel's tiling"


def test_compiled_analysis_equals_hand_worked_figures():
    """analyse in compiled mode gives the hand-worked ratios, roofline placements, optimizations and
    where XLA wins."""
    ratios, roofline, optimizations, where = bench.analyse(
        _constructed_settings(), CEILINGS, compiled=True
    )
    _assert_same(
        ratios,
        {
            "small/xla_vs_xla_aa": 1.2e-3 / 1.0e-3,
            "small/pallas_32x32x32_vs_xla": 1.0e-3 / 0.5e-3,
            "small/pallas_64x64x32_vs_xla": 1.0e-3 / 0.8e-3,
            "small/pallas_32x32x32_vs_pallas_unfused_32x32x32": 0.9e-3 / 0.5e-3,
            "large/xla_vs_xla_aa": 0.9e-3 / 1.0e-3,
            "large/pallas_32x32x32_vs_xla": 1.0e-3 / 2.0e-3,
            "large/pallas_64x64x32_vs_xla": 1.0e-3 / 1.5e-3,
            "tie/xla_vs_xla_aa": 1.0,
            "tie/pallas_16x16x16_vs_xla": 1.0,
            "xla-only/xla_vs_xla_aa": 3.0e-3 / 4.0e-3,
        },
    )
    unplaced = {"execution_mode": "compiled", "flops": None, "bytes": None, "source": TILING}
    _assert_same(
        roofline,
        {
            "small/pallas_32x32x32": _placed("compiled", 2e9, 4e7, 0.5e-3, TILING),
            "small/pallas_64x64x32": _placed("compiled", 2e9, 8e8, 0.8e-3, TILING),
            "small/xla": _placed("xla", 3e9, 5e7, 1.0e-3, XLA_SOURCE),
            "large/pallas_32x32x32": _placed("compiled", 2e9, 4e7, 2.0e-3, TILING),
            "large/pallas_64x64x32": _placed("compiled", 2e9, 4e7, 1.5e-3, TILING),
            "large/xla": _placed("xla", 3e9, 5e7, 1.0e-3, XLA_SOURCE),
            "tie/pallas_16x16x16": unplaced,
            "tie/xla": _placed("xla", 3e9, 5e7, 2.0e-3, XLA_SOURCE),
            "xla-only/xla": _placed("xla", 3e9, 5e7, 4.0e-3, XLA_SOURCE),
        },
    )
    # The placements exercise both sides of the roofline's min().
    assert roofline["small/pallas_32x32x32"]["attainable_flops_per_s"] == 1e12
    assert roofline["small/pallas_64x64x32"]["attainable_flops_per_s"] == pytest.approx(2.5e11)
    _assert_same(
        optimizations,
        [
            {
                "optimization": "small: block size 32x32x32",
                "status": "measured",
                "evidence": {"pallas_32x32x32": 0.5e-3, "pallas_64x64x32": 0.8e-3},
            },
            {
                "optimization": "small: bias + gelu fused into the matmul epilogue",
                "status": "measured",
                "evidence": {"fused_vs_unfused": 0.9e-3 / 0.5e-3},
            },
            {
                "optimization": "large: block size 64x64x32",
                "status": "measured",
                "evidence": {"pallas_32x32x32": 2.0e-3, "pallas_64x64x32": 1.5e-3},
            },
            {
                "optimization": "tie: block size 16x16x16",
                "status": "measured",
                "evidence": {"pallas_16x16x16": 2.0e-3},
            },
        ],
    )
    # Only a best kernel strictly slower than XLA stops helping; the tie does not.
    _assert_same(
        where,
        {
            "status": "measured",
            "settings_where_xla_is_faster": [
                {
                    "setting": "large",
                    "best_blocks": "pallas_64x64x32",
                    "best_kernel_vs_xla": 1.0e-3 / 1.5e-3,
                }
            ],
        },
    )


def test_interpret_analysis_keeps_only_the_controls_and_xla_placements():
    """analyse in interpret mode keeps only the A/A ratios and XLA placements, marking every kernel
    claim unmeasured."""
    ratios, roofline, optimizations, where = bench.analyse(
        _constructed_settings(), CEILINGS, compiled=False
    )
    _assert_same(
        ratios,
        {
            "small/xla_vs_xla_aa": 1.2e-3 / 1.0e-3,
            "large/xla_vs_xla_aa": 0.9e-3 / 1.0e-3,
            "tie/xla_vs_xla_aa": 1.0,
            "xla-only/xla_vs_xla_aa": 3.0e-3 / 4.0e-3,
        },
    )
    unmeasured = where["status"]
    assert sorted(where) == ["status"]
    assert unmeasured.startswith("unmeasured: the kernel ran in interpret mode")

    def kernel(flops, bytes_):
        return {
            "execution_mode": "compiled",
            "flops": flops,
            "bytes": bytes_,
            "source": TILING,
            "intensity_flops_per_byte": flops / bytes_,
            "placement": unmeasured,
        }

    _assert_same(
        roofline,
        {
            "small/pallas_32x32x32": kernel(2e9, 4e7),
            "small/pallas_64x64x32": kernel(2e9, 8e8),
            "small/xla": _placed("xla", 3e9, 5e7, 1.0e-3, XLA_SOURCE),
            "large/pallas_32x32x32": kernel(2e9, 4e7),
            "large/pallas_64x64x32": kernel(2e9, 4e7),
            "large/xla": _placed("xla", 3e9, 5e7, 1.0e-3, XLA_SOURCE),
            "tie/pallas_16x16x16": {
                "execution_mode": "compiled",
                "flops": None,
                "bytes": None,
                "source": TILING,
            },
            "tie/xla": _placed("xla", 3e9, 5e7, 2.0e-3, XLA_SOURCE),
            "xla-only/xla": _placed("xla", 3e9, 5e7, 4.0e-3, XLA_SOURCE),
        },
    )
    _assert_same(
        optimizations,
        [
            {
                "optimization": "small: block sizes ['pallas_32x32x32', 'pallas_64x64x32']",
                "status": unmeasured,
            },
            {"optimization": "small: fused epilogue", "status": unmeasured},
            {
                "optimization": "large: block sizes ['pallas_32x32x32', 'pallas_64x64x32']",
                "status": unmeasured,
            },
            {"optimization": "tie: block sizes ['pallas_16x16x16']", "status": unmeasured},
        ],
    )


@pytest.mark.parametrize(
    ("m", "k", "n", "blocks"),
    [(64, 64, 48, (16, 16, 16)), (100, 70, 33, (32, 16, 32)), (1, 1, 1, (16, 16, 16))],
)
def test_tiling_cost_counts_and_intensity(m, k, n, blocks):
    """matmul_tiling_cost gives 2MNK + 2MN FLOPs and the bytes of its programs, for 3 shapes.

    FLOPs 2MNK + 2MN; bytes from ceil(M/bm) x ceil(N/bn) programs; intensity their
    ratio, at itemsize 2 (bfloat16)."""
    bm, bn, _ = blocks
    gm, gn = math.ceil(m / bm), math.ceil(n / bn)
    flops = 2 * m * n * k + 2 * m * n
    bytes_ = 2 * (gn * m * k + gm * k * n + gm * n + m * n)
    cost = bench.matmul_tiling_cost(m, k, n, kernels.MatmulBlocks(*blocks), itemsize=2)
    assert cost == {"flops": float(flops), "bytes": float(bytes_), "intensity": flops / bytes_}


def test_bench_report_declares_interpret_mode_and_claims_no_speed(evidence, interpret_report):
    """The CPU bench report labels every kernel path interpret, claims no speed and places no kernel
    on the roofline."""
    report, out, output = interpret_report
    measurements = report["measurements"]
    kernel_paths = {k: v for k, v in measurements.items() if "/pallas_" in k}
    observed = {
        "kernel_execution_mode": report["kernel_execution_mode"],
        "modes": sorted({m["execution_mode"] for m in measurements.values()}),
        "kernel_paths_all_interpret": all(
            m["execution_mode"] == "interpret" for m in kernel_paths.values()
        ),
        "speed_claims": report["speed_claims"],
        "ratio_names": sorted(report["ratios"]),
        "kernel_ratios": [r for r in report["ratios"] if "pallas" in r],
        "optimization_statuses": sorted({o["status"][:10] for o in report["optimizations"]}),
        "where_stops_helping": report["where_kernel_stops_helping"]["status"][:10],
        "kernels_placed_on_roofline": [
            k
            for k, v in report["roofline"].items()
            if "/pallas_" in k and "achieved_flops_per_s" in v
        ],
        "table_says_no_claim": "speed claims: none" in output,
        "png_bytes": out.with_suffix(".png").stat().st_size,
    }
    assert evidence.record(
        "bench on CPU: kernels interpret-mode, correctness-only, no speed claimed",
        "size tiny, 3 rounds, --mode interpret",
        observed,
        {"kernel_ratios": [], "kernels_placed_on_roofline": [], "statuses": ["unmeasured"]},
        observed["kernel_execution_mode"] == "interpret"
        and observed["kernel_paths_all_interpret"]
        and bool(kernel_paths)
        and observed["speed_claims"].startswith("none")
        and not observed["kernel_ratios"]
        and observed["optimization_statuses"] == ["unmeasured"]
        and observed["where_stops_helping"] == "unmeasured"
        and not observed["kernels_placed_on_roofline"]
        and observed["table_says_no_claim"]
        and observed["png_bytes"] > 0,
    )


def test_bench_checks_every_timed_path_and_follows_the_protocol(evidence, interpret_report):
    """Every timed bench path is within its error bound, compiled apart, and A/A-controlled.

    Each path's output is within its error bound (so every block size swept is
    correct); compile is timed apart; the timed rounds compile nothing; the A/A
    control is present; the identity is recorded."""
    report, _, _ = interpret_report
    m = report["measurements"]
    observed = {
        "bound_used": {k: v["bound_used_vs_f64"] for k, v in m.items()},
        "n": sorted({v["n"] for v in m.values()}),
        "timed_compiles": sorted({v["compiles_during_timed_rounds"] for v in m.values()}),
        "compile_timed_apart": all(
            v["compile_s"] > 0 and v["first_call_s"] > 0 for v in m.values()
        ),
        "aa_ratios": {k: v for k, v in report["ratios"].items() if k.endswith("xla_vs_xla_aa")},
        "identity_keys": sorted(report["identity"]),
        "block_sizes_swept": sorted(k for k in m if "/pallas_" in k and "unfused" not in k),
    }
    assert evidence.record(
        "bench protocol: every timed path correct, compiles apart, none while timing, A/A kept",
        "size tiny, 3 rounds (a test checks the bench works, never a speed)",
        observed,
        {"bound_used_max": 1.0, "timed_compiles": [0]},
        all(v <= 1.0 for v in observed["bound_used"].values())
        and observed["n"] == [3]
        and observed["timed_compiles"] == [0]
        and observed["compile_timed_apart"]
        and len(observed["aa_ratios"]) == 2
        and {"jax", "backend", "device_kind", "commit", "config_sha256"}
        <= set(observed["identity_keys"])
        and len(observed["block_sizes_swept"]) == 3,
    )


@pytest.mark.parametrize(
    ("shape", "blocks"),
    [((64, 64, 48), (16, 16, 16)), ((100, 70, 33), (32, 16, 32))],
)
def test_tiling_bytes_and_flops_match_an_enumeration(evidence, shape, blocks):
    """The tiling's bytes equal a Python enumeration of the grid, its matmul FLOPs XLA's count.

    The roofline's bytes come from the tiling: enumerate the grid's programs in
    Python and add up what each reads and writes; the FLOPs' matmul part must also
    equal XLA's cost analysis of the plain `jnp.dot` (2 M N K)."""
    m, k, n = shape
    mb = kernels.MatmulBlocks(*blocks)
    cost = bench.matmul_tiling_cost(m, k, n, mb, itemsize=4)
    read = written = 0
    for i in range(0, m, mb.block_m):
        for j in range(0, n, mb.block_n):
            rows, cols = min(mb.block_m, m - i), min(mb.block_n, n - j)
            read += rows * k + k * cols + cols  # x strip, w strip, bias (in bounds)
            written += rows * cols
    enumerated_bytes = 4 * (read + written)
    x, w = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
    xla_flops = cost_analysis(jax.jit(jnp.dot).lower(x, w).compile())["flops"]
    observed = {
        "tiling_bytes": cost["bytes"],
        "enumerated_bytes": enumerated_bytes,
        "tiling_matmul_flops": cost["flops"] - 2.0 * m * n,
        "xla_dot_flops": xla_flops,
    }
    assert evidence.record(
        "roofline inputs: bytes from the tiling vs enumeration; FLOPs vs XLA cost analysis",
        f"(M, K, N)={shape}, blocks {blocks}, float32",
        observed,
        {"exact": True},
        cost["bytes"] == enumerated_bytes and observed["tiling_matmul_flops"] == xla_flops,
    )


def test_compiled_analysis_on_constructed_timings(evidence):
    """On constructed medians, analyse gives XLA/kernel ratios, roofline fractions, where XLA wins.

    The analysis a GPU run uses, on constructed medians: ratios are XLA time over
    kernel time, the roofline fraction is achieved over min(peak, intensity x
    bandwidth), and a setting lands in `where_kernel_stops_helping` exactly when
    its best block size is slower than XLA."""
    ceilings = {"flops_per_s": 1e12, "bytes_per_s": 1e11}

    def setting(name, xla_s, kernel_s):
        cost = {"flops": 2e9, "bytes": 4e7}
        results = {
            "xla": {
                "execution_mode": "xla",
                "median_s": xla_s,
                "cost": {"flops": 2e9, "bytes_accessed": 4e7},
            },
            "xla_aa": {"execution_mode": "xla", "median_s": xla_s},
        }
        for blocks, t in kernel_s.items():
            results[f"pallas_{blocks}"] = {
                "execution_mode": "compiled",
                "median_s": t,
                "cost": cost,
            }
        return {"setting": name, "results": results}

    settings = [
        setting("small", 1.0e-3, {"32x32x32": 0.5e-3, "64x64x32": 0.8e-3}),
        setting("large", 1.0e-3, {"32x32x32": 2.0e-3, "64x64x32": 1.5e-3}),
    ]
    ratios, roofline, optimizations, where = bench.analyse(settings, ceilings, compiled=True)
    attainable = min(1e12, 2e9 / 4e7 * 1e11)
    expected_fraction = (2e9 / 0.5e-3) / attainable
    observed = {
        "small_32_vs_xla": ratios["small/pallas_32x32x32_vs_xla"],
        "large_64_vs_xla": ratios["large/pallas_64x64x32_vs_xla"],
        "stops_helping": [s["setting"] for s in where["settings_where_xla_is_faster"]],
        "small_32_roofline_fraction": roofline["small/pallas_32x32x32"]["fraction_of_roofline"],
        "statuses": sorted({o["status"] for o in optimizations}),
    }
    assert evidence.record(
        "compiled-mode analysis on constructed timings",
        "two settings: kernel 2x faster than XLA / 1.5x slower at best",
        observed,
        {"expected_fraction": expected_fraction},
        np.isclose(observed["small_32_vs_xla"], 1.0e-3 / 0.5e-3)
        and np.isclose(observed["large_64_vs_xla"], 1.0e-3 / 1.5e-3)
        and observed["stops_helping"] == ["large"]
        and np.isclose(observed["small_32_roofline_fraction"], expected_fraction)
        and observed["statuses"] == ["measured"],
    )


@pytest.mark.skipif(ON_GPU, reason="on a GPU `--mode compiled` is valid")
def test_compiled_mode_without_a_gpu_is_a_clear_error(tmp_path):
    """bench --mode compiled without a GPU exits 2 saying it needs a GPU, with no traceback and no
    report."""
    result = CliRunner().invoke(
        main, ["bench", "--size", "tiny", "--mode", "compiled", "--out", str(tmp_path / "b.json")]
    )
    assert result.exit_code == 2
    assert "needs a GPU" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "b.json").exists()


# --- The timing summary, on a clock whose every duration is chosen in the test ----------

UNIT = 2.0**-10  # Seconds; durations are whole or dyadic multiples, so clock sums are exact.


class _ScriptedWork:
    """Stands in for `bench_timing`'s `time` and `jax` modules (nothing else's): its
    `perf_counter` stands still except while the work being timed runs, and then moves
    by a duration chosen in the test. `jax.jit(fn).lower(...)` of a path moves it by the
    path's `lower`, `.compile()` by its `compile`, and each `jax.block_until_ready` of a
    path's output by the next of its `calls` (the first call, then round 0, 1, ...).
    Everything else is the real `jax`; the path is known by its function (lowering) or
    by its output's value (calls)."""

    def __init__(self, script: dict, fns: dict, values: dict):
        self.now = 0.0
        self.script, self.fns, self.values = script, fns, values
        self.used = dict.fromkeys(script, 0)

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(jax, name)

    def jit(self, fn):
        name, work = self.fns[id(fn)], self

        class _Lowered:
            def __init__(self, lowered):
                self.lowered = lowered

            def compile(self):
                compiled = self.lowered.compile()
                work.now += work.script[name]["compile"]
                return compiled

        class _Jitted:
            def lower(self, *args):
                lowered = jax.jit(fn).lower(*args)
                work.now += work.script[name]["lower"]
                return _Lowered(lowered)

        return _Jitted()

    def block_until_ready(self, x):
        x = jax.block_until_ready(x)
        name = self.values[float(np.asarray(x))]
        self.now += self.script[name]["calls"][self.used[name]]
        self.used[name] += 1
        return x


# Per case, per path: the duration of each timed round, in UNITs. Odd and even counts, one
# slow outlier round (at a different round in each path), all rounds equal, and one round
# slower by 2^-35 of a UNIT: there the mean exceeds the median by 2^-35 / 5 = 5.8e-12
# relative, 5.8 times the comparison's tolerance (1e-12).
TIMING_CASES = {
    "odd-5": {"a": [7, 3, 9, 1, 4], "b": [2, 2, 8, 5, 6], "c": [10, 1, 3, 3, 12]},
    "even-6": {"a": [5, 1, 4, 9, 2, 6], "b": [3, 3, 7, 7, 1, 8], "c": [2, 11, 6, 4, 4, 9]},
    "outlier-odd-7": {
        "a": [4, 5, 4, 6, 5, 4, 800],
        "b": [900, 5, 6, 5, 4, 6, 5],
        "c": [3, 3, 4, 700, 3, 4, 3],
    },
    "outlier-even-4": {"a": [3, 800, 3, 4], "b": [5, 6, 5, 600], "c": [700, 2, 2, 2]},
    "all-equal-4": {"a": [6, 6, 6, 6], "b": [2, 2, 2, 2], "c": [9, 9, 9, 9]},
    "slower-by-2^-35-5": {"a": [1, 1, 1 + 2.0**-35, 1, 1], "b": [1, 1, 1, 1, 1], "c": [2] * 5},
}


@pytest.mark.parametrize("case", list(TIMING_CASES))
def test_measure_summarises_known_round_durations(evidence, monkeypatch, case):
    """measure's median, p90, min, max, n and times equal `statistics` of durations set by hand.

    The clock `bench_timing` reads is replaced (in that module only) by one on which
    lowering, compiling, the first call and every timed round of each of 3 interleaved
    paths take a duration chosen here, so each summary field has an exact expected value:
    the median and p90 (linear interpolation, `statistics.quantiles(..., method=
    "inclusive")`) of the rounds from Python's `statistics`, min, max, the count, the
    per-round list in round order (whatever the rotation of the path order), and the
    lower, compile and first-call times. Odd and even round counts, one slow outlier,
    all-equal rounds, and a round slower by a hair (the mean 5.8x the tolerance away)."""
    rounds = TIMING_CASES[case]
    repeats = len(rounds["a"])
    names = list(rounds)
    fns = {name: (lambda x: -x) for name in names}  # Three distinct function objects.
    assert len({id(f) for f in fns.values()}) == len(names)
    script = {
        name: {
            "lower": (10 + i) * UNIT,
            "compile": (20 + 2 * i) * UNIT,
            "calls": [(30 + 3 * i) * UNIT] + [d * UNIT for d in rounds[name]],
        }
        for i, name in enumerate(names)
    }
    values = {-float(i + 1): name for i, name in enumerate(names)}
    work = _ScriptedWork(script, {id(f): n for n, f in fns.items()}, values)
    monkeypatch.setattr(bench_timing, "time", work)
    monkeypatch.setattr(bench_timing, "jax", work)
    paths = [
        bench_timing.Path(name, fns[name], (jnp.float32(i + 1),), "xla")
        for i, name in enumerate(names)
    ]
    got = bench_timing.measure(paths, repeats, lambda _: None)
    ok = True
    for name in names:
        durations = [d * UNIT for d in rounds[name]]
        r = got[name]
        ok &= evidence.allclose(
            "measure summary vs Python statistics of the chosen round durations",
            f"{case}, path {name}: [median, p90, min, max] of {rounds[name]} x 2^-10 s",
            [r["median_s"], r["p90_s"], r["min_s"], r["max_s"]],
            [
                statistics.median(durations),
                statistics.quantiles(durations, n=10, method="inclusive")[8],
                min(durations),
                max(durations),
            ],
            rtol=1e-12,
            atol=0.0,
        )
        observed = {
            "n": r["n"],
            "times_s": r["times_s"],
            "lower_s": r["lower_s"],
            "compile_s": r["compile_s"],
            "first_call_s": r["first_call_s"],
            "compiles_during_timed_rounds": r["compiles_during_timed_rounds"],
            "execution_mode": r["execution_mode"],
            "calls_timed": work.used[name],
        }
        expected = {
            "n": repeats,
            "times_s": durations,
            "lower_s": script[name]["lower"],
            "compile_s": script[name]["compile"],
            "first_call_s": script[name]["calls"][0],
            "compiles_during_timed_rounds": 0,
            "execution_mode": "xla",
            "calls_timed": 1 + repeats,
        }
        ok &= evidence.record(
            "measure per-round times, count, lower/compile/first call vs the chosen durations",
            f"{case}, path {name}, {repeats} rounds interleaved over 3 paths",
            observed,
            {"exact": expected},
            observed == expected,
        )
    # The cases must tell the median from the mean (except all-equal, where they agree).
    gaps = {
        name: abs(statistics.fmean(d) - statistics.median(d)) / statistics.median(d)
        for name, d in rounds.items()
    }
    ok &= evidence.record(
        "the chosen durations separate median and mean by more than the tolerance",
        f"{case}: |mean - median| / median per path",
        gaps,
        {"rtol": 1e-12, "all_equal_case": "every gap 0"},
        all(g == 0.0 for g in gaps.values())
        if case.startswith("all-equal")
        else max(gaps.values()) > 1e-12,
    )
    assert ok, got


# --- TARGET (GPU) CHECKS ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_kernels_match_references_on_gpu(evidence, dtype):
    """Compiled GPU kernels are within the derived bound of float64 and twice it of interpret mode,
    2 dtypes, 3 shapes."""
    ok = True
    for case in (c for c in data.MATMUL_CASES if c.name in ("divides", "ragged", "long_reduction")):
        x, w, b = data.matmul_operands(
            data.case_key(0, "gpu", case.name), case.m, case.k, case.n, kernels.DTYPES[dtype]
        )
        blocks = kernels.fit_matmul_blocks(case.m, case.k, case.n)
        compiled = kernels.matmul_bias_act(
            x, w, b, blocks=blocks, activation="gelu", interpret=False
        )
        interpreted = kernels.matmul_bias_act(
            x, w, b, blocks=blocks, activation="gelu", interpret=True
        )
        bound = reference.matmul_error_bound(x, w, b, "gelu", dtype)
        condition = f"{case.name}, {dtype}, mode=compiled"
        ok &= evidence.within_bound(
            "compiled matmul vs float64",
            condition,
            compiled,
            reference.matmul_bias_act_f64(x, w, b, "gelu"),
            bound,
        )
        ok &= evidence.within_bound(
            "compiled vs interpreted matmul (twice the bound)",
            condition,
            compiled,
            reference.to_f64(interpreted),
            bound,
            scale=2.0,
        )
    for case in (c for c in data.ROW_CASES if c.name in ("divides", "ragged", "long_row")):
        x, g, b = data.layer_norm_operands(
            data.case_key(0, "gpu-ln", case.name), case.rows, case.cols, kernels.DTYPES[dtype]
        )
        y = kernels.layer_norm(x, g, b, interpret=False)
        ok &= evidence.within_bound(
            "compiled layer norm vs float64",
            f"{case.name}, {dtype}, mode=compiled",
            y,
            reference.layer_norm_f64(x, g, b),
            reference.layer_norm_error_bound(x, g, b, dtype),
        )
    assert ok


@pytest.mark.gpu
def test_gpu_bench_times_the_compiled_kernel_against_xla(evidence, tmp_path):
    """The GPU bench times compiled kernels against XLA, with roofline fractions in (0, 1.5] and
    every path in bound."""
    report = bench.run_bench("tiny", interpret=False, repeats=20)
    (tmp_path / "bench.json").write_text(json.dumps(report))
    kernel_ratios = {k: v for k, v in report["ratios"].items() if k.endswith("_vs_xla")}
    fractions = {
        k: v["fraction_of_roofline"]
        for k, v in report["roofline"].items()
        if "fraction_of_roofline" in v
    }
    observed = {
        "kernel_execution_mode": report["kernel_execution_mode"],
        "kernel_ratios": kernel_ratios,
        "roofline_fractions": fractions,
        "where_status": report["where_kernel_stops_helping"]["status"],
        "where": report["where_kernel_stops_helping"].get("settings_where_xla_is_faster"),
        "bound_used": {k: v["bound_used_vs_f64"] for k, v in report["measurements"].items()},
        "ceilings": report["ceilings"],
    }
    assert evidence.record(
        "GPU bench: compiled kernels timed against XLA, on a measured roofline",
        "size tiny, 20 rounds, --mode compiled",
        observed,
        {"roofline_fraction_range": [0.0, 1.5], "bound_used_max": 1.0},
        observed["kernel_execution_mode"] == "compiled"
        and bool(kernel_ratios)
        and all(0.0 < f <= 1.5 for f in fractions.values())
        and observed["where_status"] == "measured"
        and all(v <= 1.0 for v in observed["bound_used"].values()),
    )
