"""`kernel-audit bench` at the tiny size: every ratio carries its baseline, A/A
control and per-round spread, the copy ceiling is measured into a reused device
buffer (with the fresh-buffer copy beside it, and on a CPU NumPy's host copy),
and the identity names what was measured; a path the compiler refuses is recorded
as a rejected attempt and the run goes on. No speed is asserted."""

import dataclasses
import functools
import importlib.metadata

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

from kernel_audit import bench, bench_timing, checkpoint, kernels
from kernel_audit.bench_report import identity, ratio_details
from kernel_audit.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(
        main,
        ["bench", "--size", "tiny", "--repeats", "4", "--mode", "interpret", "--out", str(out)],
    )
    assert result.exit_code == 0, (result.output, repr(result.exception))
    return checkpoint.load_record(out)


def test_every_ratio_has_baseline_aa_and_spread(report):
    """Every ratio of the tiny report has a baseline sentence, its setting's A/A control and a
    per-round spread recomputed from the recorded times of its two paths."""
    ratios, details, m = report["ratios"], report["ratio_details"], report["measurements"]
    assert ratios and set(details) == set(ratios)
    for name, d in details.items():
        setting = name.split("/")[0]
        assert isinstance(d["baseline"], str) and len(d["baseline"]) > 20, name
        assert d["value"] == ratios[name]
        assert d["aa"] == ratios[f"{setting}/xla_vs_xla_aa"]
        assert len(d["rounds"]) == 4
        assert d["min"] <= d["median"] <= d["max"]
        # Recomputed from the recorded per-round times of the two paths.
        a, b = m[f"{setting}/xla"]["times_s"], m[f"{setting}/xla_aa"]["times_s"]
        assert d["rounds"] == pytest.approx([y / x for x, y in zip(a, b, strict=True)])


def test_ratio_details_of_constructed_timings():
    """A kernel ratio's rounds are t(xla) / t(kernel), round by round; A/A from the setting."""
    measurements = {
        "s/xla": {"times_s": [2.0, 4.0, 3.0]},
        "s/xla_aa": {"times_s": [2.0, 2.0, 6.0]},
        "s/pallas_32x128x128": {"times_s": [1.0, 1.0, 3.0]},
        "s/pallas_unfused_32x128x128": {"times_s": [2.0, 3.0, 3.0]},
    }
    ratios = {
        "s/xla_vs_xla_aa": 1.0,
        "s/pallas_32x128x128_vs_xla": 3.0,
        "s/pallas_32x128x128_vs_pallas_unfused_32x128x128": 3.0,
    }
    d = ratio_details(ratios, measurements)
    assert d["s/xla_vs_xla_aa"]["rounds"] == [1.0, 0.5, 2.0]
    assert d["s/pallas_32x128x128_vs_xla"]["rounds"] == [2.0, 4.0, 1.0]
    assert d["s/pallas_32x128x128_vs_xla"]["median"] == 2.0
    assert d["s/pallas_32x128x128_vs_xla"]["aa"] == 1.0
    assert "XLA" in d["s/pallas_32x128x128_vs_xla"]["baseline"]
    assert d["s/pallas_32x128x128_vs_pallas_unfused_32x128x128"]["rounds"] == [2.0, 3.0, 1.0]
    assert "epilogue" in d["s/pallas_32x128x128_vs_pallas_unfused_32x128x128"]["baseline"]


def test_copy_ceiling_uses_a_reused_buffer_with_the_host_copy_only_on_a_cpu(report):
    """The copy ceiling is XLA's copy into a reused (donated, aliased) buffer, timed beside the
    fresh-buffer copy; NumPy's host copy and its A/A stand beside them on a CPU only."""
    ceilings = report["ceilings"]
    copy = ceilings["copy"]
    host = jax.default_backend() == "cpu"
    # The donated output aliased its input (checked by address; a backend that gives no
    # address leaves it None, and only off a CPU).
    assert copy["xla_reused_buffer"] is True or (not host and copy["xla_reused_buffer"] is None)
    assert ceilings["bytes_per_s"] == copy["xla_reused"]["bytes_per_s"]
    timed = ("xla_reused", "xla_fresh") + (("numpy_copy", "numpy_copy_aa") if host else ())
    for name in timed:
        path = copy[name]
        assert path["n"] == len(path["times_s"]) >= 5, name
        assert path["bytes_per_s_min"] <= path["bytes_per_s"] <= path["bytes_per_s_max"], name
        assert path["bytes_per_s"] == pytest.approx(copy["bytes_per_call"] / path["median_s"])
    assert copy["bytes_per_call"] == 2 * 4 * 4 * 2**20 // 4  # tiny: a 4 MiB float32 array
    assert copy["xla_reused_vs_xla_fresh"] == pytest.approx(
        copy["xla_reused"]["bytes_per_s"] / copy["xla_fresh"]["bytes_per_s"]
    )
    assert "reused" in ceilings["measured_with"]
    if host:
        assert copy["numpy_copy_vs_numpy_copy_aa"] == pytest.approx(
            copy["numpy_copy"]["bytes_per_s"] / copy["numpy_copy_aa"]["bytes_per_s"]
        )
        assert "NumPy" in ceilings["measured_with"]
    else:
        assert copy["numpy_copy"].startswith("left out")
        assert "numpy_copy_aa" not in copy


def test_gemm_ceilings_are_kept_per_kind(report):
    """The tiny size times one GEMM per arithmetic kind; the headline FLOP/s is the first's, and
    each is 2 n^3 over its recorded median."""
    ceilings, timed = report["ceilings"], report["ceiling_measurements"]
    assert sorted(timed) == ["ceiling_gemm_128_bfloat16", "ceiling_gemm_128_float32_highest"]
    by_kind = ceilings["flops_per_s_by_kind"]
    assert sorted(by_kind) == ["bfloat16", "float32_highest"]
    for kind, value in by_kind.items():
        assert value == pytest.approx(2.0 * 128**3 / timed[f"ceiling_gemm_128_{kind}"]["median_s"])
    assert ceilings["flops_per_s"] == by_kind["float32_highest"]


def _installed(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_identity_names_versions_device_and_mode(report):
    """The identity records jax, jaxlib and libtpu versions (None when libtpu is absent), the
    device kind, backend and execution mode, and its digest changes with each field of the size
    and with the seed alone."""
    ident = report["identity"]
    import jaxlib

    assert ident["jax"] == jax.__version__ and ident["jaxlib"] == jaxlib.__version__
    assert ident["libtpu"] == (_installed("libtpu") or _installed("libtpu-nightly"))
    assert ident["device_kind"] == jax.devices()[0].device_kind
    assert ident["backend"] == jax.default_backend()
    assert ident["kernel_execution_mode"] == report["kernel_execution_mode"] == "interpret"
    size = dataclasses.replace(bench.SIZES["tiny"], repeats=4)
    base = identity("tiny", size, True, 0)["config_sha256"]
    assert ident["config_sha256"] == base
    changed = {"seed": identity("tiny", size, True, 1)["config_sha256"]}
    for field in dataclasses.fields(size):
        value = getattr(size, field.name)
        other = (
            (not value)
            if isinstance(value, bool)
            else (value + 1 if isinstance(value, int) else value[:-1])
        )
        moved = dataclasses.replace(size, **{field.name: other})
        changed[field.name] = identity("tiny", moved, True, 0)["config_sha256"]
    assert base not in changed.values() and len(set(changed.values())) == len(changed)


F32 = "matmul_64x256x128_float32_highest"
BF16 = "matmul_64x256x128_bfloat16"
VMEM_ERROR = (
    "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem.\n"
    "Used 34.47M of 32.00M vmem. Exceeded vmem capacity by 2.47M."
)


class _RefusingJax:
    """`bench_timing`'s view of `jax`, in which the compiler refuses one configuration:
    the fused matmul kernel at blocks (64, 128, 256) on float32 operands lowers, but its
    `compile()` raises `JaxRuntimeError` with a scoped-VMEM overflow (the error a TPU
    gave). Everything else is the real `jax`."""

    def __init__(self) -> None:
        self.refused = 0

    def __getattr__(self, name):
        return getattr(jax, name)

    def jit(self, fn, **kwargs):
        jitted = jax.jit(fn, **kwargs)
        keywords = getattr(fn, "keywords", {}) if isinstance(fn, functools.partial) else {}
        if keywords.get("blocks") != kernels.MatmulBlocks(64, 128, 256):
            return jitted
        owner = self

        class Refusing:
            def lower(self, *args):
                lowered = jitted.lower(*args)
                if args[0].dtype != jnp.float32:
                    return lowered

                class Refused:
                    def compile(self):
                        owner.refused += 1
                        raise jax.errors.JaxRuntimeError(VMEM_ERROR)

                return Refused()

        return Refusing()


def test_a_path_the_compiler_refuses_is_recorded_and_the_run_goes_on(monkeypatch):
    """One kernel configuration whose compile raises (as Mosaic's scoped-VMEM overflow did
    on a TPU) is a rejected attempt: the report lists it under `failed_paths` with its
    error on one line, leaves it out of the timings, round orders and roofline, and every
    other path of that setting and of the run is still timed and checked."""
    fake = _RefusingJax()
    monkeypatch.setattr(bench_timing, "jax", fake)
    monkeypatch.setattr(
        bench,
        "measure_ceilings",
        lambda size, seed, log: {"flops_per_s": 1e12, "bytes_per_s": 1e11, "measurements": {}},
    )
    logged = []
    report = bench.run_bench("tiny", interpret=True, repeats=2, log=logged.append)
    assert fake.refused == 1
    failed = report["failed_paths"]
    assert sorted(failed) == sorted(report["settings"])
    assert {s: sorted(p) for s, p in failed.items() if p} == {F32: ["pallas_64x128x256"]}
    error = failed[F32]["pallas_64x128x256"]
    assert error.startswith("JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory")
    assert "\n" not in error and "34.47M of 32.00M" in error
    assert any("pallas_64x128x256" in line and "FAILED" in line for line in logged)
    m = report["measurements"]
    # The refused path is gone from everything measured; its setting's other paths and the
    # same block in bfloat16 were timed and are within their bounds.
    assert f"{F32}/pallas_64x128x256" not in m
    assert f"{F32}/pallas_64x128x256" not in report["roofline"]
    for path in ("xla", "xla_aa", "pallas_32x128x128", "pallas_unfused_32x128x128"):
        assert m[f"{F32}/{path}"]["n"] == 2 and m[f"{F32}/{path}"]["bound_used_vs_f64"] <= 1.0
    assert m[f"{BF16}/pallas_64x128x256"]["n"] == 2
    assert len(m) == 16  # The 17 paths of the tiny size, less the refused one.
    orders = report["path_order"]["round_orders"][F32]
    assert len(orders) == 2 and all(
        sorted(o) == ["pallas_32x128x128", "pallas_unfused_32x128x128", "xla", "xla_aa"]
        for o in orders
    )
    assert report["blocking"][F32]["valid"] == ["pallas_32x128x128"]
    assert any("failed_paths" in note for note in report["notes"])
    assert f"{F32}/pallas_64x128x256: JaxRuntimeError" in bench._table(report)


def test_analysis_survives_a_failed_baseline_or_fused_path():
    """Compiled analysis of a setting whose XLA path failed marks its kernel verdicts
    unmeasured (no baseline) instead of stopping; a setting whose fused kernel failed
    keeps its other ratios and gives no fused-vs-unfused ratio."""

    def path(median):
        return {"execution_mode": "compiled", "median_s": median, "times_s": [median]}

    settings = [
        {"setting": "no_xla", "results": {"xla_aa": path(1.0), "pallas_a": path(2.0)}},
        {
            "setting": "no_fused",
            "results": {
                "xla": path(1.0),
                "xla_aa": path(1.0),
                "pallas_b": path(0.5),
                "pallas_unfused_a": path(0.8),
            },
        },
    ]
    got = bench.analyse(settings, {"flops_per_s": 1e12, "bytes_per_s": 1e11}, compiled=True)
    assert got["blocking"]["no_xla"]["status"].startswith("unmeasured: XLA's path")
    assert got["ratios"] == {"no_fused/xla_vs_xla_aa": 1.0, "no_fused/pallas_b_vs_xla": 2.0}
    assert got["blocking"]["no_fused"]["best"] == "pallas_b"
