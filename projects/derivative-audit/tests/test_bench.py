"""The bench still works: a tiny run through the CLI writes a complete report
whose paths agree with each other, whose matched unroll count is the fewest
that reaches the implicit gradient's accuracy, and whose every ratio names its
baseline, its per-round spread and its A/A control. No speed is asserted (a
test is not a bench)."""

import json

import pytest
from click.testing import CliRunner

from derivative_audit.bench_stats import per_round, ratio_detail
from derivative_audit.cli import main

RATIOS = {"implicit_vs_unrolled", "implicit_vs_unrolled_200", "hvp_vs_full_hessian"}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--size", "tiny", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, json.loads(out.read_text())


def test_bench_tiny_writes_a_complete_report(bench_run):
    out, report = bench_run
    assert set(report) >= {"identity", "measurements", "ratios", "agreement", "ratio_details"}
    assert set(report["ratios"]) == RATIOS | {"hvp_vs_hvp_aa", "implicit_vs_implicit_aa"}
    for name, m in report["measurements"].items():
        assert m["n"] == 3 and m["compile_s"] > 0 and m["median_s"] > 0, name
    # The paths compute the same derivatives (float32): agreement before any timing.
    assert report["agreement"]["implicit_vs_unrolled_max_rel"] < 1e-4
    assert report["agreement"]["implicit_vs_unrolled_200_max_rel"] < 1e-4
    assert report["agreement"]["hvp_vs_full_max_rel"] < 1e-5
    assert "no speed claim" in report["verdicts"][0]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_bench_report_matches_the_unroll_to_the_implicit_accuracy(bench_run):
    _, report = bench_run
    settings, error = report["settings"], report["gradient_error_vs_float64"]
    k = settings["unrolled_matched_iterations"]
    search = {int(n): e for n, e in settings["unrolled_search"].items()}
    # The matched count reaches the implicit accuracy, one fewer does not (when
    # it was tried), and the timed K-step program has the error the search found.
    assert 1 <= k < settings["unrolled"]
    assert search[k] <= error["implicit"]
    assert all(e > error["implicit"] for n, e in search.items() if n < k)
    assert error["unrolled"] == pytest.approx(search[k], rel=1e-3, abs=1e-9)
    assert error["unrolled_200"] <= error["implicit"]
    assert report["ratio_details"]["implicit_vs_unrolled"]["unrolled_iterations"] == k
    assert report["ratio_details"]["implicit_vs_unrolled_200"]["unrolled_iterations"] == 200
    for name in RATIOS:
        d = report["ratio_details"][name]
        assert d["baseline"] and isinstance(d["baseline"], str)
        assert len(d["rounds"]) == 3 and len(d["aa_rounds"]) == 3
        assert d["min"] <= d["median"] <= d["max"]
        assert d["aa_min"] <= d["aa"] <= d["aa_max"]
        assert d["median"] == report["ratios"][name]
    assert report["ratio_details"]["hvp_vs_full_hessian"]["aa"] == report["ratios"]["hvp_vs_hvp_aa"]


def test_ratio_detail_pairs_rounds_and_keeps_the_spread():
    rounds = per_round([4.0, 9.0, 2.0], [2.0, 3.0, 2.0])
    assert rounds == [2.0, 3.0, 1.0]
    d = ratio_detail("a loop", rounds, [1.0, 0.5, 2.0], "fast")
    assert (d["min"], d["median"], d["max"]) == (1.0, 2.0, 3.0)
    assert (d["aa_min"], d["aa"], d["aa_max"]) == (0.5, 1.0, 2.0)
    assert d["baseline"] == "a loop" and d["aa_path"] == "fast"
    with pytest.raises(ValueError, match="equally long"):
        per_round([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="above 0"):
        per_round([1.0, 0.0], [1.0, 2.0])
