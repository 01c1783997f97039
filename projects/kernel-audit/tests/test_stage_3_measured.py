"""Stage 3: measured, and honest about where.

On a CPU (this file's CPU tests): the analysis a TPU run uses is checked on
constructed timings against figures worked out by hand (ratios, roofline
placements against the ceilings measured in the run and against the chip's
nominal figures, the blocking summary, where the kernel stops helping). The
roofline's bytes and FLOPs from the tiling are checked against an enumeration
of the K-grid's programs and steps and against XLA's cost analysis.
`kernel-audit bench` at the tiny size writes a report in which every figure
names its execution mode; the kernels' timings are interpret-mode and the
report claims no speed, while every timed path's output is checked against the
float64 reference under its error bound, refused block sizes carry the
kernel's own message, and each round's path order follows from the recorded
seed. The `tpu` size's settings and the kernels it compiles are listed.

On a TPU (tests marked `tpu`, skipped with the reason elsewhere): the
compiled kernels against the references in both dtypes (float32 at `highest`
and at `default`) and against the interpreter, and the bench on the compiled
kernels judged on its measurement protocol. No test asserts a speed.
"""

import dataclasses
import importlib.metadata
import json
import math
import statistics
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from kernel_audit import bench, bench_sizes, bench_timing, checkpoint, data, kernels, reference
from kernel_audit.bench_timing import cost_analysis
from kernel_audit.cli import main

ON_TPU = jax.default_backend() == "tpu"
# The TPU v5e's published figures (Google's chip specification: 197 TFLOP/s bfloat16
# peak, 819 GB/s HBM) and the device kinds JAX reports for it.
V5E_FIGURES = {"flops_per_s": 197e12, "bytes_per_s": 819e9}
V5E_KINDS = ("TPU v5 lite", "TPU v5e")


def expected_nominal_chip() -> dict | None:
    """The nominal figures a report on this machine must carry, from the README's rule
    (a TPU v5e's published figures exactly when the device is a TPU v5e, else none),
    not from the code under test."""
    kind = jax.devices()[0].device_kind
    if jax.default_backend() != "tpu" or kind not in V5E_KINDS:
        return None
    return {"device_kind": kind, **V5E_FIGURES}


@pytest.fixture(scope="module")
def interpret_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(
        main,
        ["bench", "--size", "tiny", "--repeats", "3", "--mode", "interpret", "--out", str(out)],
    )
    assert result.exit_code == 0, (result.output, repr(result.exception))
    return checkpoint.load_record(out), out, result.output


# --- The analysis, on constructed timings, against figures worked out by hand ---------

# Measured in the (constructed) run: the headline GEMM, a faster bfloat16 GEMM, a copy.
CEILINGS = {"flops_per_s": 1e12, "bytes_per_s": 1e11, "flops_per_s_by_kind": {"bfloat16": 2e12}}
NOMINAL = {"flops_per_s": 4e12, "bytes_per_s": 2e11}
A, B = "pallas_256x256x512", "pallas_512x512x512"


def _path(mode, median, cost=None):
    entry = {"execution_mode": mode, "median_s": median}
    if cost is not None:
        entry["cost"] = cost
    return entry


def _constructed_settings() -> list[dict]:
    """`small` (float32 at highest: no GEMM of its kind, so the headline ceiling): kernel
    A compute-bound at 1.25x XLA, B bandwidth-bound, an unfused variant, one refused
    block; `large` (bfloat16: its own 2e12 ceiling), both kernels exactly on the ridge
    point of both rooflines, the best 2x slower than XLA; `tie`: a kernel exactly as fast
    as XLA with no cost figures; `xla-only`: no kernel path at all."""
    return [
        {
            "setting": "small",
            "kind": "float32_highest",
            "refused_blocks": {"1024x1024x512": "refused: VMEM"},
            "results": {
                "xla": _path("xla", 5e-3, {"flops": 3e9, "bytes_accessed": 5e7}),
                "xla_aa": _path("xla", 6e-3),
                A: _path("compiled", 4e-3, {"flops": 2e9, "bytes": 4e7}),
                B: _path("compiled", 8e-3, {"flops": 2e9, "bytes": 8e8}),
                f"pallas_unfused_{A[7:]}": _path("compiled", 6e-3),
            },
        },
        {
            "setting": "large",
            "kind": "bfloat16",
            "results": {
                "xla": _path("xla", 1e-3, {"flops": 2e9, "bytes_accessed": 1e8}),
                "xla_aa": _path("xla", 0.9e-3),
                A: _path("compiled", 2e-3, {"flops": 2e9, "bytes": 1e8}),
                B: _path("compiled", 4e-3, {"flops": 2e9, "bytes": 1e8}),
            },
        },
        {
            "setting": "tie",
            "results": {
                "xla": _path("xla", 2e-3, {"flops": 3e9, "bytes_accessed": 5e7}),
                "xla_aa": _path("xla", 2e-3),
                "pallas_rows8": _path("compiled", 2e-3),
            },
        },
        {
            "setting": "xla-only",
            "results": {
                "xla": _path("xla", 4e-3, {"flops": 3e9, "bytes_accessed": 5e7}),
                "xla_aa": _path("xla", 3e-3),
            },
        },
    ]


def _against(peak, bandwidth, attainable, limited_by, roofline, flops, bytes_):
    """One placement, every figure written out by hand in the caller."""
    return {
        "flops_per_s": peak,
        "bytes_per_s": bandwidth,
        "attainable_flops_per_s": attainable,
        "limited_by": limited_by,
        "fraction_of_roofline": roofline,
        "fraction_of_flops_ceiling": flops,
        "fraction_of_bytes_ceiling": bytes_,
    }


COMPUTE, MEMORY = "compute", "memory bandwidth"
XLA_SOURCE, TILING = "XLA cost analysis", "the kernel's tiling"


def _entry(mode, flops, bytes_, source, intensity, achieved, moved, measured, nominal=None):
    entry = {
        "execution_mode": mode,
        "flops": flops,
        "bytes": bytes_,
        "source": source,
        "intensity_flops_per_byte": intensity,
        "achieved_flops_per_s": achieved,
        "achieved_bytes_per_s": moved,
        "vs_measured_ceilings": measured,
    }
    if nominal is not None:
        entry["vs_nominal_chip"] = nominal
    return entry


# Hand-worked placements. small/A: 2e9 FLOPs, 4e7 bytes (50 FLOP/byte) in 4 ms = 5e11
# FLOP/s, 1e10 B/s; ridge 50 x 1e11 = 5e12 > 1e12: compute-bound. small/B: 2.5 FLOP/byte
# in 8 ms = 2.5e11 FLOP/s, 1e11 B/s; 2.5 x 1e11 = 2.5e11 < 1e12: bandwidth-bound, on the
# roofline. large/*: 20 FLOP/byte, 20 x 1e11 = 2e12 = its bfloat16 ceiling and 20 x 2e11
# = 4e12 = the nominal peak: ties, counted as compute.
PLACED = {
    f"small/{A}": _entry(
        "compiled", 2e9, 4e7, TILING, 50.0, 5e11, 1e10,
        _against(1e12, 1e11, 1e12, COMPUTE, 0.5, 0.5, 0.1),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.125, 0.125, 0.05),
    ),
    f"small/{B}": _entry(
        "compiled", 2e9, 8e8, TILING, 2.5, 2.5e11, 1e11,
        _against(1e12, 1e11, 2.5e11, MEMORY, 1.0, 0.25, 1.0),
        _against(4e12, 2e11, 5e11, MEMORY, 0.5, 0.0625, 0.5),
    ),
    "small/xla": _entry(
        "xla", 3e9, 5e7, XLA_SOURCE, 60.0, 6e11, 1e10,
        _against(1e12, 1e11, 1e12, COMPUTE, 0.6, 0.6, 0.1),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.15, 0.15, 0.05),
    ),
    f"large/{A}": _entry(
        "compiled", 2e9, 1e8, TILING, 20.0, 1e12, 5e10,
        _against(2e12, 1e11, 2e12, COMPUTE, 0.5, 0.5, 0.5),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.25, 0.25, 0.25),
    ),
    f"large/{B}": _entry(
        "compiled", 2e9, 1e8, TILING, 20.0, 5e11, 2.5e10,
        _against(2e12, 1e11, 2e12, COMPUTE, 0.25, 0.25, 0.25),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.125, 0.125, 0.125),
    ),
    "large/xla": _entry(
        "xla", 2e9, 1e8, XLA_SOURCE, 20.0, 2e12, 1e11,
        _against(2e12, 1e11, 2e12, COMPUTE, 1.0, 1.0, 1.0),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.5, 0.5, 0.5),
    ),
    "tie/xla": _entry(
        "xla", 3e9, 5e7, XLA_SOURCE, 60.0, 1.5e12, 2.5e10,
        _against(1e12, 1e11, 1e12, COMPUTE, 1.5, 1.5, 0.25),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.375, 0.375, 0.125),
    ),
    "xla-only/xla": _entry(
        "xla", 3e9, 5e7, XLA_SOURCE, 60.0, 7.5e11, 1.25e10,
        _against(1e12, 1e11, 1e12, COMPUTE, 0.75, 0.75, 0.125),
        _against(4e12, 2e11, 4e12, COMPUTE, 0.1875, 0.1875, 0.0625),
    ),
}  # fmt: skip


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


@pytest.mark.claims("tpu-roofline-measured-and-nominal")
def test_compiled_analysis_equals_hand_worked_figures():
    """analyse in compiled mode gives the hand-worked ratios, placements, blocking, where XLA wins.

    Ratios are XLA's median over the kernel's; each placement is checked against both the
    ceilings measured in the run (the GEMM of the setting's kind where there is one) and
    the chip's nominal figures; both sides of the roofline's min() and its ties occur.
    The blocking summary names the best and worst accepted block, their ratio and the
    refused ones; only a best kernel strictly slower than XLA stops helping (not the tie)."""
    got = bench.analyse(_constructed_settings(), CEILINGS, compiled=True, nominal=NOMINAL)
    _assert_same(
        got["ratios"],
        {
            "small/xla_vs_xla_aa": 6e-3 / 5e-3,
            f"small/{A}_vs_xla": 5e-3 / 4e-3,
            f"small/{B}_vs_xla": 5e-3 / 8e-3,
            f"small/{A}_vs_pallas_unfused_{A[7:]}": 6e-3 / 4e-3,
            "large/xla_vs_xla_aa": 0.9,
            f"large/{A}_vs_xla": 0.5,
            f"large/{B}_vs_xla": 0.25,
            "tie/xla_vs_xla_aa": 1.0,
            "tie/pallas_rows8_vs_xla": 1.0,
            "xla-only/xla_vs_xla_aa": 0.75,
        },
    )
    unplaced = {"execution_mode": "compiled", "flops": None, "bytes": None, "source": TILING}
    _assert_same(got["roofline"], {**PLACED, "tie/pallas_rows8": unplaced})
    _assert_same(
        got["optimizations"],
        [
            {
                "optimization": "small: block size 256x256x512",
                "status": "measured",
                "evidence": {A: 4e-3, B: 8e-3},
            },
            {
                "optimization": "small: bias + gelu fused into the matmul epilogue",
                "status": "measured",
                "evidence": {"fused_vs_unfused": 1.5},
            },
            {
                "optimization": "large: block size 256x256x512",
                "status": "measured",
                "evidence": {A: 2e-3, B: 4e-3},
            },
            {
                "optimization": "tie: block size rows8",
                "status": "measured",
                "evidence": {"pallas_rows8": 2e-3},
            },
        ],
    )
    _assert_same(
        got["blocking"],
        {
            "small": {
                "status": "measured",
                "best": A,
                "worst": B,
                "best_median_s": 4e-3,
                "worst_median_s": 8e-3,
                "best_vs_worst": 2.0,
                "valid": [A, B],
                "refused": ["1024x1024x512"],
            },
            "large": {
                "status": "measured",
                "best": A,
                "worst": B,
                "best_median_s": 2e-3,
                "worst_median_s": 4e-3,
                "best_vs_worst": 2.0,
                "valid": [A, B],
                "refused": [],
            },
            "tie": {
                "status": "measured",
                "best": "pallas_rows8",
                "worst": "pallas_rows8",
                "best_median_s": 2e-3,
                "worst_median_s": 2e-3,
                "best_vs_worst": 1.0,
                "valid": ["pallas_rows8"],
                "refused": [],
            },
        },
    )
    _assert_same(
        got["where_kernel_stops_helping"],
        {
            "status": "measured",
            "settings_where_xla_is_faster": [
                {"setting": "large", "best_blocks": A, "best_kernel_vs_xla": 0.5}
            ],
            "best_kernel_vs_xla": {"small": 1.25, "large": 0.5, "tie": 1.0},
        },
    )


@pytest.mark.claims("interpret-mode-claims-no-speed")
def test_interpret_analysis_keeps_only_the_controls_and_xla_placements():
    """analyse in interpret mode keeps only the A/A ratios and XLA placements, marking every kernel
    claim unmeasured.

    Without nominal figures (`nominal=None`, not a TPU v5e) no entry has a nominal
    placement; the kernels keep their intensity, the blocking summary only the accepted
    and refused blocks."""
    got = bench.analyse(_constructed_settings(), CEILINGS, compiled=False)
    _assert_same(
        got["ratios"],
        {
            "small/xla_vs_xla_aa": 6e-3 / 5e-3,
            "large/xla_vs_xla_aa": 0.9,
            "tie/xla_vs_xla_aa": 1.0,
            "xla-only/xla_vs_xla_aa": 0.75,
        },
    )
    where = got["where_kernel_stops_helping"]
    unmeasured = where["status"]
    assert sorted(where) == ["status"]
    assert unmeasured.startswith("unmeasured: the kernel ran in interpret mode")
    assert "on a TPU" in unmeasured

    def kernel(flops, bytes_, intensity):
        return {
            "execution_mode": "compiled",
            "flops": flops,
            "bytes": bytes_,
            "source": TILING,
            "intensity_flops_per_byte": intensity,
            "placement": unmeasured,
        }

    def xla_only(name):
        placed = dict(PLACED[name])
        del placed["vs_nominal_chip"]
        return placed

    _assert_same(
        got["roofline"],
        {
            f"small/{A}": kernel(2e9, 4e7, 50.0),
            f"small/{B}": kernel(2e9, 8e8, 2.5),
            "small/xla": xla_only("small/xla"),
            f"large/{A}": kernel(2e9, 1e8, 20.0),
            f"large/{B}": kernel(2e9, 1e8, 20.0),
            "large/xla": xla_only("large/xla"),
            "tie/pallas_rows8": {
                "execution_mode": "compiled",
                "flops": None,
                "bytes": None,
                "source": TILING,
            },
            "tie/xla": xla_only("tie/xla"),
            "xla-only/xla": xla_only("xla-only/xla"),
        },
    )
    _assert_same(
        got["optimizations"],
        [
            {"optimization": f"small: block sizes {[A, B]}", "status": unmeasured},
            {"optimization": "small: fused epilogue", "status": unmeasured},
            {"optimization": f"large: block sizes {[A, B]}", "status": unmeasured},
            {"optimization": "tie: block sizes ['pallas_rows8']", "status": unmeasured},
        ],
    )
    _assert_same(
        got["blocking"],
        {
            "small": {"status": unmeasured, "valid": [A, B], "refused": ["1024x1024x512"]},
            "large": {"status": unmeasured, "valid": [A, B], "refused": []},
            "tie": {"status": unmeasured, "valid": ["pallas_rows8"], "refused": []},
        },
    )


@pytest.mark.claims(
    "tiling-flops",
    "tiling-bytes-per-program",
    "tiling-bytes-times-itemsize",
    "tiling-intensity",
)
@pytest.mark.parametrize(
    ("m", "k", "n", "blocks"),
    [
        (64, 256, 128, (32, 128, 128)),
        (300, 1000, 200, (128, 128, 256)),
        (4096, 4096, 4096, (1024, 512, 1024)),
        (1, 1, 1, (8, 128, 128)),
    ],
)
def test_tiling_cost_counts_and_intensity(m, k, n, blocks):
    """matmul_tiling_cost gives 2MNK + 2MN FLOPs and the bytes of its programs, for 4 shapes.

    FLOPs 2MNK + 2MN; bytes from ceil(M/bm) x ceil(N/bn) programs, each reading its x
    and w strips and its bias entries (ragged tiles counted in bounds), the output
    written once; intensity their ratio, at itemsize 2 (bfloat16)."""
    bm, bn, _ = blocks
    gm, gn = math.ceil(m / bm), math.ceil(n / bn)
    flops = 2 * m * n * k + 2 * m * n
    bytes_ = 2 * (gn * m * k + gm * k * n + gm * n + m * n)
    cost = bench.matmul_tiling_cost(m, k, n, kernels.MatmulBlocks(*blocks), itemsize=2)
    assert cost == {"flops": float(flops), "bytes": float(bytes_), "intensity": flops / bytes_}


@pytest.mark.claims("layer-norm-whole-rows")
def test_layer_norm_cost_counts_one_read_and_one_write():
    """layer_norm_cost counts every row read and written once, gamma and beta once, and two
    float32 statistics per row: 8 operations per entry, at both itemsizes."""
    for itemsize in (2, 4):
        rows, cols = 16384, 4096
        cost = bench.layer_norm_cost(rows, cols, itemsize)
        bytes_ = itemsize * rows * cols * 2 + itemsize * cols * 2 + 4 * rows * 2
        assert cost == {
            "flops": 8.0 * rows * cols,
            "bytes": float(bytes_),
            "intensity": 8.0 * rows * cols / bytes_,
        }


@pytest.mark.claims("bench-labels-execution-mode", "interpret-mode-claims-no-speed")
def test_bench_report_declares_interpret_mode_and_claims_no_speed(evidence, interpret_report):
    """The CPU bench report labels every kernel path interpret, claims no speed and places no kernel
    on the roofline."""
    report, out, output = interpret_report
    measurements = report["measurements"]
    kernel_paths = {k: v for k, v in measurements.items() if "/pallas_" in k}
    observed = {
        "kernel_execution_mode": report["kernel_execution_mode"],
        "identity_mode": report["identity"]["kernel_execution_mode"],
        "modes": sorted({m["execution_mode"] for m in measurements.values()}),
        "kernel_paths_all_interpret": all(
            m["execution_mode"] == "interpret" for m in kernel_paths.values()
        ),
        "speed_claims": report["speed_claims"],
        "ratio_names": sorted(report["ratios"]),
        "kernel_ratios": [r for r in report["ratios"] if "pallas" in r],
        "optimization_statuses": sorted({o["status"][:10] for o in report["optimizations"]}),
        "blocking_statuses": sorted({b["status"][:10] for b in report["blocking"].values()}),
        "where_stops_helping": report["where_kernel_stops_helping"]["status"][:10],
        "kernels_placed_on_roofline": [
            k
            for k, v in report["roofline"].items()
            if "/pallas_" in k and "achieved_flops_per_s" in v
        ],
        "nominal_chip": report["nominal_chip"],
        "table_says_no_claim": "speed claims: none" in output,
        "png_bytes": out.with_suffix(".png").stat().st_size,
    }
    assert evidence.record(
        "bench on CPU: kernels interpret-mode, correctness-only, no speed claimed",
        "size tiny, 3 rounds, --mode interpret",
        observed,
        {"kernel_ratios": [], "kernels_placed_on_roofline": [], "statuses": ["unmeasured"]},
        observed["kernel_execution_mode"] == observed["identity_mode"] == "interpret"
        and observed["kernel_paths_all_interpret"]
        and len(kernel_paths) == 9
        and observed["modes"] == ["interpret", "xla"]
        and observed["speed_claims"].startswith("none")
        and not observed["kernel_ratios"]
        and observed["optimization_statuses"] == ["unmeasured"]
        and observed["blocking_statuses"] == ["unmeasured"]
        and observed["where_stops_helping"] == "unmeasured"
        and not observed["kernels_placed_on_roofline"]
        and _nominal_as_expected(observed["nominal_chip"], expected_nominal_chip())
        and observed["table_says_no_claim"]
        and observed["png_bytes"] > 0,
    )


def _nominal_as_expected(got: dict, expected: dict | None) -> bool:
    """The report's `nominal_chip`: the expected figures and a source naming them as
    nominal, or (no figures expected) only a `not applicable` status."""
    if expected is None:
        return sorted(got) == ["status"] and got["status"].startswith("not applicable")
    source = got.get("source", "")
    return (
        {k: v for k, v in got.items() if k != "source"} == expected
        and "nominal" in source
        and "197" in source
        and "819" in source
    )


def _concrete_refusal(check, *arrays) -> str:
    """The kernel check's message for concrete operands (not the bench's abstract ones)."""
    with pytest.raises(kernels.KernelInputError) as err:
        check(*arrays)
    return str(err.value)


@pytest.mark.claims("bench-labels-execution-mode", "refusal-names-its-rule")
def test_bench_checks_every_timed_path_and_follows_the_protocol(evidence, interpret_report):
    """Every timed bench path is within its error bound, compiled apart, A/A-controlled, and every
    refused block carries the kernel's own message.

    Each path's output is within its derived bound at its precision (the unfused path
    under its own: its bfloat16 intermediate alone breaks the fused kernel's bound, which
    is why it has one); compile is timed apart; the timed rounds compile nothing; the
    A/A control is present in all four settings; the identity is recorded; the refusals
    equal what `check_matmul` / `check_layer_norm` say for concrete operands."""
    report, _, _ = interpret_report
    m = report["measurements"]
    f32, bf16 = "matmul_64x256x128_float32_highest", "matmul_64x256x128_bfloat16"
    x, w, b = (jnp.ones(s, jnp.float32) for s in ((64, 256), (256, 128), (128,)))
    xb, wb, bb = (a.astype(jnp.bfloat16) for a in (x, w, b))
    refused_block = kernels.MatmulBlocks(32, 64, 128)
    rows = jnp.ones((32, 256), jnp.bfloat16), jnp.ones((256,), jnp.bfloat16)
    expected_refusals = {
        f32: {"32x64x128": _concrete_refusal(kernels.check_matmul, x, w, b, refused_block, "gelu")},
        bf16: {
            "32x64x128": _concrete_refusal(
                kernels.check_matmul, xb, wb, bb, refused_block, "gelu", "default"
            )
        },
        "layer_norm_32x256_float32": {},
        "layer_norm_32x256_bfloat16": {
            "rows8": _concrete_refusal(
                kernels.check_layer_norm, rows[0], rows[1], rows[1], kernels.RowBlocks(8)
            )
        },
    }
    observed = {
        "bound_used": {k: v["bound_used_vs_f64"] for k, v in m.items()},
        "unfused_bf16_fused_bound_used": m[f"{bf16}/pallas_unfused_32x128x128"][
            "fused_bound_used_vs_f64"
        ],
        "rows_checked": sorted({v["bound_checked_rows"] for v in m.values()}),
        "n": sorted({v["n"] for v in m.values()}),
        "timed_compiles": sorted({v["compiles_during_timed_rounds"] for v in m.values()}),
        "compile_timed_apart": all(
            v["compile_s"] > 0 and v["first_call_s"] > 0 for v in m.values()
        ),
        "aa_ratios": {k: v for k, v in report["ratios"].items() if k.endswith("xla_vs_xla_aa")},
        "identity_keys": sorted(report["identity"]),
        "block_sizes_swept": sorted(k for k in m if "/pallas_" in k and "unfused" not in k),
        "refused_blocks": report["refused_blocks"],
        "settings": report["settings"],
    }
    assert evidence.record(
        "bench protocol: every timed path correct, compiles apart, none while timing, A/A kept",
        "size tiny, 3 rounds (a test checks the bench works, never a speed)",
        observed,
        {"bound_used_max": 1.0, "timed_compiles": [0]},
        all(v <= 1.0 for v in observed["bound_used"].values())
        and observed["unfused_bf16_fused_bound_used"] > 1.0
        and observed["rows_checked"] == [32, 64]
        and observed["n"] == [3]
        and observed["timed_compiles"] == [0]
        and observed["compile_timed_apart"]
        and len(observed["aa_ratios"]) == 4
        and {
            "jax",
            "jaxlib",
            "libtpu",
            "backend",
            "device_kind",
            "kernel_execution_mode",
            "commit",
            "config_sha256",
            "bench_seed",
        }
        <= set(observed["identity_keys"])
        and observed["block_sizes_swept"]
        == sorted(
            [f"{s}/pallas_{b}" for s in (f32, bf16) for b in ("32x128x128", "64x128x256")]
            + [f"layer_norm_32x256_float32/pallas_rows{r}" for r in (8, 16)]
            + ["layer_norm_32x256_bfloat16/pallas_rows16"]
        )
        and observed["refused_blocks"] == expected_refusals
        and observed["settings"][f32]["precision"] == "highest"
        and observed["settings"][bf16]["precision"] == "default",
    )


@pytest.mark.claims("bench-seeded-shuffled-rounds")
def test_round_orders_follow_the_recorded_seed(evidence, interpret_report):
    """Each round's path order in the report is the documented seeded shuffle of its setting, and
    the A/A control does not always follow the same neighbour.

    The orders are regenerated here from the recorded seed with the documented rule
    (`numpy.random.default_rng([seed, crc32(setting)]).permutation`, once per round, of
    the paths in the order the setting lists them); over 20 rounds of 6 paths the
    predecessor of the A/A path takes several values, and another seed or another label
    gives other orders."""
    report, _, _ = interpret_report
    seed = report["path_order"]["seed"]
    recorded = report["path_order"]["round_orders"]
    regenerated = {}
    for setting in recorded:
        names = [k.split("/", 1)[1] for k in report["measurements"] if k.startswith(f"{setting}/")]
        rng = np.random.default_rng([seed, zlib.crc32(setting.encode())])
        regenerated[setting] = [[names[i] for i in rng.permutation(len(names))] for _ in range(3)]
    orders = bench_timing.round_orders(6, 20, bench_timing.order_rng(0, "s"))
    before_aa = {order[order.index(1) - 1] if order.index(1) else None for order in orders}
    observed = {
        "seed": seed,
        "identity_seed": report["identity"]["bench_seed"],
        "recorded_equals_regenerated": recorded == regenerated,
        "all_permutations": all(sorted(o) == list(range(6)) for o in orders),
        "aa_predecessors": sorted(before_aa, key=str),
        "same_seed_same_orders": orders
        == bench_timing.round_orders(6, 20, bench_timing.order_rng(0, "s")),
        "other_seed_differs": orders
        != bench_timing.round_orders(6, 20, bench_timing.order_rng(1, "s")),
        "other_label_differs": orders
        != bench_timing.round_orders(6, 20, bench_timing.order_rng(0, "t")),
    }
    assert evidence.record(
        "path order: seeded shuffles, recorded, the A/A control's neighbour varies",
        "size tiny (3 rounds); round_orders of 6 paths x 20 rounds",
        observed,
        {"aa_predecessors_at_least": 3},
        observed["seed"] == observed["identity_seed"] == 0
        and observed["recorded_equals_regenerated"]
        and observed["all_permutations"]
        and len(before_aa) >= 3
        and observed["same_seed_same_orders"]
        and observed["other_seed_differs"]
        and observed["other_label_differs"],
    )


@pytest.mark.claims("tiling-flops", "tiling-bytes-per-program", "tiling-bytes-times-itemsize")
@pytest.mark.parametrize(
    ("shape", "blocks"),
    [((64, 256, 128), (32, 128, 128)), ((300, 1000, 200), (128, 128, 256))],
)
def test_tiling_bytes_and_flops_match_an_enumeration(evidence, shape, blocks):
    """The tiling's bytes equal a Python enumeration of the K-grid, its matmul FLOPs XLA's count.

    The roofline's bytes come from the tiling: enumerate the grid's (i, j) programs and
    each one's K steps in Python, adding the in-bounds part of the x block and the w
    block each step reads, the bias entries the program reads once, and the tile it
    writes; a shape ragged in M, N and K is included. The FLOPs' matmul part must equal
    XLA's cost analysis of the plain `jnp.dot` (2 M N K)."""
    m, k, n = shape
    mb = kernels.MatmulBlocks(*blocks)
    cost = bench.matmul_tiling_cost(m, k, n, mb, itemsize=4)
    read = written = 0
    for i in range(0, m, mb.block_m):
        for j in range(0, n, mb.block_n):
            rows, cols = min(mb.block_m, m - i), min(mb.block_n, n - j)
            for s in range(0, k, mb.block_k):
                depth = min(mb.block_k, k - s)
                read += rows * depth + depth * cols  # x block, w block (in bounds)
            read += cols  # bias, once per program
            written += rows * cols
    enumerated_bytes = 4 * (read + written)
    cpu = jax.devices("cpu")[0]  # XLA's CPU count, on any machine.
    x, w = (jax.device_put(jnp.ones(s, jnp.float32), cpu) for s in ((m, k), (k, n)))
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


@pytest.mark.claims("tpu-roofline-measured-and-nominal")
def test_compiled_analysis_on_constructed_timings(evidence):
    """On constructed medians, analyse gives XLA/kernel ratios, roofline fractions, where XLA wins.

    The analysis a TPU run uses, on constructed medians: ratios are XLA time over
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
        setting("small", 1.0e-3, {"256x256x512": 0.5e-3, "512x512x512": 0.8e-3}),
        setting("large", 1.0e-3, {"256x256x512": 2.0e-3, "512x512x512": 1.5e-3}),
    ]
    got = bench.analyse(settings, ceilings, compiled=True)
    attainable = min(1e12, 2e9 / 4e7 * 1e11)
    expected_fraction = (2e9 / 0.5e-3) / attainable
    where = got["where_kernel_stops_helping"]
    observed = {
        "small_256_vs_xla": got["ratios"]["small/pallas_256x256x512_vs_xla"],
        "large_512_vs_xla": got["ratios"]["large/pallas_512x512x512_vs_xla"],
        "stops_helping": [s["setting"] for s in where["settings_where_xla_is_faster"]],
        "small_256_roofline_fraction": got["roofline"]["small/pallas_256x256x512"][
            "vs_measured_ceilings"
        ]["fraction_of_roofline"],
        "statuses": sorted({o["status"] for o in got["optimizations"]}),
    }
    assert evidence.record(
        "compiled-mode analysis on constructed timings",
        "two settings: kernel 2x faster than XLA / 1.5x slower at best",
        observed,
        {"expected_fraction": expected_fraction},
        np.isclose(observed["small_256_vs_xla"], 1.0e-3 / 0.5e-3)
        and np.isclose(observed["large_512_vs_xla"], 1.0e-3 / 1.5e-3)
        and observed["stops_helping"] == ["large"]
        and np.isclose(observed["small_256_roofline_fraction"], expected_fraction)
        and observed["statuses"] == ["measured"],
    )


CONFIG_KEYS = ("kernel", "shape", "dtype", "precision", "blocks", "activation")


@pytest.mark.claims("vmem-budget")
def test_tpu_size_sweeps_the_stated_settings_and_lists_every_kernel_it_compiles():
    """The `tpu` size times the stated shapes, dtypes and blocks, and `tpu_bench_configs` lists
    exactly the kernels it compiles: every accepted block, an unfused kernel per matmul.

    Matmuls 1024^3 to 8192^3 in bfloat16 and float32 at `highest` (float32 up to 4096^3),
    the five stated blocks, all within the block rules at these shapes and all within the
    VMEM budget except (1024, 1024, 512) for float32 at `highest` (worked out below: the
    bfloat16 split of its float32 inputs takes it over 32 MiB; on a TPU v5e Mosaic
    refused it for 34.47 MB of scoped VMEM);
    layer norms (8192, 8192), (16384, 4096), (32768, 1024) in both dtypes, the row blocks
    each accepts worked out by hand from the sublane rule (16 rows for bfloat16) and the
    32 MiB budget (double-buffered in and out blocks plus three float32 temporaries:
    28 C bytes a float32 row, 20 C a bfloat16 one). Each kernel is one dict (`kernel`,
    `shape`, `dtype`, `precision`, `blocks`, `activation`), what the export test lowers."""
    size = bench.SIZES["tpu"]
    sides = (1024, 2048, 4096, 8192)
    assert size.matmuls == tuple(
        [(s, s, s, "bfloat16", "default") for s in sides]
        + [(s, s, s, "float32", "highest") for s in sides[:3]]
    )
    blocks = [(256, 256, 512), (512, 512, 512), (1024, 1024, 512), (512, 1024, 1024)]
    assert size.matmul_blocks == (*blocks, (1024, 512, 1024))
    accepted_rows = {
        (8192, 8192, "bfloat16"): [32, 128],
        (8192, 8192, "float32"): [8, 32, 128],
        (16384, 4096, "bfloat16"): [32, 128, 256],
        (16384, 4096, "float32"): [8, 32, 128, 256],
        (32768, 1024, "bfloat16"): [32, 128, 256, 512],
        (32768, 1024, "float32"): [8, 32, 128, 256, 512],
    }
    assert sorted(size.layer_norms) == sorted(accepted_rows)

    # VMEM of float32 blocks (bm, bn, bk) at `highest`: double-buffered x, w, bias and
    # output blocks, 2 (bm bk + bk bn + bn + bm bn) 4 bytes; the float32 accumulator and
    # one step's product, 2 bm bn 4; three bfloat16 parts of each input block,
    # 3 (bm bk + bk bn) 2; a second float32 partial product, bm bn 4.
    def f32_highest_vmem(bm, bn, bk):
        return (
            2 * (bm * bk + bk * bn + bn + bm * bn) * 4
            + 2 * bm * bn * 4
            + 3 * (bm * bk + bk * bn) * 2
            + bm * bn * 4
        )

    budget = 32 * 2**20
    assert f32_highest_vmem(1024, 1024, 512) == 35_659_776 > budget
    assert f32_highest_vmem(512, 1024, 1024) == 32_514_048 <= budget
    assert f32_highest_vmem(1024, 512, 1024) == 32_509_952 <= budget
    f32_refused = {(1024, 1024, 512)}
    expected = set()
    for m, k, n, dtype, precision in size.matmuls:
        for b in size.matmul_blocks:
            if dtype == "float32" and b in f32_refused:
                refusal = bench_sizes.matmul_blocks_for(m, k, n, dtype, precision, size)
                assert "VMEM" in refusal[1]["x".join(map(str, b))], refusal
                continue
            expected.add(("matmul", (m, k, n), dtype, precision, b, "gelu"))
        expected.add(("matmul", (m, k, n), dtype, precision, size.matmul_blocks[0], "none"))
    for (rows, cols, dtype), accepted in accepted_rows.items():
        for br in accepted:
            expected.add(("layer_norm", (rows, cols), dtype, None, (br,), None))
    configs = bench.tpu_bench_configs()
    assert all(sorted(c) == sorted(CONFIG_KEYS) for c in configs)
    listed = [
        (*(c[key] for key in CONFIG_KEYS[:4]), dataclasses.astuple(c["blocks"]), c["activation"])
        for c in configs
    ]
    assert len(listed) == len(set(listed)) == len(expected) == 60
    assert set(listed) == expected


def test_resolve_size_follows_where_the_kernels_compile(monkeypatch):
    """`auto` resolves to `tpu` only where the kernels compile (a TPU backend, not forced to
    interpret), to `cpu` everywhere else; an explicit size is kept."""
    monkeypatch.delenv("KERNEL_AUDIT_MODE", raising=False)
    seen = {}
    for backend in ("cpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        seen[backend] = [bench.resolve_size("auto", i) for i in (None, True, False)]
        seen[backend].append(bench.resolve_size("tiny"))
    monkeypatch.setenv("KERNEL_AUDIT_MODE", "interpret")
    seen["tpu, forced interpret"] = bench.resolve_size("auto")
    assert seen == {
        "cpu": ["cpu", "cpu", "cpu", "tiny"],
        "tpu": ["tpu", "cpu", "tpu", "tiny"],
        "tpu, forced interpret": "cpu",
    }


@pytest.mark.skipif(ON_TPU, reason="on a TPU `--mode compiled` is valid")
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--size", "tiny", "--mode", "compiled"], "`--mode compiled` needs a TPU"),
        (["--size", "tpu"], "`--size tpu` times compiled kernels"),
    ],
)
def test_compiled_work_without_a_tpu_is_a_clear_error(tmp_path, args, needle):
    """bench --mode compiled or --size tpu without a TPU exits 2 with a one-line error saying it
    needs one, no traceback and no report."""
    result = CliRunner().invoke(main, ["bench", *args, "--out", str(tmp_path / "b.json")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2
    assert len(lines) == 1 and needle in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "b.json").exists()


# --- The timing summary, on a clock whose every duration is chosen in the test ----------

UNIT = 2.0**-10  # Seconds; durations are whole or dyadic multiples, so clock sums are exact.


class _ScriptedWork:
    """Stands in for `bench_timing`'s `time` and `jax` modules (nothing else's): its
    `perf_counter` stands still except while the work being timed runs, and then moves
    by a duration chosen in the test. `jax.jit(fn).lower(...)` of a path moves it by the
    path's `lower`, `.compile()` by its `compile`, and each `jax.block_until_ready` of a
    path's output by the next of its `calls` (the first call, then round 0, 1, ...),
    noting the path in `sequence`. Everything else is the real `jax`; the path is known
    by its function (lowering) or by its output's value (calls)."""

    def __init__(self, script: dict, fns: dict, values: dict):
        self.now = 0.0
        self.script, self.fns, self.values = script, fns, values
        self.used = dict.fromkeys(script, 0)
        self.sequence: list[str] = []

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
        self.sequence.append(name)
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
    """measure's median, p90, min, max, n and times equal `statistics` of durations set by hand,
    and its rounds call the paths in the orders given.

    The clock `bench_timing` reads is replaced (in that module only) by one on which
    lowering, compiling, the first call and every timed round of each of 3 interleaved
    paths take a duration chosen here, so each summary field has an exact expected value:
    the median and p90 (linear interpolation, `statistics.quantiles(..., method=
    "inclusive")`) of the rounds from Python's `statistics`, min, max, the count, the
    per-round list in round order (whatever the shuffled path order), and the lower,
    compile and first-call times. The calls happen first once per path in path order,
    then round by round in each round's given order. Odd and even round counts, one slow
    outlier, all-equal rounds, and a round slower by a hair (the mean 5.8x the tolerance
    away)."""
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
    orders = bench_timing.round_orders(3, repeats, np.random.default_rng(len(case)))
    got = bench_timing.measure(paths, orders, lambda _: None)
    ok = evidence.record(
        "measure calls the paths once each, then round by round in the given orders",
        f"{case}: orders {orders}",
        {"sequence": work.sequence},
        None,
        work.sequence == names + [names[i] for order in orders for i in order],
    )
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


# --- TARGET (TPU) CHECKS ------------------------------------------------------------------------

# The table's shapes with whole-dimension blocks (one program), and one ragged in M, N and K
# with blocks on the TPU tiling, so the compiled grid has several programs and K steps.
TPU_MATMULS = [
    (c.name, c.m, c.k, c.n, kernels.fit_matmul_blocks(c.m, c.k, c.n))
    for c in data.MATMUL_CASES
    if c.name in ("divides", "ragged", "long_reduction")
] + [("grid_ragged", 300, 1000, 200, kernels.MatmulBlocks(128, 128, 256))]
TPU_ROWS = [
    (c.name, c.rows, c.cols, None)
    for c in data.ROW_CASES
    if c.name in ("divides", "ragged", "long_row")
] + [("grid_ragged", 1000, 384, kernels.RowBlocks(128))]


@pytest.mark.claims("matmul-precision-named", "bounds-for-backend-and-precision")
@pytest.mark.tpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compiled_kernels_match_references_on_tpu(evidence, dtype):
    """Compiled TPU kernels are within the derived bound of float64 and twice it of interpret mode,
    2 dtypes (float32 at highest and default precision), 4 matmul and 4 layer-norm shapes."""
    ok = True
    precisions = ("highest", "default") if dtype == "float32" else ("default",)
    for name, m, k, n, blocks in TPU_MATMULS:
        x, w, b = data.matmul_operands(
            data.case_key(0, "tpu", name), m, k, n, kernels.DTYPES[dtype]
        )
        for precision in precisions:
            run = {"blocks": blocks, "activation": "gelu", "precision": precision}
            compiled = kernels.matmul_bias_act(x, w, b, interpret=False, **run)
            interpreted = kernels.matmul_bias_act(x, w, b, interpret=True, **run)
            bound = reference.matmul_error_bound(x, w, b, "gelu", dtype, precision)
            condition = f"{name} {(m, k, n)}, {dtype}, precision {precision}, mode=compiled"
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
    for name, rows, cols, blocks in TPU_ROWS:
        x, g, b = data.layer_norm_operands(
            data.case_key(0, "tpu-ln", name), rows, cols, kernels.DTYPES[dtype]
        )
        compiled = kernels.layer_norm(x, g, b, blocks=blocks, interpret=False)
        interpreted = kernels.layer_norm(x, g, b, blocks=blocks, interpret=True)
        bound = reference.layer_norm_error_bound(x, g, b, dtype)
        condition = f"{name} {(rows, cols)}, {dtype}, mode=compiled"
        ok &= evidence.within_bound(
            "compiled layer norm vs float64",
            condition,
            compiled,
            reference.layer_norm_f64(x, g, b),
            bound,
        )
        ok &= evidence.within_bound(
            "compiled vs interpreted layer norm (twice the bound)",
            condition,
            compiled,
            reference.to_f64(interpreted),
            bound,
            scale=2.0,
        )
    assert ok


def _libtpu_version():
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@pytest.mark.claims("tpu-roofline-measured-and-nominal", "bench-labels-execution-mode")
@pytest.mark.tpu
def test_tpu_bench_times_the_compiled_kernel_against_xla(evidence, tmp_path):
    """The TPU bench follows the measurement protocol on compiled kernels: every path in bound, 20
    rounds, no compile while timing, every kernel ratio and placement present, nothing faster
    than the chip can be.

    Judged on the protocol, never on a speed: the identity names the chip, jax and libtpu;
    every fraction of a roofline is positive, finite and at most 1.5 of the chip's
    nominal roofline (a figure beyond it would mean a timer that stopped before the
    device finished)."""
    report = bench.run_bench("tiny", interpret=False, repeats=20)
    (tmp_path / "bench.json").write_text(json.dumps(report))
    m = report["measurements"]
    kernel_paths = sorted(k for k in m if "/pallas_" in k and "unfused" not in k)
    placements = {
        k: {
            side: v[side]["fraction_of_roofline"]
            for side in ("vs_measured_ceilings", "vs_nominal_chip")
            if side in v
        }
        for k, v in report["roofline"].items()
    }
    nominal_known = expected_nominal_chip() is not None  # The README's rule, not the code.
    observed = {
        "kernel_execution_mode": report["kernel_execution_mode"],
        "identity": {
            key: report["identity"][key]
            for key in ("backend", "device_kind", "jax", "jaxlib", "libtpu")
        },
        "kernel_ratios": sorted(k for k in report["ratios"] if k.endswith("_vs_xla")),
        "placements": placements,
        "where_status": report["where_kernel_stops_helping"]["status"],
        "blocking": report["blocking"],
        "bound_used": {k: v["bound_used_vs_f64"] for k, v in m.items()},
        "n": sorted({v["n"] for v in m.values()}),
        "timed_compiles": sorted({v["compiles_during_timed_rounds"] for v in m.values()}),
        "ceilings": report["ceilings"],
    }
    fractions = [f for p in placements.values() for f in p.values()]
    assert evidence.record(
        "TPU bench: compiled kernels timed against XLA, on measured and nominal rooflines",
        "size tiny, 20 rounds, compiled",
        observed,
        {"nominal_roofline_fraction_max": 1.5, "bound_used_max": 1.0},
        observed["kernel_execution_mode"] == "compiled"
        and observed["identity"]["backend"] == "tpu"
        and _nominal_as_expected(report["nominal_chip"], expected_nominal_chip())
        and observed["identity"]["libtpu"] == _libtpu_version() is not None
        and observed["kernel_ratios"] == sorted(f"{k}_vs_xla" for k in kernel_paths)
        and all(
            "vs_measured_ceilings" in placements[k]
            and ("vs_nominal_chip" in placements[k]) == nominal_known
            for k in kernel_paths
        )
        and all(0.0 < f < math.inf for f in fractions)
        and all(p.get("vs_nominal_chip", 0.0) <= 1.5 for p in placements.values())
        and observed["where_status"] == "measured"
        and all(b["best_vs_worst"] >= 1.0 for b in observed["blocking"].values())
        and all(v <= 1.0 for v in observed["bound_used"].values())
        and observed["n"] == [20]
        and observed["timed_compiles"] == [0],
    )
