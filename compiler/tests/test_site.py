"""write_site: every page written, every relative link resolves, route pages
carry the route text (each practice line naming its project) followed by the
capability map, and every catalog string is escaped.

Runs on a small synthetic catalog (always) and on the reference catalog with
the repository's own manifests and catalog lists (when the reference is
present). The browser check of the same properties is
``tests/test_site_browser.py``.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from catalog_compiler.route_text import route_text
from catalog_compiler.site import write_site

REPO = Path(__file__).resolve().parents[2]
REFERENCE_CATALOG = REPO.parent / "shared" / "reference" / "catalog.json"

SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
ATTRIBUTE_BREAK = '" onmouseover="alert(2)'


# --- inputs -------------------------------------------------------------------


def _skill(skill: str, project_id: str, stage_ids: list[str], lesson_ids: list[str]) -> dict:
    return {
        "skill": skill,
        "lessonIds": lesson_ids,
        "projectId": project_id,
        "evidence": f"Evidence for {skill}.",
        "reviewCriterion": "Explain the independent check.",
        "scope": "Required route practice",
        "stageIds": stage_ids,
    }


def _role(role_id: str, title: str, skills: list[dict], phase_ids: list[str]) -> dict:
    return {
        "id": role_id,
        "title": title,
        "headline": f"{title} headline.",
        "description": f"{title} description.",
        "pathwayIds": ["main"],
        "modalityTrackIds": ["text"],
        "portfolio": "A portfolio.",
        "readiness": "Ready when it works.",
        "background": "Some background.",
        "workExample": "A work example.",
        "milestones": [
            {"title": "Start", "phaseIds": phase_ids, "deliverable": "A first result"},
            {"title": "Unlinked", "phaseIds": [], "deliverable": "A second result"},
        ],
        "reviewQuestions": ["What did you check?", "What changed?"],
        "scopeNote": "A learning route, not a claim of job readiness; a reviewer’s feedback.",
        "skillEvidence": skills,
    }


def synthetic_inputs() -> dict:
    """A small catalog: one role in a domain, one outside every domain (and
    citing a project that is not passed), a referenced and an unreferenced
    project, two phases with lessons."""
    optional = _skill("Skill two", "proj-one", ["2"], ["beta-01"])
    optional["scope"] = (
        "Optional project extension; 1 project preparation lessons lie outside the required route"
    )
    role_a = _role(
        "role-a",
        "Role A",
        [_skill("Skill one", "proj-one", ["1", "2"], ["alpha-01"]), optional],
        ["alpha"],
    )
    role_b = _role("role-b", "Role B", [_skill("Ghost skill", "ghost", ["1"], ["gone-01"])], [])
    catalog = {
        "schemaVersion": 1,
        "roles": [role_a, role_b],
        "domains": [
            {
                "id": "dom",
                "title": "Domain",
                "headline": "A headline.",
                "description": "A domain description.",
                "roleIds": ["role-a"],
                "pathwayIds": ["main"],
            }
        ],
    }
    stage = {"deliverable": "A result", "tests": ["tests/test_stage_1.py"], "hardware": "cpu"}
    projects = [
        {
            "id": "proj-one",
            "title": "Project one",
            "status": "ready",
            "preparation": ["alpha-01", "beta-01"],
            "stages": [
                {"id": "1", "title": "First", **stage},
                {"id": "2", "title": "Two", **stage},
            ],
        },
        {
            "id": "proj-two",
            "title": "Project two",
            "status": "planned",
            "preparation": [],
            "stages": [{"id": "1", "title": "Only", **stage}],
        },
    ]
    return {
        "catalog": catalog,
        "projects": projects,
        "phases": [{"id": "alpha", "title": "Alpha"}, {"id": "beta", "title": "Beta"}],
        "lessons": [
            {"id": "alpha-01", "phase": "alpha", "title": "Alpha one"},
            {"id": "alpha-02", "phase": "alpha", "title": "Alpha two"},
            {"id": "beta-01", "phase": "beta", "title": "Beta one"},
        ],
        "pathways": [{"id": "main", "title": "Main", "summary": "The main pathway."}],
        "tracks": [{"id": "text", "title": "Text"}],
    }


def reference_inputs() -> dict:
    """The reference catalog with the repository's manifests and catalog lists."""
    if not REFERENCE_CATALOG.is_file():
        pytest.skip(f"reference catalog not present at {REFERENCE_CATALOG}")

    def listed(name: str) -> list[dict]:
        return yaml.safe_load((REPO / "catalog" / f"{name}.yaml").read_text(encoding="utf-8"))[name]

    projects = [
        tomllib.loads(path.read_text(encoding="utf-8"))
        for path in sorted((REPO / "projects").glob("*/project.toml"))
    ]
    return {
        "catalog": json.loads(REFERENCE_CATALOG.read_text(encoding="utf-8")),
        "projects": sorted(projects, key=lambda project: project["id"]),
        "phases": listed("phases"),
        "lessons": listed("lessons"),
        "pathways": listed("pathways"),
        "tracks": listed("tracks"),
    }


@pytest.fixture(params=["synthetic", "reference"])
def inputs(request: pytest.FixtureRequest) -> dict:
    return synthetic_inputs() if request.param == "synthetic" else reference_inputs()


def build(site_dir: Path, inputs: dict) -> list[Path]:
    return write_site(site_dir, **inputs)


# --- HTML reading ---------------------------------------------------------------


class _Page(HTMLParser):
    """Links, ids and an approximation of Chromium's innerText of a page.

    The approximation follows the rules the route pages rely on: block
    elements break lines, inline elements run together, whitespace collapses,
    nothing in <head> is shown. A <p> would add a blank line in a browser, so
    it is recorded to be refused.
    """

    BLOCK = {
        "address", "article", "aside", "body", "div", "footer", "h1", "h2", "h3", "h4", "h5",
        "h6", "header", "html", "li", "main", "nav", "ol", "section", "table", "tbody", "td",
        "th", "thead", "tr", "ul",
    }  # fmt: skip
    HIDDEN = {"head", "script", "style", "template"}

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.external: list[str] = []
        self.icons: list[str] = []
        self.ids: set[str] = set()
        self.tags: list[str] = []
        self.attribute_names: set[str] = set()
        self._parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attribute_names.update(name for name, _ in attrs)
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if values.get("href") is not None:
            if tag == "link" and values.get("rel") == "icon":
                self.icons.append(values["href"])
            elif tag == "a" and "external" in (values.get("rel") or "").split():
                self.external.append(values["href"])  # Official documentation, off-site.
            elif tag in ("a", "link"):
                self.links.append(values["href"])
        if tag in self.HIDDEN:
            self._hidden += 1
        if tag in self.BLOCK or tag == "br":
            self._parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN:
            self._hidden -= 1
        if tag in self.BLOCK:
            self._parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self._parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (line.strip() for line in "".join(self._parts).split("\n"))
        return "\n".join(line for line in lines if line)


def read_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


# --- tests ----------------------------------------------------------------------


def test_every_page_is_written_and_returned(tmp_path: Path, inputs: dict) -> None:
    site = tmp_path / "site"
    written = build(site, inputs)
    on_disk = {path for path in site.rglob("*") if path.is_file()}
    assert set(written) == on_disk
    assert len(written) == len(set(written))
    expected = {site / "index.html", site / "style.css"}
    expected |= {site / "routes" / f"{r['id']}.html" for r in inputs["catalog"]["roles"]}
    expected |= {site / "projects" / f"{p['id']}.html" for p in inputs["projects"]}
    expected |= {site / "phases" / f"{p['id']}.html" for p in inputs["phases"]}
    expected |= {site / "lessons" / f"{lesson['id']}.html" for lesson in inputs["lessons"]}
    assert on_disk == expected


def test_every_relative_link_resolves(tmp_path: Path, inputs: dict) -> None:
    site = tmp_path / "site"
    pages = {
        path.resolve(): read_page(path) for path in build(site, inputs) if path.suffix == ".html"
    }
    written = {path.resolve() for path in site.rglob("*") if path.is_file()}
    checked = 0
    for path, page in pages.items():
        assert page.links, f"{path} has no links"
        # The only non-relative reference: an empty inline icon.
        assert page.icons == ["data:,"], path
        for href in page.links:
            parts = urlsplit(href)
            assert not parts.scheme and not parts.netloc, f"{path}: absolute link {href}"
            assert not parts.path.startswith("/"), f"{path}: root-relative link {href}"
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            assert target in written, f"{path}: {href} points to no written file"
            if parts.fragment:
                assert parts.fragment in pages[target].ids, f"{path}: {href} has no target id"
            checked += 1
        for href in page.external:
            assert urlsplit(href).scheme == "https", f"{path}: external link {href} is not https"
    assert checked


def html_route_lines(role: dict, projects: list[dict]) -> list[str]:
    """The route text's lines as a route page shows them: each practice line
    names its project (its title; its id when it was not passed in)."""
    titles = {project["id"]: project["title"] for project in projects}
    names = iter(titles.get(item["projectId"], item["projectId"]) for item in role["skillEvidence"])
    prefix = "Practice project: stages "
    return [
        f"Practice project: {next(names)}, stages {line[len(prefix) :]}"
        if line.startswith(prefix)
        else line
        for line in route_text(role).split("\n")
    ]


def assert_route_page(page: _Page, role: dict, projects: list[dict]) -> None:
    """The page shows the route text (practice lines naming their project), then the map."""
    expected = html_route_lines(role, projects)
    shown = page.text().split("\n")
    assert shown[: len(expected)] == expected
    assert shown[len(expected)] == "Capability map"


def test_route_pages_show_the_route_text_then_the_capability_map(
    tmp_path: Path, inputs: dict
) -> None:
    site = tmp_path / "site"
    build(site, inputs)
    for role in inputs["catalog"]["roles"]:
        page = read_page(site / "routes" / f"{role['id']}.html")
        assert "p" not in page.tags, "a <p> adds blank lines to the rendered text"
        assert_route_page(page, role, inputs["projects"])


def test_route_page_links(tmp_path: Path) -> None:
    inputs = synthetic_inputs()
    site = tmp_path / "site"
    build(site, inputs)
    role_a = read_page(site / "routes" / "role-a.html")
    assert role_a.links[:4] == [
        "../style.css",
        "../index.html",
        "../index.html#routes",
        "../index.html#start-here",
    ]
    assert "../projects/proj-one.html" in role_a.links
    assert {"../projects/proj-one.html#stage-1", "../projects/proj-one.html#stage-2"} <= set(
        role_a.links
    )
    assert "../lessons/alpha-01.html" in role_a.links
    assert "../phases/alpha.html" in role_a.links
    # A project, lesson or phase that was not passed in is shown, not linked.
    role_b = read_page(site / "routes" / "role-b.html")
    assert not [href for href in role_b.links if "ghost" in href or "gone" in href]
    assert_route_page(role_b, inputs["catalog"]["roles"][1], inputs["projects"])
    assert "Practice project: ghost, stages 1." in role_b.text().split("\n")


def test_index_project_and_phase_pages(tmp_path: Path) -> None:
    inputs = synthetic_inputs()
    site = tmp_path / "site"
    build(site, inputs)

    index = read_page(site / "index.html")
    text = index.text()
    for value in ("Domain", "A headline.", "A domain description.", "Role A headline."):
        assert value in text
    assert "Other routes" in text  # role-b belongs to no domain
    assert {"routes/role-a.html", "routes/role-b.html"} <= set(index.links)
    assert {"projects/proj-one.html", "projects/proj-two.html"} <= set(index.links)
    assert {"phases/alpha.html", "phases/beta.html"} <= set(index.links)

    project = read_page(site / "projects" / "proj-one.html")
    text = project.text()
    assert "Project one" in text and "ready" in text
    assert "tests/test_stage_1.py" in text and "cpu" in text and "A result" in text
    assert {"stage-1", "stage-2"} <= project.ids
    assert "../lessons/alpha-01.html" in project.links
    assert "../lessons/beta-01.html" in project.links
    assert "../routes/role-a.html#skill-1" in project.links
    assert "../routes/role-a.html#skill-2" in project.links
    assert "Role A: Skill one" in text and "Role A: Skill two" in text

    unused = read_page(site / "projects" / "proj-two.html").text()
    assert "planned" in unused and "No route cites this project yet." in unused

    alpha = read_page(site / "phases" / "alpha.html")
    text = alpha.text()
    assert "Alpha one" in text and "Alpha two" in text
    assert {"alpha-01", "alpha-02"} <= alpha.ids
    assert "../projects/proj-one.html" in alpha.links
    assert "../routes/role-a.html" in alpha.links
    assert "../projects/proj-two.html" not in alpha.links
    assert {"../lessons/alpha-01.html", "../lessons/alpha-02.html"} <= set(alpha.links)


def _cited_project(inputs: dict) -> tuple[int, dict]:
    """The first skill of the first role whose project was passed in, and that project."""
    projects = {project["id"]: project for project in inputs["projects"]}
    for number, item in enumerate(inputs["catalog"]["roles"][0]["skillEvidence"]):
        if item["projectId"] in projects:
            return number, projects[item["projectId"]]
    raise AssertionError("the first role cites no project that was passed in")


def _inject(inputs: dict, value: str) -> None:
    role = inputs["catalog"]["roles"][0]
    number, project = _cited_project(inputs)
    role["title"] = value
    role["skillEvidence"][number]["skill"] = value
    role["skillEvidence"][-1]["evidence"] = value
    role["milestones"][0]["title"] = value
    role["reviewQuestions"][0] = value
    inputs["catalog"]["domains"][0]["description"] = value
    project["title"] = value
    project["stages"][0]["title"] = value
    project["stages"][0]["tests"] = [value]
    lesson_id = project["preparation"][0]
    next(lesson for lesson in inputs["lessons"] if lesson["id"] == lesson_id)["title"] = value
    inputs["phases"][0]["title"] = value
    inputs["pathways"][0]["title"] = value


@pytest.mark.parametrize("source", ["synthetic", "reference"])
def test_catalog_strings_are_escaped(tmp_path: Path, source: str) -> None:
    inputs = synthetic_inputs() if source == "synthetic" else reference_inputs()
    inputs = copy.deepcopy(inputs)
    _inject(inputs, SCRIPT)
    site = tmp_path / "site"
    pages = {path: path.read_text(encoding="utf-8") for path in build(site, inputs)}
    role = inputs["catalog"]["roles"][0]
    project_id = _cited_project(inputs)[1]["id"]
    # The injected value is on each of these pages (so escaping is exercised)...
    for relative in (
        "index.html",
        f"routes/{role['id']}.html",
        f"projects/{project_id}.html",
        f"phases/{inputs['phases'][0]['id']}.html",
        f"lessons/{_cited_project(inputs)[1]['preparation'][0]}.html",
    ):
        assert SCRIPT_ESCAPED in pages[site / relative], relative
    # ...and no page anywhere carries it raw.
    for path, html in pages.items():
        assert SCRIPT not in html, path
        assert "<script" not in html.lower(), path
    # The escaped route page still shows the catalog's text as it is.
    assert_route_page(read_page(site / "routes" / f"{role['id']}.html"), role, inputs["projects"])


def test_attribute_values_are_escaped(tmp_path: Path) -> None:
    inputs = synthetic_inputs()
    _inject(inputs, ATTRIBUTE_BREAK)
    site = tmp_path / "site"
    for path in build(site, inputs):
        if path.suffix != ".html":
            continue
        assert ATTRIBUTE_BREAK not in path.read_text(encoding="utf-8"), path
        # The value stays inside its attribute or text: no element gains an
        # event handler attribute.
        assert not [name for name in read_page(path).attribute_names if name.startswith("on")]


@pytest.mark.parametrize(
    ("kind", "bad_id"),
    [("role", "../escape"), ("project", "Has Space"), ("phase", "a/b"), ("lesson", "x/../y")],
)
def test_ids_that_cannot_name_a_file_are_refused(tmp_path: Path, kind: str, bad_id: str) -> None:
    inputs = synthetic_inputs()
    if kind == "role":
        inputs["catalog"]["roles"][0]["id"] = bad_id
    elif kind == "project":
        inputs["projects"][0]["id"] = bad_id
    elif kind == "phase":
        inputs["phases"][0]["id"] = bad_id
    else:
        inputs["lessons"][0]["id"] = bad_id
    with pytest.raises(ValueError, match="kebab-case"):
        build(tmp_path / "site", inputs)
    assert not (tmp_path / "site").exists()


def _accelerator_report(project: str, commit: str, ran_on: str, stage: str, runs: list) -> dict:
    """A valid accelerator report of ``project`` written out by hand: one TPU v5e run
    per ``(mode, counts)`` in ``runs``, all of ``stage``."""
    return {
        "schema_version": 1,
        "project": project,
        "device": {
            "backend": "tpu",
            "device_kind": "TPU v5 lite",
            "device_count": 1,
            "jax": "0.10.2",
            "jaxlib": "0.10.2",
            "libtpu": "0.0.42.1",
        },
        "commit": commit + "0" * (40 - len(commit)),
        "ran_on": ran_on,
        "command": "lane",
        "code_hashes": {stage: "a" * 64},
        "runs": [
            {"mode": mode, "exit_code": 0, "wall_seconds": 2.0, "stages": {stage: counts}}
            for mode, counts in runs
        ],
        "seeded_bugs": [],
    }


def test_project_page_shows_where_each_stage_last_ran_on_an_accelerator(tmp_path: Path) -> None:
    """A stage with an accelerator report shows its device, date, commit, counts per
    mode and seeded bugs, `current` while its code hash equals the mutation
    report's and `stale` once not; a stage without one says so."""
    folder = tmp_path / "proj-two"
    folder.mkdir()
    counts = {"passed": 3, "failed": 0, "skipped": 1, "seconds": 1.0, "failures": []}
    counts["skips"] = [{"test": "test_stage_1.py::test_x", "reason": "needs sockets"}]
    report = _accelerator_report(
        "proj-two", "1234567", "2026-12-06", "1", [("auto", counts), ("interpret", counts)]
    )
    report["seeded_bugs"] = [{"id": "b", "stage": "1", "outcome": "caught", "seconds": 1.0}]
    (folder / "accelerator-report.json").write_text(json.dumps(report))
    inputs = synthetic_inputs()
    inputs["projects"][1]["folder"] = str(folder)
    texts = {}
    for code_hash in ("a" * 64, "b" * 64):
        mutation = {"stages": {"1": {"code_hash": code_hash}}}
        (folder / "mutation-report.json").write_text(json.dumps(mutation))
        build(tmp_path / code_hash[0], inputs)
        texts[code_hash[0]] = read_page(
            tmp_path / code_hash[0] / "projects" / "proj-two.html"
        ).text()
    for text in texts.values():
        assert "passed on TPU v5 lite (2026-12-06, 1234567)" in text
        assert "default mode 3 passed, 1 skipped; interpret 3 passed, 1 skipped" in text
        assert "seeded bugs 1 of 1 caught" in text
    assert "current" in texts["a"] and "stale" not in texts["a"]
    assert "stale: code changed since" in texts["b"]
    unreported = read_page(tmp_path / "a" / "projects" / "proj-one.html").text()
    assert "not run on an accelerator yet" in unreported


README_LEAD = """# Project one

A lead with `inline code` and **bold** text,
over two lines: <b>not markup</b>.

What it teaches:
- first item,
  continued;
- second item.

```
a -> b
```

## Details

Not the lead.
"""


def test_project_page_starts_with_the_download_then_what_it_teaches(tmp_path: Path) -> None:
    """The start section (the starter's download and set-up lines) comes right after
    the status and size, before the README's lead and the stages; the lead is the
    README's text between its title and next heading, escaped."""
    folder = tmp_path / "proj-one"
    (folder / "src").mkdir(parents=True)
    (folder / "README.md").write_text(README_LEAD, encoding="utf-8")
    (folder / "src" / "x.py").write_text("x = 1\n", encoding="utf-8")
    inputs = synthetic_inputs()
    one = inputs["projects"][0]
    one["folder"] = str(folder)
    one["exercises"] = {"1": [{"file": "src/x.py", "line": 1, "hint": "Write x.", "lines": 1}]}
    build(tmp_path / "site", inputs)
    html = (tmp_path / "site" / "projects" / "proj-one.html").read_text(encoding="utf-8")
    order = [
        html.index('<div class="size">'),
        html.index('href="../learn/proj-one.zip"'),
        html.index("unzip proj-one.zip"),
        html.index("<h2>What it teaches</h2>"),
        html.index("<h2>Stages</h2>"),
    ]
    assert order == sorted(order)
    teaches = re.search(r'<section id="teaches">(.*?)</section>', html, re.S).group(1)
    assert "<p>A lead with <code>inline code</code> and bold text, over two lines: " in teaches
    assert "&lt;b&gt;not markup&lt;/b&gt;." in teaches and "<b>" not in teaches
    assert "<li>first item, continued;</li>" in teaches and "<li>second item.</li>" in teaches
    assert "<pre><code>a -&gt; b</code></pre>" in teaches
    assert "Not the lead" not in html
    # Without a README (or a lead) there is no such section.
    (folder / "README.md").write_text("# Project one\n\n## Details\n\nText.\n", encoding="utf-8")
    build(tmp_path / "bare", inputs)
    bare = (tmp_path / "bare" / "projects" / "proj-one.html").read_text(encoding="utf-8")
    assert "What it teaches" not in bare and "Text." not in bare
    assert "What it teaches" not in (tmp_path / "site" / "projects" / "proj-two.html").read_text(
        encoding="utf-8"
    )


def _rows(path: Path, section: str) -> list[str]:
    html = path.read_text(encoding="utf-8")
    found = re.search(rf'<section[^>]* id="{section}">(.*?)</section>', html, re.S)
    assert found, f"{path}: no #{section}"
    page = _Page()
    page.feed(found.group(1))
    return page.text().split("\n")


def test_index_and_route_pages_show_each_stage_hardware(tmp_path: Path, inputs: dict) -> None:
    """The index names the hardware of every project's stages; a route page lists
    each stage it cites, once, with its hardware and its accelerator run, after
    the capability map (the text above the map is unchanged)."""
    site = tmp_path / "site"
    build(site, inputs)
    projects = {project["id"]: project for project in inputs["projects"]}
    index = "\n".join(_rows(site / "index.html", "projects"))
    for project in inputs["projects"]:
        kinds = {stage["hardware"] for stage in project["stages"]}
        assert all(kind in index for kind in kinds), project["id"]
        if len(kinds) == 1:
            assert f"{project['title']} {project['status']} needs: {kinds.pop()}" in index
    for role in inputs["catalog"]["roles"]:
        path = site / "routes" / f"{role['id']}.html"
        assert_route_page(read_page(path), role, inputs["projects"])
        text = read_page(path).text().split("\n")
        assert text.index("Hardware each practice stage needs") > text.index("Capability map")
        rows = _rows(path, "hardware")
        cited = list(
            dict.fromkeys(
                (item["projectId"], stage_id)
                for item in role["skillEvidence"]
                for stage_id in item["stageIds"]
            )
        )
        body = rows[rows.index("Last verified on an accelerator") + 1 :]
        assert len(body) == 4 * len(cited), role["id"]
        for number, (project_id, stage_id) in enumerate(cited):
            project = projects.get(project_id)
            stages = (project or {}).get("stages", [])
            stage = next((s for s in stages if s["id"] == stage_id), None)
            title = project["title"] if project else project_id
            assert body[4 * number] == title
            assert body[4 * number + 1].startswith(f"stage {stage_id}")
            assert body[4 * number + 2] == (stage["hardware"] if stage else "not declared")
            assert body[4 * number + 3] == "not run on an accelerator yet"


def test_route_page_shows_where_a_cited_stage_last_ran_on_an_accelerator(tmp_path: Path) -> None:
    inputs = synthetic_inputs()
    folder = tmp_path / "proj-one"
    folder.mkdir()
    counts = {"passed": 2, "failed": 0, "skipped": 0, "seconds": 1.0, "failures": [], "skips": []}
    report = _accelerator_report("proj-one", "89abcde", "2026-12-07", "2", [("auto", counts)])
    (folder / "accelerator-report.json").write_text(json.dumps(report))
    (folder / "mutation-report.json").write_text(json.dumps({"stages": {"2": {"code_hash": "d"}}}))
    inputs["projects"][0]["folder"] = str(folder)
    build(tmp_path / "site", inputs)
    rows = _rows(tmp_path / "site" / "routes" / "role-a.html", "hardware")
    assert rows[-4:] == [
        "Project one",
        "stage 2 Two",
        "cpu",
        "passed on TPU v5 lite (2026-12-07, 89abcde) stale: code changed since",
    ]
    assert rows[-5] == "not run on an accelerator yet"  # stage 1 has no run
