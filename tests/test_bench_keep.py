"""`scripts/bench_keep.py`: where a kept bench report was taken, and how it is kept.

The `/proc/cpuinfo` texts below are written by hand (two processors of
different vendors), so every expected field is read off the text itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_keep import cpu_record, keep  # noqa: E402
from bench_readme import render  # noqa: E402
from bench_summary import cpu_label  # noqa: E402

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 1
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: a second processor that must not be read
"""

AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
stepping\t: 1
flags\t\t: fpu sse2 fma avx2 avx512fake
"""


def test_the_cpu_record_names_vendor_model_and_vector_extensions():
    intel = cpu_record(INTEL)
    assert intel == {
        "vendor": "GenuineIntel",
        "model_name": "Intel(R) Xeon(R) Processor",
        "family": "6",
        "model": "167",
        "stepping": "1",
        "vector_flags": ["avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"],
    }
    amd = cpu_record(AMD)
    # A flag that only starts like an extension's name is not that extension.
    assert amd["vector_flags"] == ["avx2", "fma"] and amd["family"] == "25"
    assert cpu_label({"cpu": intel}) != cpu_label({"cpu": amd})
    assert cpu_label({"cpu": amd}) == "AMD EPYC 7B13 (family 25 model 1; avx2 fma)"
    assert cpu_label(None) == cpu_label({}) == "CPU not recorded"
    # A machine whose cpuinfo has no x86 fields still gets a record, without flags.
    assert cpu_record("processor : 0\nBogoMIPS : 50\n") == {"vector_flags": []}


def _bench(tmp_path: Path, speedup: float) -> Path:
    path = tmp_path / f"bench-{speedup}.json"
    path.write_text(json.dumps({"ratios": {"speedup": speedup}, "ratio_details": {}}))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "toy"
    (folder / "benchmarks").mkdir(parents=True)
    (folder / "README.md").write_text("# toy\n\n## Performance\n\nProse.\n")
    return folder


def test_reports_are_kept_under_the_next_number_with_their_host(tmp_path, project):
    host = {"cpu": cpu_record(AMD), "cores": 2}
    for n, value in enumerate((4.0, 5.0, 6.0), start=1):
        assert keep(project, _bench(tmp_path, value), host, "run").name == f"run-{n}.json"
    # A gap in the numbers: the next one is past the highest, nothing is overwritten.
    (project / "benchmarks" / "rerun-7.json").write_text("{}")
    intel = {"cpu": cpu_record(INTEL), "cores": 2}
    kept = keep(project, _bench(tmp_path, 5.5), intel, "rerun")
    assert kept.name == "rerun-8.json"
    assert json.loads(kept.read_text())["host"] == intel
    assert json.loads(kept.read_text())["ratios"] == {"speedup": 5.5}
    assert not list(project.glob("benchmarks/*.partial"))
    (project / "benchmarks" / "rerun-7.json").unlink()

    block = render(project)
    assert (
        "CPU A: AMD EPYC 7B13 (family 25 model 1; avx2 fma) (`run-1.json` to `run-3.json`)" in block
    )
    # A rerun on a CPU none of the runs had is named in full, not given a letter.
    assert "rerun-8.json: the reports do not record the commit, Intel(R) Xeon(R)" in block
    assert "| rerun-8 |" in block and "CPU B" not in block
    assert "| `speedup` |  | 4 to 6 |" in block

    # Runs on a second CPU: one pooled expected range, each CPU's own span.
    for value in (9.0, 10.0):
        keep(project, _bench(tmp_path, value), intel, "run")
    block = render(project)
    assert "CPU B: Intel(R) Xeon(R) Processor (family 6 model 167;" in block
    assert "(`run-4.json`, `run-5.json`)" in block
    assert "| `speedup` |  | A: 4 to 6; B: 9 to 10 |" in block
    assert "rerun-8.json: the reports do not record the commit, CPU B" in block


@pytest.mark.parametrize("content", ["not json", '{"ratios": [1]}', "[]"])
def test_a_file_that_is_not_a_bench_report_is_refused_and_nothing_kept(tmp_path, project, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match="bench report"):
        keep(project, bad, {}, "rerun")
    assert not list((project / "benchmarks").iterdir())
