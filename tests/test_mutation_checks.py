"""Negative controls for the mutation check (`scripts/mutate.py`, `mutants.py`).

On copies of the toy project (`fixtures/toy-project`): its stage-2 test
checks one mean, `mean([1, 2, 6]) == 3`, so the mutant `/` -> `//` survives
(9 // 3 is 3.0 too) while `*`, `+`, `-`, `%` and `**` are killed. The tests
check that each outcome is reported as such, that a declared equivalent is
counted apart, that the score follows the counts, that keys survive edits
elsewhere in the file, that the sample is fixed by its seed, that a report
goes stale when a covered file changes (and only then), that the rerun of
reported kills fails on a kill that does not reproduce, that its draw
follows the stage's code hash alone (the same code, the same draw), and that a
kill counts only when it repeats in each of `KILL_RUNS` runs.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import mutants  # noqa: E402
import mutate  # noqa: E402
from scratch import stage_tests  # noqa: E402

TOY = Path(__file__).resolve().parent / "fixtures" / "toy-project"
FLOOR = (
    "src/toy_project/core.py::mean: `return total(values) / len(values)` => "
    "`return total(values) // len(values)`"
)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TOY, tmp_path / "toy-project"))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_stage_mutates_only_the_definitions_holding_its_regions(toy: Path):
    one = mutants.stage_mutants(toy, "1")
    two = mutants.stage_mutants(toy, "2")
    assert {m.function for m in one.mutants} == {"total"}
    assert {m.function for m in two.mutants} == {"mean"}
    assert len({m.key for m in one.mutants}) == len(one.mutants), "keys are unique"
    # Every key names a real change of one line of the file.
    assert all(m.before != m.after for m in one.mutants + two.mutants)
    assert FLOOR in {m.key for m in two.mutants}


def test_listed_targets_join_and_unknown_ones_are_refused(toy: Path):
    (toy / "mutation.toml").write_text(
        '[stages."1"]\ntargets = ["src/toy_project/core.py::mean"]\n', encoding="utf-8"
    )
    assert {t.name for t in mutants.stage_targets(toy, "1")} == {"total", "mean"}
    (toy / "mutation.toml").write_text(
        '[stages."1"]\ntargets = ["src/toy_project/core.py::median"]\n', encoding="utf-8"
    )
    with pytest.raises(ValueError, match="median"):
        mutants.stage_targets(toy, "1")


def test_keys_survive_an_edit_elsewhere_in_the_file(toy: Path):
    before = [m.key for m in mutants.stage_mutants(toy, "2").mutants]
    core = toy / "src/toy_project/core.py"
    core.write_text(
        core.read_text(encoding="utf-8") + "\n\ndef spare(x):\n    return x + 1\n", "utf-8"
    )
    assert [m.key for m in mutants.stage_mutants(toy, "2").mutants] == before


def test_the_sample_is_fixed_by_its_seed_and_is_a_subset(toy: Path):
    every = {m.key for m in mutants.stage_mutants(toy, "2").mutants}
    first = mutants.stage_mutants(toy, "2", sample=3)
    again = mutants.stage_mutants(toy, "2", sample=3)
    assert first.sampled and first.total == len(every) > 3
    assert [m.key for m in first.mutants] == [m.key for m in again.mutants]
    assert {m.key for m in first.mutants} < every


def test_survivor_killed_and_score_are_reported(toy: Path):
    status = mutate.run_stages(toy, ["2"], jobs=1, survivors_only=False)
    report = json.loads((toy / mutants.REPORT).read_text(encoding="utf-8"))["stages"]["2"]
    outcomes = {r["key"]: r["outcome"] for r in report["mutants"]}
    assert outcomes[FLOOR] == mutate.SURVIVED
    times = FLOOR.replace("// len", "* len")
    assert outcomes[times] == mutate.KILLED
    assert report["survived"] >= 1 and report["killed"] >= 4
    judged = report["mutants_run"] - report["equivalent"]
    assert report["score"] == round((report["killed"] + report["timed_out"]) / judged, 4)
    assert report["score"] < 1 and status == 1, "a stage under 0.9 fails the run"
    assert report["kill_runs_required"] == mutate.KILL_RUNS == 3
    killed = [r for r in report["mutants"] if r["outcome"] == mutate.KILLED]
    assert killed and all(r["kill_runs"] == mutate.KILL_RUNS for r in killed)
    assert report["code_hash"] == mutants.stage_hash(
        toy, "2", stage_tests(toy, "2"), mutants.stage_targets(toy, "2")
    )


def test_a_declared_equivalent_is_counted_apart(toy: Path):
    (toy / "mutation.toml").write_text(
        f'[[equivalent]]\nstage = "2"\nkey = "{FLOOR}"\nwhy = "the test mean is whole"\n',
        encoding="utf-8",
    )
    mutate.run_stages(toy, ["2"], jobs=1, survivors_only=False)
    report = json.loads((toy / mutants.REPORT).read_text(encoding="utf-8"))["stages"]["2"]
    row = next(r for r in report["mutants"] if r["key"] == FLOOR)
    assert row["outcome"] == mutate.EQUIVALENT and row["detail"] == "the test mean is whole"
    assert report["equivalent"] == 1
    assert report["score"] == round(report["killed"] / (report["mutants_run"] - 1), 4)


def test_an_edit_while_the_mutants_are_listed_writes_no_report(toy: Path, monkeypatch):
    """`mutation.toml` edited between the listing of the mutants and the stage hash (as
    when a setting changes while a run starts): the run refuses, and writes nothing;
    the same run without the edit writes its report."""
    listed = mutate.stage_mutants

    def listed_then_edited(project: Path, stage: str):
        found = listed(project, stage)
        (project / "mutation.toml").write_text("semantic_operators = true\n", encoding="utf-8")
        return found

    monkeypatch.setattr(mutate, "stage_mutants", listed_then_edited)
    assert mutate.run_stages(toy, ["2"], jobs=1, survivors_only=False) == 1
    assert not (toy / mutants.REPORT).exists()
    monkeypatch.setattr(mutate, "stage_mutants", listed)
    mutate.run_stages(toy, ["2"], jobs=1, survivors_only=False)
    assert (toy / mutants.REPORT).is_file()


def test_a_report_goes_stale_when_a_covered_file_changes_and_only_then(toy: Path):
    def hashes() -> dict[str, str]:
        return {
            s: mutants.stage_hash(toy, s, stage_tests(toy, s), mutants.stage_targets(toy, s))
            for s in ("1", "2")
        }

    first = hashes()
    test_file = toy / "tests/test_stage_2_mean.py"
    edit(test_file, "== 3.0", "== 3.0  # checked")
    test_file.write_text('"""The mean, checked."""\n' + test_file.read_text(encoding="utf-8"))
    assert hashes() == first, "a comment or a docstring changes nothing that runs"
    edit(test_file, "== 3.0", "== 3.0 + 0.0")
    second = hashes()
    assert second["2"] != first["2"] and second["1"] == first["1"]
    (toy / "mutation.toml").write_text("# nothing declared\n", encoding="utf-8")
    assert hashes() == second, "a config that declares nothing changes no stage"
    (toy / "mutation.toml").write_text(
        '[[equivalent]]\nstage = "2"\nkey = "k"\nwhy = "w"\n', encoding="utf-8"
    )
    third = hashes()
    assert third["2"] != second["2"] and third["1"] == second["1"], "stage 2's entry only"


def test_a_helper_module_the_tests_reach_is_covered_and_no_other(toy: Path):
    """A helper in tests/ imported by a stage's test, one run by file name from a
    helper it imports (a subprocess script) and one that nothing reaches: editing
    either of the first two stales stage 2 only; the third changes nothing."""

    def hashes() -> dict[str, str]:
        return {
            s: mutants.stage_hash(toy, s, stage_tests(toy, s), mutants.stage_targets(toy, s))
            for s in ("1", "2")
        }

    tests = toy / "tests"
    (tests / "expected.py").write_text(
        "from pathlib import Path\n\nMEAN = 3.0\nSCRIPT = Path(__file__).with_name('worker.py')\n",
        encoding="utf-8",
    )
    (tests / "worker.py").write_text("print(3.0)\n", encoding="utf-8")
    (tests / "unused.py").write_text("VALUE = 1\n", encoding="utf-8")
    edit(
        tests / "test_stage_2_mean.py",
        "from toy_project",
        "from expected import MEAN\nfrom toy_project",
    )
    assert mutants.helper_modules(toy, stage_tests(toy, "2")) == {
        "tests/expected.py",
        "tests/worker.py",
    }
    assert mutants.helper_modules(toy, stage_tests(toy, "1")) == set()
    first = hashes()
    for helper, old, new in [
        ("expected.py", "MEAN = 3.0", "MEAN = 3.5"),
        ("worker.py", "print(3.0)", "print(3.5)"),
    ]:
        before = hashes()
        edit(tests / helper, old, new)
        after = hashes()
        assert after["2"] != before["2"] and after["1"] == before["1"], helper
    edited = hashes()
    assert edited["2"] != first["2"]
    (tests / "unused.py").write_text("VALUE = 2\n", encoding="utf-8")
    assert hashes() == edited, "a helper no test reaches is no stage's identity"


def test_the_rerun_of_reported_kills_fails_on_one_that_does_not_reproduce(
    toy: Path, tmp_path: Path
):
    from schedule import Worker

    # A forged report that calls the surviving mutant killed.
    floor = next(m for m in mutants.stage_mutants(toy, "2").mutants if m.key == FLOOR)
    rows = [{"key": FLOOR, "operator": floor.operator, "line": floor.line, "outcome": "killed"}]
    (toy / mutants.REPORT).write_text(
        json.dumps({"stages": {"2": {"mutants": rows}}}), encoding="utf-8"
    )
    work = tmp_path / "work"
    jobs = mutate.confirm_jobs([toy], 1, "seed", work, tmp_path / "cache")
    assert [j.name for j in jobs] == [f"toy-project/2: {FLOOR}"]
    worker = Worker(tmp_path / "cache")
    try:
        result = jobs[0].action(worker)
    finally:
        worker.close()
    assert result.outcome == mutate.SURVIVED


@pytest.mark.parametrize(
    ("codes", "outcome", "runs"),
    [
        ([1, 1, 1], "killed", 3),  # killed each time
        ([1, 0], "survived", 0),  # the failing test passes when run again
        ([1, 1, 0], "survived", 0),  # ... or on the third run
        ([0], "survived", 0),  # never killed: one run
        ([2, 2, 2], "killed", 3),  # a collection error, each time
    ],
)
def test_a_kill_counts_only_when_it_repeats_in_each_run(
    toy: Path, tmp_path: Path, monkeypatch, codes, outcome, runs
):
    """The run that kills is followed by reruns of its first failing test (the
    stage's tests after a collection error); one that passes makes the mutant a
    survivor, whose detail says how many runs killed it. The pytest runs are
    scripted, so the worker needs no warm server: a stand-in holds its copy."""
    from types import SimpleNamespace

    from scratch import Run

    script = iter(codes)
    asked: list[list[str]] = []

    def fake_pytest(copy, nodes, cache, timeout=0, runner=None, **_):
        asked.append(list(nodes))
        code = next(script)
        output = {
            0: "1 passed",
            1: "FAILED tests/test_stage_2.py::test_mean[3] - assert 4 == 3",
            2: "ERROR tests/test_stage_2.py - ImportError: collection error",
        }[code]
        return Run(code, output, 0.5)

    monkeypatch.setattr(mutate, "run_pytest", fake_pytest)
    mutant = mutants.stage_mutants(toy, "2").mutants[0]
    copies = mutate.Copies(toy, tmp_path)
    tests = stage_tests(toy, "2")
    job = mutate.mutant_job(toy, copies, tests, tmp_path / "cache", 60, mutant, 1.0)
    result = job.action(SimpleNamespace(runner=None))
    assert (result.outcome, result.kill_runs) == (outcome, runs)
    assert len(asked) == len(codes), "a run too many or too few"
    if codes[0] == 1:
        assert asked[1:] == [["tests/test_stage_2.py::test_mean[3]"]] * (len(codes) - 1)
    if codes[0] == 2:
        assert asked[1:] == [tests] * (len(codes) - 1)
    if outcome == "survived" and codes[0] != 0:
        assert result.detail.startswith(f"killed in {len(codes) - 1} of {len(codes)} runs")


@pytest.mark.parametrize(
    ("output", "node"),
    [
        ("FAILED tests/t.py::test_a - assert 4 == 3", "tests/t.py::test_a"),
        ("FAILED tests/t.py::test_a[3-x] - assert 4 == 3", "tests/t.py::test_a[3-x]"),
        # `ids=str` of a tuple: spaces inside the brackets, and brackets in the message.
        ("FAILED tests/t.py::test_a[(4, 1)] - ValueError: [4]", "tests/t.py::test_a[(4, 1)]"),
        ("x\nFAILED tests/t.py::test_a[(4,), (3, 13)]\n", "tests/t.py::test_a[(4,), (3, 13)]"),
        ("ERROR tests/t.py - ImportError: x", "tests/t.py"),
        ("1 passed", ""),
    ],
)
def test_the_first_failure_is_a_whole_node_id(output, node):
    """A kill is rerun on its first failing node, which must be the node as pytest
    names it, parameter id and all, or the rerun finds no test."""
    from scratch import Run

    assert Run(1, output, 0.1).first_failure == node


def test_the_rerun_draws_by_the_stage_code_hash_alone(toy: Path, tmp_path: Path):
    """The matrix's verdict must not depend on the commit: the kills it reruns are
    drawn from the stage's code hash (and an optional seed), nothing else."""
    two = [m for m in mutants.stage_mutants(toy, "2").mutants]
    rows = [
        {"key": m.key, "operator": m.operator, "line": m.line, "outcome": "killed"} for m in two
    ]
    assert len(rows) >= 4

    def draw(code_hash: str, seed: str = "") -> list[str]:
        report = {"stages": {"2": {"code_hash": code_hash, "mutants": rows}}}
        (toy / mutants.REPORT).write_text(json.dumps(report), encoding="utf-8")
        jobs = mutate.confirm_jobs([toy], 1, seed, tmp_path / "work", tmp_path / "cache")
        return [j.name for j in jobs]

    assert draw("a" * 64) == draw("a" * 64)
    draws = {tuple(draw(f"{i:064x}")) for i in range(12)}
    assert len(draws) > 1, "another code hash draws other kills"
    assert {tuple(draw("a" * 64, f"s{i}")) for i in range(12)} != {tuple(draw("a" * 64))}


def test_a_report_row_finds_its_mutant_again(toy: Path):
    """What the matrix's rerun relies on: a row's key, operator and line lead back
    to the same mutation, without enumerating the stage."""
    for m in mutants.stage_mutants(toy, "2").mutants:
        found = mutants.find_mutant(toy, "2", m.key, m.operator, m.line)
        assert found is not None and (found.key, found.occurrence) == (m.key, m.occurrence)
        assert mutants.mutated_source(toy, found) == mutants.mutated_source(toy, m)
    assert (
        mutants.find_mutant(toy, "2", FLOOR.replace("//", "@"), "core/NumberReplacer", 17) is None
    )


def test_a_row_finds_its_mutant_after_a_docstring_moved_its_line(toy: Path):
    """A docstring leaves a stage's hash as it was but moves every line below it;
    the rerun must still find each reported mutant (by its key in its function),
    or it would skip the stage in silence."""
    rows = mutants.stage_mutants(toy, "2").mutants
    core = toy / "src" / "toy_project" / "core.py"
    edit(
        core,
        '    """The mean of a non-empty ``values``."""\n',
        '    """The mean of a non-empty ``values``.\n\n'
        + "".join(f"    Line {n} of a longer docstring.\n" for n in range(8))
        + '    """\n',
    )
    moved = {m.key: m for m in mutants.stage_mutants(toy, "2").mutants}
    assert rows and all(moved[m.key].line - m.line == 10 for m in rows)
    for m in rows:
        found = mutants.find_mutant(toy, "2", m.key, m.operator, m.line)  # the old line
        assert found is not None and found.key == m.key, m.key
        assert mutants.mutated_source(toy, found) == mutants.mutated_source(toy, moved[m.key])


def test_a_dotted_exception_name_is_skipped_when_a_row_is_looked_up(toy: Path):
    """Cosmic Ray cannot replace `module.Error` in an `except` tuple; the stage's
    enumeration skips that one mutant, and looking a row up again in the same
    function must skip it too rather than crash the matrix's rerun."""
    core = toy / "src" / "toy_project" / "core.py"
    edit(
        core,
        "    return total(values) / len(values)\n",
        "    try:\n"
        "        return total(values) / len(values)\n"
        "    except (json.JSONDecodeError, ZeroDivisionError):\n"
        "        raise\n",
    )
    core.write_text("import json\n\n" + core.read_text(encoding="utf-8"), encoding="utf-8")
    every = mutants.stage_mutants(toy, "2").mutants
    replaced = [m for m in every if "ExceptionReplacer" in m.operator]
    assert [m.after.strip() for m in replaced] == [
        "except (json.JSONDecodeError, CosmicRayTestingException):"
    ]
    for m in replaced + [next(m for m in every if m.key == FLOOR)]:
        found = mutants.find_mutant(toy, "2", m.key, m.operator, m.line)
        assert found is not None and found.occurrence == m.occurrence, m.key


def _write_stage_many_times(project: str, stage: str, times: int) -> None:
    for i in range(times):
        mutate.write_report(Path(project), {stage: {"run": i}})


def test_two_runs_writing_their_stages_at_once_lose_neither(tmp_path: Path):
    """Two processes merge their own stage into one report, 300 times each, at once:
    the report ends with both stages, each at its last write."""
    import multiprocessing

    project = tmp_path / "two-stages"
    project.mkdir()
    (project / "project.toml").write_text(
        'id = "two-stages"\n\n[[stages]]\nid = "1"\n\n[[stages]]\nid = "2"\n'
    )
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_write_stage_many_times, args=(str(project), stage, 300))
        for stage in ("1", "2")
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    stages = json.loads((project / mutate.REPORT).read_text())["stages"]
    assert stages == {"1": {"run": 299}, "2": {"run": 299}}
