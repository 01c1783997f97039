"""`kernel-audit bench` at the tiny size: every ratio carries its baseline, A/A
control and per-round spread, and the copy ceiling is measured into a reused
buffer with the fresh-buffer and NumPy copies beside it. No speed is asserted."""

import pytest
from click.testing import CliRunner

from kernel_audit import checkpoint
from kernel_audit.bench_report import ratio_details
from kernel_audit.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(
        main,
        ["bench", "--size", "tiny", "--repeats", "4", "--mode", "interpret", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    return checkpoint.load_record(out)


def test_every_ratio_has_baseline_aa_and_spread(report):
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
        "s/pallas_16x16x16": {"times_s": [1.0, 1.0, 3.0]},
        "s/pallas_unfused_16x16x16": {"times_s": [2.0, 3.0, 3.0]},
    }
    ratios = {
        "s/xla_vs_xla_aa": 1.0,
        "s/pallas_16x16x16_vs_xla": 3.0,
        "s/pallas_16x16x16_vs_pallas_unfused_16x16x16": 3.0,
    }
    d = ratio_details(ratios, measurements)
    assert d["s/xla_vs_xla_aa"]["rounds"] == [1.0, 0.5, 2.0]
    assert d["s/pallas_16x16x16_vs_xla"]["rounds"] == [2.0, 4.0, 1.0]
    assert d["s/pallas_16x16x16_vs_xla"]["median"] == 2.0
    assert d["s/pallas_16x16x16_vs_xla"]["aa"] == 1.0
    assert "XLA" in d["s/pallas_16x16x16_vs_xla"]["baseline"]
    assert d["s/pallas_16x16x16_vs_pallas_unfused_16x16x16"]["rounds"] == [2.0, 3.0, 1.0]
    assert "epilogue" in d["s/pallas_16x16x16_vs_pallas_unfused_16x16x16"]["baseline"]


def test_copy_ceiling_uses_a_reused_buffer_with_numpy_beside_it(report):
    ceilings = report["ceilings"]
    copy = ceilings["copy"]
    assert copy["xla_reused_buffer"] is True  # The donated output aliased its input.
    assert ceilings["bytes_per_s"] == copy["xla_reused"]["bytes_per_s"]
    for name in ("xla_reused", "xla_fresh", "numpy_copy", "numpy_copy_aa"):
        path = copy[name]
        assert path["n"] == len(path["times_s"]) >= 5, name
        assert path["bytes_per_s_min"] <= path["bytes_per_s"] <= path["bytes_per_s_max"], name
        assert path["bytes_per_s"] == pytest.approx(copy["bytes_per_call"] / path["median_s"])
    assert copy["bytes_per_call"] == 2 * 4 * 4 * 2**20 // 4  # tiny: a 4 MiB float32 array
    assert copy["numpy_copy_vs_numpy_copy_aa"] == pytest.approx(
        copy["numpy_copy"]["bytes_per_s"] / copy["numpy_copy_aa"]["bytes_per_s"]
    )
    assert "reused" in ceilings["measured_with"] and "NumPy" in ceilings["measured_with"]
