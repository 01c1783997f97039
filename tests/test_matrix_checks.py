"""Negative controls for the matrix's shortcuts: its checks, run through the warm,
forked path, still fail where they must.

The toy project in `fixtures/toy-project` has two stages, one region each. The
tests copy it, damage the copy, and run the learner progression and seeded-bug
jobs on it with one warm pytest server: a broken stage breaks its step, a stage
test that reaches a later region breaks the earlier step, a bug is caught, a
bug no test sees survives, a bug that breaks the import is broken, and a copy
whose package is imported from elsewhere is refused. The server itself refuses
to fork once a JAX backend runs, kills a run past its timeout, and keeps what a run
leaves in its temporary folder inside the caller's scratch folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import learner  # noqa: E402
import ready_projects  # noqa: E402
import seeded_bugs  # noqa: E402
from schedule import CACHE_READ_WARNING, Job, Worker, run_jobs, scratch_tmp  # noqa: E402
from scratch import run_pytest  # noqa: E402
from warm_runner import TIMED_OUT, WRONG_IMPORT  # noqa: E402

TOY = Path(__file__).resolve().parent / "fixtures" / "toy-project"
# A correct reformulation of the toy's stage 2, in `reformulations.toml` form.
SUM_BUILTIN = (
    '[[reformulations]]\nid = "sum-builtin"\nstage = "2"\n'
    'file = "src/toy_project/core.py"\nfind = "return total(values) / len(values)"\n'
    'replace = "return sum(values) / len(values)"\nwhy = "The builtin sum."\n'
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory):
    """One warm server for the module's runs."""
    w = Worker(tmp_path_factory.mktemp("jax-cache"))
    yield w
    w.close()


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A copy of the toy project this test may damage."""
    return Path(shutil.copytree(TOY, tmp_path / "toy-project"))


def progression(project: Path, tmp_path: Path, worker: Worker) -> learner.Progression:
    result, jobs = learner.progression_jobs(project, tmp_path, tmp_path / "cache")
    for job in jobs:
        job.action(worker)
    learner.summarize([result], 0.0)
    return result


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_the_sound_toy_passes_every_step(toy: Path, tmp_path: Path, worker: Worker):
    result = progression(toy, tmp_path, worker)
    # Starter fails stage 1; stage 1 written: stage 1 passes and stage 2 fails;
    # all written: stage 2 passes.
    assert [(s.stage, s.expect, s.ok) for s in result.steps] == [
        ("1", "fail", True),
        ("1", "pass", True),
        ("2", "fail", True),
        ("2", "pass", True),
    ]
    assert result.ok
    # The runs are also the suite: each stage's tests counted once, from the
    # written state in which they must pass (stage 2's failure at stage 1 is
    # the expected one, not counted).
    assert {k: (c.passed, c.failed) for k, c in result.rows.items()} == {
        "1": (1, 0),
        "2": (1, 0),
    }


def test_a_stage_test_that_swallows_a_later_region_breaks(toy: Path, tmp_path: Path, worker):
    test = toy / "tests/test_stage_1_sum.py"
    test.write_text(
        test.read_text()
        + textwrap.dedent(
            """

            def test_swallows_what_the_stage_2_region_raises():
                from toy_project.core import mean

                try:
                    mean([2.0])
                except NotImplementedError:
                    pass
            """
        )
    )
    result = progression(toy, tmp_path, worker)
    first_pass = next(s for s in result.steps if s.expect == "pass")
    # The test passed, but it ran no reference code for stage 2: not proof.
    assert not first_pass.ok
    assert "test_swallows_what_the_stage_2_region_raises passed though it raised" in (
        first_pass.detail
    )
    assert "Stage 2 exercise:" in first_pass.detail
    # With every stage written nothing is raised, and the same test passes.
    assert result.steps[-1].ok


def test_a_broken_stage_breaks_its_pass_step(toy: Path, tmp_path: Path, worker: Worker):
    edit(toy / "src/toy_project/core.py", "result += value", "result += 2 * value")
    # The reference is still the fully written starter, so only the run can see it.
    result = progression(toy, tmp_path, worker)
    broken = [(s.stage, s.expect) for s in result.steps if not s.ok]
    assert broken == [("1", "pass"), ("2", "fail"), ("2", "pass")]
    assert "test_total_matches_the_builtin_sum" in result.steps[1].detail
    assert result.rows["1"].failed == 1


def test_a_stage_test_that_enters_a_later_region_breaks(toy: Path, tmp_path: Path, worker):
    test = toy / "tests/test_stage_1_sum.py"
    test.write_text(
        test.read_text()
        + textwrap.dedent(
            """

            def test_reaches_the_stage_2_region():
                from toy_project.core import mean

                assert mean([2.0]) == 2.0
            """
        )
    )
    result = progression(toy, tmp_path, worker)
    assert not result.ok
    first_pass = next(s for s in result.steps if s.expect == "pass")
    assert not first_pass.ok and "Stage 2 exercise:" in first_pass.detail


def bug(find: str, replace: str, stage: str = "2") -> seeded_bugs.Bug:
    tests = (f"tests/test_stage_{stage}_{'mean' if stage == '2' else 'sum'}.py",)
    return seeded_bugs.Bug(
        "toy-project", "b", stage, "src/toy_project/core.py", find, replace, "why", tests
    )


@pytest.mark.parametrize(
    ("find", "replace", "stage", "verdict"),
    [
        ("/ len(values)", "/ (len(values) + 1)", "2", "caught"),
        ("result = 0.0", "result = 0", "1", "SURVIVED"),
        ('"""Stage 1 sums', 'import no_such_module_anywhere\n"""Stage 1 sums', "1", "BROKEN"),
    ],
)
def test_seeded_bug_verdicts_through_the_forked_path(
    tmp_path: Path, worker: Worker, find: str, replace: str, stage: str, verdict: str
):
    job = seeded_bugs.bug_job(bug(find, replace, stage), tmp_path, worker.cache_dir, folder=TOY)
    outcome = job.action(worker)
    assert outcome.verdict == verdict, outcome.detail
    # The bug was applied to a scratch copy, never to the project itself.
    assert find in (TOY / "src/toy_project/core.py").read_text()


@pytest.mark.parametrize(
    ("find", "replace", "verdict"),
    [
        ("return total(values) / len(values)", "return sum(values) / len(values)", "passed"),
        ("return total(values) / len(values)", "return total(values) / 3.5", "REJECTED"),
        ("return total(values) / len(values)", "return no_such_name / 1", "REJECTED"),
        ('"""Stage 1 sums', 'import no_such_module_anywhere\n"""Stage 1 sums', "BROKEN"),
    ],
)
def test_reformulation_verdicts_through_the_forked_path(
    tmp_path: Path, worker: Worker, find: str, replace: str, verdict: str
):
    """A correct reformulation must pass its stage's tests: another equivalent call passes, a
    wrong one is REJECTED (as a correct solution the tests refused would be), and one that
    breaks collection is BROKEN."""
    entry = dataclasses.replace(bug(find, replace, "2"), expect="pass")
    job = seeded_bugs.bug_job(entry, tmp_path, worker.cache_dir, folder=TOY)
    outcome = job.action(worker)
    assert outcome.verdict == verdict, outcome.detail
    assert seeded_bugs.good(outcome) == (verdict == "passed")


def test_a_reformulation_list_loads_beside_the_seeded_bugs(tmp_path: Path):
    """A project's `reformulations.toml` entries load with `expect="pass"`, are validated like
    seeded bugs (a `find` that does not occur is refused), and need no minimum per stage."""
    copy = tmp_path / "toy-project"
    shutil.copytree(TOY, copy)
    (copy / "reformulations.toml").write_text(
        SUM_BUILTIN
        + '\n[[reformulations]]\nid = "stale"\nstage = "1"\nfile = "src/toy_project/core.py"\n'
        'find = "not in the file"\nreplace = "x"\nwhy = "Stale."\n'
    )
    found, problems = seeded_bugs.load_bugs(copy, kind="reformulations")
    assert [(b.id, b.expect) for b in found] == [("sum-builtin", "pass")]
    assert len(problems) == 1 and "`find` occurs 0 times" in problems[0]
    assert seeded_bugs.load_bugs(TOY, kind="reformulations") == ([], [])


def test_a_copy_whose_package_comes_from_elsewhere_is_refused(toy: Path, worker: Worker):
    # A package of the same name at the copy's root shadows `src/`.
    shutil.copytree(toy / "src/toy_project", toy / "toy_project")
    done = run_pytest(toy, ["tests/test_stage_1_sum.py"], worker.cache_dir, runner=worker.runner)
    assert done.code == WRONG_IMPORT, done.output
    assert "not from" in done.output


def test_a_run_past_its_timeout_is_killed_with_its_children(toy: Path, worker: Worker):
    marker = toy / "child-alive"
    (toy / "tests/test_stage_1_sum.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time

            def test_hangs():
                subprocess.Popen([sys.executable, "-c",
                    "import time; time.sleep(4); open({str(marker)!r}, 'w')"])
                time.sleep(60)
            """
        )
    )
    done = run_pytest(
        toy, ["tests/test_stage_1_sum.py"], worker.cache_dir, timeout=2, runner=worker.runner
    )
    assert done.code == TIMED_OUT
    # The grandchild was in the run's process group and died with it.
    subprocess.run([sys.executable, "-c", "import time; time.sleep(4)"], check=True)
    assert not marker.exists()


def test_what_a_forked_run_leaves_in_its_temporary_folder_stays_in_the_scratch_folder(
    toy: Path, worker: Worker
):
    # A conftest-style `TemporaryDirectory` made at import: its `atexit` clean-up
    # never runs in a forked child, which ends in `os._exit`.
    (toy / "tests/test_stage_1_sum.py").write_text(
        textwrap.dedent(
            """
            import tempfile
            PROBE = tempfile.TemporaryDirectory(prefix="leak-probe-")

            def test_makes_a_folder():
                assert PROBE.name
            """
        )
    )
    system_tmp = Path(tempfile.gettempdir())
    before = set(system_tmp.glob("leak-probe-*"))
    done = run_pytest(toy, ["tests/test_stage_1_sum.py"], worker.cache_dir, runner=worker.runner)
    assert done.code == 0, done.output
    assert set(system_tmp.glob("leak-probe-*")) == before
    assert len(list(scratch_tmp(worker.cache_dir).glob("leak-probe-*"))) == 1
    # Other accounts can pass through to it and make their own folders there, as
    # in the system temporary folder (a server started as `postgres` does).
    tmp = scratch_tmp(worker.cache_dir)
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o1777
    assert stat.S_IMODE(tmp.parent.stat().st_mode) & 0o111 == 0o111


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "fresh process"])
def test_a_torn_cache_read_is_shown_not_failed_where_warnings_are_errors(
    toy: Path, worker: Worker, warm: bool
):
    """Runs that share a compilation cache can read an entry another run is still
    writing; JAX warns and compiles, as on a miss. Under `filterwarnings = error`
    that warning alone must not fail a test, while every other warning still does."""
    (toy / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    (toy / "tests/test_stage_1_sum.py").write_text(
        textwrap.dedent(
            f"""
            import warnings

            def test_reads_a_torn_entry():
                warnings.warn("{CACHE_READ_WARNING} for 'jit_f': ValueError: truncated")

            def test_warns_otherwise():
                warnings.warn("{CACHE_READ_WARNING[:-1]}ies are all fine")
            """
        )
    )
    runner = worker.runner if warm else None
    done = run_pytest(
        toy, ["tests/test_stage_1_sum.py"], worker.cache_dir, runner=runner, stop_first=False
    )
    assert done.code == 1, done.output
    assert "1 failed, 1 passed" in done.output, done.output
    assert "FAILED tests/test_stage_1_sum.py::test_warns_otherwise" in done.output
    assert "truncated" in done.output  # shown in the warnings summary
    # Negative control: outside a shared cache's runs the same warning fails.
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_stage_1_sum.py::test_reads_a_torn_entry",
        ],
        cwd=toy,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        | {"PYTHONPATH": str(toy / "src")},
    )
    assert plain.returncode == 1, plain.stdout + plain.stderr


def test_the_warm_server_refuses_to_fork_once_a_backend_runs():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import jax, warm_runner; "
        "jax.numpy.zeros(1).block_until_ready(); warm_runner.assert_forkable()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts")], capture_output=True, text=True
    )
    assert done.returncode != 0 and "JAX backend started" in done.stderr


def test_the_scheduler_runs_longest_first(tmp_path: Path):
    order: list[str] = []

    def job(name: str, estimate: float) -> Job:
        return Job(name, "suites", estimate, lambda w: order.append(name))

    done = run_jobs([job("short", 1.0), job("long", 5.0), job("mid", 3.0)], 1, tmp_path)
    # One worker: longest estimate first, whatever the order they were queued in.
    assert order == ["long", "mid", "short"]
    assert len(done) == 3


def test_the_readme_table_puts_bugs_in_starter_code_apart():
    """A bug whose `find` lies inside an exercise region is a learner's mistake; one on a
    marker line or outside every region is in code a starter ships, and goes to the
    second table (the toy's `mean` signature is outside; its division is inside)."""
    inside = bug("return total(values) / len(values)", "return total(values) * len(values)", "2")
    outside = dataclasses.replace(
        bug("def mean(values: list[float]) -> float:", "def mean(values):", "2"), id="outside"
    )
    marker = dataclasses.replace(
        bug(
            "    # --- end exercise ---\n\n\ndef mean",
            "    # --- end exercise ---\n\ndef mean",
            "1",
        ),
        id="marker",
    )
    assert [seeded_bugs.in_learner_code(TOY, b) for b in (inside, outside, marker)] == [
        True,
        False,
        False,
    ]
    table = seeded_bugs.readme_table(TOY, [outside, inside, marker])
    learner, provided = table.split("\n\n")
    assert f"`{inside.id}`" in learner and "`outside`" not in learner
    assert (
        "`outside`" in provided
        and "`marker`" in provided
        and "the learner does not write it" in provided
    )
    assert seeded_bugs.readme_table(TOY, [inside]).count("| Stage |") == 1


def test_reformulations_load_only_for_the_projects_named(tmp_path: Path):
    """`load_all` loads a project's reformulations when it is named (or no list is
    given, as by hand) and only its seeded bugs otherwise, as the matrix asks for the
    projects outside `scripts/reformulations_checked.txt`; every listed project has a list."""
    copy = tmp_path / "toy-project"
    shutil.copytree(TOY, copy)
    (copy / "reformulations.toml").write_text(SUM_BUILTIN)

    def reforms(named):
        found, _ = seeded_bugs.load_all([copy], reformulations=named)
        return [b.id for b in found if b.expect == "pass"]

    assert reforms(None) == reforms({"toy-project"}) == ["sum-builtin"]
    assert reforms(set()) == reforms({"kernel-audit"}) == []
    listed = ready_projects.reformulations_checked()
    assert listed and all((p / "reformulations.toml").is_file() for p in listed)
