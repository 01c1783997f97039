"""The site's guidance: the index's "Start here" path, the capability map of a
route page, lesson pages, the one header of every page, and the starter line
numbers of a project page's "What you write".

The synthetic catalog here is built so that citation order, milestone order
and scope disagree: a wrong ordering rule gives a different path. The real
repository build checks the numbers against the source files themselves.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from catalog_compiler.exercises import OPEN
from catalog_compiler.site import write_site
from catalog_compiler.starters import starter_files
from conftest import REPO, run_cli
from test_site import _Page, read_page, reference_inputs, synthetic_inputs

OPTIONAL = (
    "Optional project extension; 1 project preparation lessons lie outside the required route"
)


def _skill(skill: str, project_id: str, stage_ids: list[str], lessons: list[str], scope: str):
    return {
        "skill": skill,
        "lessonIds": lessons,
        "projectId": project_id,
        "evidence": f"Evidence for {skill}.",
        "reviewCriterion": "Explain the check.",
        "scope": scope,
        "stageIds": stage_ids,
    }


def _role(role_id: str, milestones: list[tuple[str, list[str]]], skills: list[dict]) -> dict:
    return {
        "id": role_id,
        "title": f"Title {role_id}",
        "headline": "A headline.",
        "description": "A description.",
        "pathwayIds": [],
        "modalityTrackIds": [],
        "skills": [item["skill"] for item in skills] + ["Unproven skill"],
        "portfolio": "A portfolio.",
        "readiness": "Ready.",
        "background": "Background.",
        "workExample": "Work.",
        "milestones": [
            {"title": title, "phaseIds": phases, "deliverable": f"{title} done"}
            for title, phases in milestones
        ],
        "reviewQuestions": ["Why?"],
        "scopeNote": "Not a claim. The capability map below separates required from optional.",
        "skillEvidence": skills,
    }


def _stage(stage_id: str, title: str) -> dict:
    return {
        "id": stage_id,
        "title": title,
        "deliverable": "D",
        "tests": ["t.py"],
        "hardware": "cpu",
    }


def _exercise(lines: int) -> dict:
    return {"file": "src/p/m.py", "line": 10, "hint": "Write it.", "lines": lines}


def guide_inputs() -> dict:
    """role-one cites proj-late (prepared at milestone 2) before proj-early
    (milestone 1), then proj-opt (optional); role-two cites only proj-opt, whose
    phase is on its route."""
    required = "Required route practice"
    role_one = _role(
        "role-one",
        [("Early milestone", ["alpha"]), ("Late milestone", ["beta"])],
        [
            _skill("Late skill", "proj-late", ["1"], ["beta-01"], required),
            _skill("Early skill", "proj-early", ["2", "1"], ["alpha-01"], required),
            _skill("Optional skill", "proj-opt", ["1"], ["gamma-01"], OPTIONAL),
            _skill("Late again", "proj-late", ["1"], ["alpha-01"], required),
        ],
    )
    role_two = _role(
        "role-two",
        [("Gamma milestone", ["gamma"])],
        [_skill("Gamma skill", "proj-opt", ["1"], ["gamma-01"], required)],
    )
    projects = [
        {
            "id": "proj-early",
            "title": "Project early",
            "status": "ready",
            "preparation": ["alpha-01"],
            "stages": [_stage("1", "First"), _stage("2", "Second")],
            "exercises": {"1": [_exercise(4)], "2": [_exercise(3), _exercise(5)]},
        },
        {
            "id": "proj-late",
            "title": "Project late",
            "status": "planned",
            "preparation": ["alpha-01", "beta-01"],
            "stages": [_stage("1", "Late stage")],
        },
        {
            "id": "proj-opt",
            "title": "Project opt",
            "status": "ready",
            "preparation": ["gamma-01"],
            "stages": [_stage("1", "Opt stage")],
            "exercises": {"1": [_exercise(1)]},
        },
    ]
    phases = [{"id": p, "title": p.title()} for p in ("alpha", "beta", "gamma")]
    lessons = [
        {"id": "alpha-01", "phase": "alpha", "title": "Alpha one"},
        {"id": "beta-01", "phase": "beta", "title": "Beta one"},
        {"id": "gamma-01", "phase": "gamma", "title": "Gamma one"},
        {"id": "gamma-02", "phase": "gamma", "title": "Gamma two"},
    ]
    return {
        "catalog": {"schemaVersion": 1, "roles": [role_one, role_two], "domains": []},
        "projects": projects,
        "phases": phases,
        "lessons": lessons,
        "pathways": [],
        "tracks": [],
    }


def _section(path: Path, section_id: str) -> _Page:
    """The element with ``id=section_id`` (up to its closing tag), parsed alone."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf'<(section|article) [^>]*id="{section_id}"[^>]*>.*?</\1>', text, re.S)
    assert match, f"no #{section_id} on {path}"
    page = _Page()
    page.feed(match.group(0))
    page.close()
    return page


# --- Start here -----------------------------------------------------------------


def test_start_here_orders_each_route_by_milestone_with_the_exemplar_first(tmp_path: Path) -> None:
    write_site(tmp_path, **guide_inputs())
    index = tmp_path / "index.html"
    one = _section(index, "start-role-one")
    assert one.text().split("\n") == [
        "Title role-one",
        "Project early exemplar",
        "milestone 1: Early milestone · 2 stages · 3 exercise regions · 12 lines to write",
        "Project late",
        "milestone 2: Late milestone · 1 stage · no exercise regions",
        "Project opt",
        "optional extension · 1 stage · 1 exercise region · 1 line to write",
        "Route total, 3 projects: 4 stages · 4 exercise regions · 13 lines to write. "
        "Capability map",
    ]
    assert one.links == [
        "routes/role-one.html",
        "projects/proj-early.html",
        "projects/proj-late.html",
        "projects/proj-opt.html",
        "routes/role-one.html#capability-map",
    ]
    two = _section(index, "start-role-two")
    assert two.text().split("\n") == [
        "Title role-two",
        "Project early exemplar",
        "not cited by this route: the structure every project shares · 2 stages · "
        "3 exercise regions · 12 lines to write",
        "Project opt",
        "milestone 1: Gamma milestone · 1 stage · 1 exercise region · 1 line to write",
        "Route total, 2 projects: 3 stages · 4 exercise regions · 13 lines to write. "
        "Capability map",
    ]
    start = _section(index, "start-here").text()
    assert "No working time is given" in start
    assert "first project on the first route (Title role-one)" in start
    # The header's "Career learning guide" lands here.
    assert "index.html#start-here" in read_page(index).links


def test_the_exemplar_is_the_first_project_of_the_first_route(tmp_path: Path) -> None:
    inputs = guide_inputs()
    inputs["catalog"]["roles"].reverse()  # role-two is now the first route
    write_site(tmp_path, **inputs)
    one = _section(tmp_path / "index.html", "start-role-one").text().split("\n")
    assert one[1:3] == [
        "Project opt exemplar",
        "optional extension · 1 stage · 1 exercise region · 1 line to write",
    ]
    assert one[3] == "Project early"
    project = read_page(tmp_path / "projects" / "proj-opt.html").text()
    assert "Status: ready exemplar project id proj-opt" in project
    assert "exemplar" not in read_page(tmp_path / "projects" / "proj-early.html").text()


# --- capability map ---------------------------------------------------------------


def test_capability_map_splits_required_and_optional_skills_with_stage_links(
    tmp_path: Path,
) -> None:
    write_site(tmp_path, **guide_inputs())
    route = tmp_path / "routes" / "role-one.html"
    capability = _section(route, "capability-map")
    assert capability.text().split("\n") == [
        "Capability map",
        "Required route practice",
        "Late skill",
        "Evidence: Project late: stage 1 Late stage",
        "Lessons: beta-01 Beta one",
        "Early skill",
        "Evidence: Project early: stage 2 Second, stage 1 First",
        "Lessons: alpha-01 Alpha one",
        "Late again",
        "Evidence: Project late: stage 1 Late stage",
        "Lessons: alpha-01 Alpha one",
        "Optional extensions",
        "Optional skill",
        "Evidence: Project opt: stage 1 Opt stage",
        OPTIONAL,
        "Lessons: gamma-01 Gamma one",
        "Skills no project stage evidences yet",
        "Unproven skill",
    ]
    assert capability.links[:5] == [
        "#skill-1",
        "../projects/proj-late.html",
        "../projects/proj-late.html#stage-1",
        "../lessons/beta-01.html",
        "#skill-2",
    ]
    page = read_page(route)
    assert {"skill-1", "skill-2", "skill-3", "skill-4", "capability-map"} <= page.ids
    # The scope note's words point at the map, and keep their text.
    footer = re.search(r"<footer[^>]*>(.*?)</footer>", route.read_text(encoding="utf-8")).group(1)
    assert '<a href="#capability-map">capability map</a>' in footer
    assert re.sub(r"<[^>]+>", "", footer) == inputs_scope_note()
    two = _section(tmp_path / "routes" / "role-two.html", "capability-map").text().split("\n")
    assert two[two.index("Optional extensions") + 1] == "None on this route."


def inputs_scope_note() -> str:
    return guide_inputs()["catalog"]["roles"][0]["scopeNote"]


# --- lesson pages -----------------------------------------------------------------


def test_lesson_page_names_the_stages_that_practise_it(tmp_path: Path) -> None:
    write_site(tmp_path, **guide_inputs())
    page = read_page(tmp_path / "lessons" / "alpha-01.html")
    lines = page.text().split("\n")
    assert lines[1:8] == [
        "Alpha one",
        "Lesson alpha-01 · phase Alpha",
        "Project stages that practise it",
        # In the order the skill evidence first cites the lesson; stages in manifest order.
        "Project early: stage 1 First, stage 2 Second",
        "Cited by Title role-one: Early skill",
        "Project late: stage 1 Late stage",
        "Cited by Title role-one: Late again",
    ]
    assert {
        "../projects/proj-early.html#stage-1",
        "../projects/proj-early.html#stage-2",
        "../projects/proj-late.html#stage-1",
        "../routes/role-one.html#skill-2",
        "../routes/role-one.html#skill-4",
        "../phases/alpha.html",
    } <= set(page.links)
    text = page.text()
    assert "Projects that list it as preparation\nProject early\nProject late" in text
    assert "The catalog lists no documentation for this lesson yet" in text
    assert "Routes that require its phase\nTitle role-one" in text
    idle = read_page(tmp_path / "lessons" / "gamma-02.html").text()
    assert "No skill evidence cites this lesson yet." in idle
    assert "No project lists this lesson as preparation." in idle
    # The phase page links each of its lessons' pages.
    assert "../lessons/gamma-02.html" in read_page(tmp_path / "phases" / "gamma.html").links


def test_lesson_documentation_links_only_as_the_lesson_data_holds_them(tmp_path: Path) -> None:
    inputs = guide_inputs()
    inputs["lessons"][0]["docs"] = [
        {"title": "The grad tutorial", "url": "https://docs.jax.dev/en/latest/grad.html"},
        {"title": "Not a web page", "url": "javascript:alert(1)"},
    ]
    write_site(tmp_path, **inputs)
    docs = _section(tmp_path / "lessons" / "alpha-01.html", "documentation")
    assert docs.links == [] and docs.external == ["https://docs.jax.dev/en/latest/grad.html"]
    assert docs.text() == "Documentation to read\nThe grad tutorial"


# --- the header -------------------------------------------------------------------


def test_every_page_has_the_same_header_of_three_links(tmp_path: Path) -> None:
    written = write_site(tmp_path, **guide_inputs())
    headers = set()
    for path in written:
        if path.suffix != ".html":
            continue
        root = "../" * (len(path.relative_to(tmp_path).parts) - 1)
        header = re.search(r"<header.*?</header>", path.read_text(encoding="utf-8"), re.S)
        assert header, path
        headers.add(header.group(0).replace(f'href="{root}', 'href="'))
    assert len(headers) == 1
    header = _Page()
    header.feed(headers.pop())
    assert header.text() == "JAX PathwaysAll career routesCareer learning guide"
    assert header.links == ["index.html", "index.html#routes", "index.html#start-here"]
    assert "span" not in header.tags  # nothing in it looks like a link without being one
    index = read_page(tmp_path / "index.html")
    assert {"routes", "start-here"} <= index.ids


@pytest.mark.parametrize("source", ["guide", "synthetic", "reference"])
def test_the_same_inputs_give_the_same_bytes(tmp_path: Path, source: str) -> None:
    make = {"guide": guide_inputs, "synthetic": synthetic_inputs, "reference": reference_inputs}
    first = write_site(tmp_path / "a", **make[source]())
    second = write_site(tmp_path / "b", **make[source]())
    assert [p.relative_to(tmp_path / "a") for p in first] == [
        p.relative_to(tmp_path / "b") for p in second
    ]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a


# --- the real repository ----------------------------------------------------------


@pytest.fixture(scope="module")
def real_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("guide") / "build"
    result = run_cli("--root", REPO, "--out", out)
    assert result.exit_code == 0, result.output
    return out / "site"


EXERCISE = re.compile(r"(?:<td>|<br>)([^<]*?) <code>([^<]+):(\d+)</code>")


def _what_you_write(page: Path) -> list[tuple[str, str, int]]:
    table = re.search(r'<table class="exercises">.*?</table>', page.read_text("utf-8"), re.S)
    assert table, f"{page} has no exercise table"
    return [(html.unescape(h), f, int(n)) for h, f, n in EXERCISE.findall(table.group(0))]


def test_what_you_write_gives_the_line_in_the_starter(real_site: Path) -> None:
    projects = sorted(p.parent for p in (REPO / "projects").glob("*/project.toml"))
    later_region_checked = False
    for project in projects:
        page = real_site / "projects" / f"{project.name}.html"
        if not (real_site / "learn" / f"{project.name}.zip").is_file():
            continue
        shown = _what_you_write(page)
        starter = starter_files(project)
        markers = 0
        for hint, file, line in shown:
            text = starter[file].decode("utf-8").splitlines()
            opening = OPEN.match(text[line - 1])
            assert opening and opening["hint"].strip() == hint, f"{project.name}: {file}:{line}"
        for rel, content in starter.items():
            if rel.startswith("src/") and rel.endswith(".py"):
                markers += sum(bool(OPEN.match(x)) for x in content.decode("utf-8").splitlines())
        assert len(shown) == markers, f"{project.name}: every starter region is listed"
        # A region after another in its file: the earlier one's body is one line
        # in the starter, so its line is not the reference's.
        for hint, file, line in shown:
            reference = (project / file).read_text(encoding="utf-8").splitlines()
            ref_line = next(
                i
                for i, x in enumerate(reference, 1)
                if (m := OPEN.match(x)) and m["hint"].strip() == hint
            )
            if ref_line != line:
                later_region_checked = True
    assert later_region_checked, "no region whose starter line differs from the reference's"
    # The reported case: mlm.py's second region. The line shown is the marker in the
    # starter, which is not where the reference has it.
    shown = [e for e in _what_you_write(real_site / "projects" / "training-methods.html")]
    hint, file, line = [e for e in shown if e[1].endswith("/mlm.py")][1]
    reference = (REPO / "projects" / "training-methods" / file).read_text("utf-8").splitlines()
    assert hint not in reference[line - 1]
    assert any(hint in x for x in reference[line:]), "the reference has the region further down"


def _region_sizes(project: Path) -> tuple[int, int]:
    """Regions and their non-blank, non-comment lines, counted straight from the source."""
    regions = lines = 0
    inside = False
    for path in sorted((project / "src").rglob("*.py")):
        for raw in path.read_text(encoding="utf-8").splitlines():
            stripped = raw.strip()
            if stripped.startswith("# --- exercise stage "):
                regions, inside = regions + 1, True
            elif stripped == "# --- end exercise ---":
                inside = False
            elif inside and stripped and not stripped.startswith("#"):
                lines += 1
    return regions, lines


def test_start_here_sizes_are_the_source_counts(real_site: Path) -> None:
    section = _section(real_site / "index.html", "start-training-engineer")
    lines = section.text().split("\n")
    assert lines[1] == "MLP classifier exemplar"
    checked = 0
    for title_line, detail in zip(lines[1::2], lines[2::2], strict=False):
        if not detail.startswith(("milestone", "optional", "not cited")):
            continue
        href = section.links[1 + checked]
        project = REPO / "projects" / Path(href).stem
        regions, code = _region_sizes(project)
        stages = (project / "project.toml").read_text("utf-8").count("[[stages]]")
        assert detail.endswith(
            f"{stages} stages · {regions} exercise regions · {code} lines to write"
        ), title_line
        checked += 1
    assert checked == 4
