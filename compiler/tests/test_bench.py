"""compiler/bench_compile.py runs at small scale and writes its report.

No speed assertion: timings on a shared 2-core machine are too noisy for
one; the synthetic catalogs must however compile without errors, or the
benchmark would time an early exit.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from conftest import REPO

BENCH = REPO / "compiler" / "bench_compile.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_compile", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_runs_small_and_writes_its_report(tmp_path: Path, capsys) -> None:
    bench = _bench_module()
    report = tmp_path / "bench.json"
    data = bench.run(REPO, [1, 2], 1, report)
    assert json.loads(report.read_text()) == data
    assert [row["scale"] for row in data["rows"]] == [1, 2]
    assert [row["errors"] for row in data["rows"]] == [0, 0]
    assert data["rows"][1]["roles"] == 2 * data["rows"][0]["roles"]
    assert math.isfinite(data["slope"])
    assert "log-log slope" in capsys.readouterr().out


def test_loglog_slope_recovers_a_power_law() -> None:
    bench = _bench_module()
    assert math.isclose(bench.loglog_slope([1, 10, 100], [0.1, 1.0, 10.0]), 1.0)
    assert math.isclose(bench.loglog_slope([1, 10, 100], [0.1, 10.0, 1000.0]), 2.0)
