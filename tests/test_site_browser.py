"""The built site in a real browser (headless Chromium through Playwright).

Builds the repository with ``catalog-compile``, serves the build folder on
127.0.0.1 (the site sits under ``/site/``, so links must be relative) and
crawls from the index, opening every internal link once. Every page answers
200 with no console error, page error or dialog (an unescaped
``<script>alert(…)</script>`` would open one); every link fragment names an
element; every site page has the same header in the same place; and every
route page's ``document.body.innerText`` is the text build's
``routes/<role-id>.txt`` line for line (for training-engineer also the
published reference text), each practice line naming its project's title,
followed by the capability map. At a 1280x800 window no page is wider than
the window and no table wider than its box, every project page with a
starter shows its download link without scrolling, and the index and every
route page name the hardware of the stages they list. The index's "Start
here" path, a route's capability map and a lesson page are followed link by
link. Opening the site from ``file://`` works too.

Needs Debian's Chromium at /usr/bin/chromium (or ``CHROMIUM``); skipped with
the install command when it is missing, except where ``REQUIRE_BROWSER=1``
(CI sets it): there a missing browser fails the test instead.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest
import yaml

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_ROUTE = ROOT.parent / "shared" / "reference" / "route-training-engineer.txt"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Headless in a container: no sandbox, no GPU, and nothing that reaches out
# to the network on start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build folder written by ``catalog-compile --root <repo> --out <tmp>``."""
    if not Path(CHROMIUM).is_file():
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(f"REQUIRE_BROWSER=1 but Chromium is not at {CHROMIUM}.")
        pytest.skip(
            f"Chromium not found at {CHROMIUM}; install it with `apt-get install chromium` "
            "(or point CHROMIUM at a Chromium binary)"
        )
    pytest.importorskip("playwright.sync_api", reason="the dev extra (playwright) is not installed")
    out = tmp_path_factory.mktemp("build")
    env = dict(os.environ)
    # The compiler runs from the working tree whether or not it is installed.
    source = str(ROOT / "compiler" / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), source]))
    result = subprocess.run(
        [sys.executable, "-m", "catalog_compiler.cli", "--root", str(ROOT), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"catalog-compile exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    assert (out / "site" / "index.html").is_file(), "catalog-compile wrote no site/index.html"
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server(build: Path) -> Iterator[str]:
    """Base URL of the build folder, served on an ephemeral local port."""
    handler = functools.partial(_QuietHandler, directory=str(build))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _lines(text: str) -> list[str]:
    return text.split("\n")


PRACTICE = "Practice project: stages "


def _page_lines(route_text: str, build: Path, role_id: str) -> list[str]:
    """A route text's lines as its page shows them: each practice line names the
    title of the project it cites (titles from the manifests, ids from the
    built catalog.json)."""
    titles = {}
    for manifest in (ROOT / "projects").glob("*/project.toml"):
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
        titles[data["id"]] = data["title"]
    catalog = json.loads((build / "catalog.json").read_text(encoding="utf-8"))
    role = next(r for r in catalog["roles"] if r["id"] == role_id)
    names = iter(titles[item["projectId"]] for item in role["skillEvidence"])
    return [
        f"Practice project: {next(names)}, stages {line[len(PRACTICE) :]}"
        if line.startswith(PRACTICE)
        else line
        for line in _lines(route_text)
    ]


def _assert_route_page(shown: str, route_text: str, build: Path, role_id: str, url: str) -> None:
    expected = _page_lines(route_text, build, role_id)
    lines = _lines(shown)
    assert lines[: len(expected)] == expected, f"{url}: rendered text differs"
    assert lines[len(expected)] == "Capability map", f"{url}: no capability map below the note"


HEADER = """() => {
  const h = document.querySelector('header.site-header');
  if (!h) return null;
  const r = h.getBoundingClientRect();
  const links = [...h.querySelectorAll('a')].map(a => {
    const b = a.getBoundingClientRect();
    return [a.textContent, new URL(a.href).pathname.split('/').pop() + new URL(a.href).hash,
            Math.round(b.left), Math.round(b.top)];
  });
  return {rect: [r.left, r.top, r.width, r.height], links,
          position: getComputedStyle(h).position, text: h.innerText,
          items: h.querySelectorAll('nav > *').length};
}"""


VIEWPORT = {"width": 1280, "height": 800}
# What sticks out at this window: the page's width past the window, and each
# table wider than the box it sits in.
OVERFLOW = """() => ({
  page: [document.documentElement.scrollWidth, window.innerWidth],
  tables: [...document.querySelectorAll('table')]
    .filter(t => t.scrollWidth > t.parentElement.clientWidth)
    .map(t => `table.${t.className} ${t.scrollWidth} > ${t.parentElement.clientWidth}`),
})"""
# The starter's download link, in window coordinates as the page opens.
DOWNLOAD = """() => {
  const a = document.querySelector('#start a[href$=".zip"]');
  if (!a) return null;
  const b = a.getBoundingClientRect();
  return {bottom: b.top + b.height, top: b.top, scrollY: window.scrollY};
}"""


def _check_layout(page, relative: str, build: Path) -> list[str]:
    """At the 1280x800 window: nothing wider than the window or its table's box; on a
    project page with a starter, its download link shows without scrolling; the
    index and every route page name the hardware of the stages they list."""
    problems = []
    found = page.evaluate(OVERFLOW)
    if found["page"][0] > found["page"][1]:
        problems.append(f"{relative}: the page is {found['page'][0]} px wide at 1280")
    problems += [f"{relative}: {table}" for table in found["tables"]]
    if relative.startswith("projects/"):
        starter = build / "site" / "learn" / f"{Path(relative).stem}.zip"
        link = page.evaluate(DOWNLOAD)
        if starter.is_file() and not (
            link and link["scrollY"] == 0 and 0 <= link["top"] and link["bottom"] <= 800
        ):
            problems.append(f"{relative}: the download link is not in the first window: {link}")
    declared = {
        stage["hardware"]
        for path in (ROOT / "projects").glob("*/project.toml")
        for stage in tomllib.loads(path.read_text("utf-8"))["stages"]
    }
    if relative == "index.html":
        # Each project names the hardware its stages need.
        for entry in page.locator("#projects li").all_inner_texts():
            needs = entry.partition("needs: ")[2]
            if not needs or not any(kind in needs for kind in declared):
                problems.append(f"{relative}: no hardware for {entry!r}")
    if relative.startswith("routes/"):
        cells = page.locator("#hardware tbody td:nth-child(3)").all_inner_texts()
        if not cells or not set(cells) <= declared:
            problems.append(f"{relative}: stage hardware {cells} is not the manifests' {declared}")
    return problems


def test_crawl_every_page(build: Path, server: str, browser) -> None:
    site = server + "site/"
    page = browser.new_page(viewport=VIEWPORT)
    problems: list[str] = []
    page.on(
        "console",
        lambda m: m.type == "error" and problems.append(f"console: {m.text} at {m.location}"),
    )
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status}: {r.url}"))

    def on_dialog(dialog) -> None:
        problems.append(f"dialog ({dialog.type}): {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)

    queue = [site + "index.html"]
    seen = set(queue)
    ids: dict[str, set[str]] = {}
    fragments: list[tuple[str, str, str]] = []  # (from page, to page, fragment)
    route_pages: set[str] = set()
    headers: dict[str, dict] = {}
    while queue:
        url = queue.pop(0)
        if not url.endswith(".html"):
            # A resource (the stylesheet) is fetched, not opened as a page: a
            # browser showing a bare file would ask the server for a favicon.
            resource = page.request.get(url)
            assert resource.status == 200, f"{url}: {resource.status}"
            continue
        response = page.goto(url)
        assert response is not None and response.status == 200, f"{url}: {response}"
        ids[url] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        # Documentation a lesson links (rel=external) lies outside the site by design.
        hrefs = page.eval_on_selector_all(
            "a[href]:not([rel~=external]), link[href]:not([rel=icon])",
            "els => els.map(e => e.href)",
        )
        assert hrefs, f"{url} has no links"
        for href in hrefs:
            target, fragment = urldefrag(href)
            # Relative links resolve under the served site folder; anything
            # else is an absolute or root-relative link the site must not use.
            assert target.startswith(site), f"{url}: link {href} leaves the site"
            if fragment:
                fragments.append((url, target, fragment))
            if target not in seen:
                seen.add(target)
                queue.append(target)

        relative = url[len(site) :]
        problems += _check_layout(page, relative, build)
        # The sample dossiers are the learner's dossier page, standalone.
        if not relative.startswith("dossiers/"):
            headers[relative] = page.evaluate(HEADER)
        if relative.startswith("routes/"):
            role_id = Path(urlsplit(relative).path).stem
            route_pages.add(role_id)
            shown = page.evaluate("document.body.innerText")
            expected = (build / "routes" / f"{role_id}.txt").read_text(encoding="utf-8")
            _assert_route_page(shown, expected, build, role_id, url)
            if role_id == "training-engineer" and REFERENCE_ROUTE.is_file():
                reference = REFERENCE_ROUTE.read_text(encoding="utf-8")
                _assert_route_page(shown, reference, build, role_id, url)

    assert problems == []
    # One header: same box, same links at the same places, on every site page.
    assert headers and None not in headers.values(), "a site page without the header"
    first = headers["index.html"]
    assert first["text"] == "JAX PathwaysAll career routesCareer learning guide"
    assert [link[1] for link in first["links"]] == [
        "index.html",
        "index.html#routes",
        "index.html#start-here",
    ]
    assert first["items"] == 3 and first["position"] == "sticky"
    for relative, header in headers.items():
        assert header == first, f"{relative}: the header differs from the index's"
    for source, target, fragment in fragments:
        assert fragment in ids.get(target, set()), f"{source}: no #{fragment} on {target}"
    texts = {path.stem for path in (build / "routes").glob("*.txt")}
    assert texts and route_pages == texts, "every route text has a page linked from the site"
    built = {
        str(path.relative_to(build / "site")).replace(os.sep, "/")
        for path in (build / "site").rglob("*")
        if path.is_file()
    }
    crawled = {url[len(site) :] for url in seen}
    assert built == crawled, "every page written is reachable from the index, and only those"
    page.close()


def test_site_works_from_file_urls(build: Path, browser, tmp_path: Path) -> None:
    # A copy under a path with a space: relative links survive any location.
    site = tmp_path / "a folder" / "site"
    shutil.copytree(build / "site", site)
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(site.joinpath("index.html").as_uri())
    page.locator("#routes a[href='routes/training-engineer.html']").click()
    page.wait_for_url("**/routes/training-engineer.html")
    expected = (build / "routes" / "training-engineer.txt").read_text(encoding="utf-8")
    shown = page.evaluate("document.body.innerText")
    _assert_route_page(shown, expected, build, "training-engineer", page.url)
    # The stylesheet applied: the header items are inline but spaced apart.
    margin = page.evaluate("getComputedStyle(document.querySelector('.site-header a')).marginRight")
    assert margin not in ("", "0px")
    # The header stays at the top of the window while the page scrolls.
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    top = page.evaluate("document.querySelector('.site-header').getBoundingClientRect().top")
    assert page.evaluate("window.scrollY") > 0 and top == 0
    page.locator(".practice a.project-link", has_text="MLP classifier").first.click()
    page.wait_for_url("**/projects/mlp-classifier.html")
    assert page.locator("table.stages").count() == 1
    assert dialogs == []
    page.close()


def _watch(page) -> list[str]:
    """Collect every console error, page error, failed response and dialog of ``page``."""
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status}: {r.url}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    return problems


def _follow(page, hrefs: list[str], site: str, build: Path) -> int:
    """Open every href: each is a page of the build that loads (200), and a
    fragment names an element there. Returns how many were opened."""
    for href in hrefs:
        target, fragment = urldefrag(href)
        assert target.startswith(site), f"{href} leaves the site"
        assert (build / "site" / target[len(site) :]).is_file(), f"{href}: not in the build"
        page.goto("about:blank")  # a fresh load even where only the fragment differs
        response = page.goto(href)
        assert response is not None and response.status == 200, f"{href}: {response}"
        if fragment:
            assert page.locator(f"[id='{fragment}']").count() == 1, f"{href}: no #{fragment}"
    return len(hrefs)


def _below_header(page, selector: str) -> bool:
    """Whether the top of ``selector`` shows below the sticky header (not under it)."""
    return page.evaluate(
        """(sel) => document.querySelector(sel).getBoundingClientRect().top >=
           document.querySelector('.site-header').getBoundingClientRect().bottom - 1""",
        selector,
    )


SIZE = re.compile(
    r"^(milestone \d+: .+|optional extension|not cited by this route: .+) · (\d+) stages? · "
    r"(\d+ exercise regions? · \d+ lines? to write|no exercise regions)$"
)


def test_start_here_path_lists_each_route_and_every_link_on_it_loads(
    build: Path, server: str, browser
) -> None:
    site = server + "site/"
    page = browser.new_page()
    problems = _watch(page)
    page.goto(site + "routes/training-engineer.html")
    # The header's "Career learning guide" is a link, to the path.
    page.locator(".site-header a", has_text="Career learning guide").click()
    page.wait_for_url("**/index.html#start-here")
    assert _below_header(page, "#start-here h2")
    catalog = json.loads((build / "catalog.json").read_text(encoding="utf-8"))
    stages = {
        path.parent.name: tomllib.loads(path.read_text("utf-8"))["stages"]
        for path in (ROOT / "projects").glob("*/project.toml")
    }
    exemplars = set()
    for role in catalog["roles"]:
        entries = page.locator(f"#start-{role['id']} li.path-project")
        assert entries.count() >= 1, role["id"]
        listed = []
        for i in range(entries.count()):
            entry = entries.nth(i)
            project_id = Path(urlsplit(entry.locator("a").first.get_attribute("href")).path).stem
            listed.append(project_id)
            detail = entry.locator(".muted").inner_text()
            match = SIZE.match(detail)
            assert match, f"{role['id']}: {detail!r}"
            assert int(match[2]) == len(stages[project_id]), f"{role['id']}: {project_id}"
            assert (entry.locator(".badge-exemplar").count() == 1) == (i == 0), role["id"]
        exemplars.add(listed[0])
        cited = {item["projectId"] for item in role["skillEvidence"]}
        assert set(listed) == cited | {listed[0]} and len(listed) == len(set(listed)), role["id"]
    assert len(exemplars) == 1, "one exemplar heads every route"
    hrefs = page.eval_on_selector_all("#start-here a[href]", "els => els.map(e => e.href)")
    assert _follow(page, hrefs, site, build) >= 2 * len(catalog["roles"])
    assert problems == []
    page.close()


def test_capability_map_is_below_the_scope_note_with_its_stage_links(
    build: Path, server: str, browser
) -> None:
    site = server + "site/"
    page = browser.new_page()
    problems = _watch(page)
    page.goto(site + "routes/training-engineer.html")
    page.locator("footer.scope-note a", has_text="capability map").click()
    page.wait_for_url("**/routes/training-engineer.html#capability-map")
    assert _below_header(page, "#capability-map")
    assert page.evaluate(
        """() => document.querySelector('footer.scope-note').getBoundingClientRect().bottom <=
           document.querySelector('#capability-map').getBoundingClientRect().top"""
    ), "the map is below the note that announces it"
    catalog = json.loads((build / "catalog.json").read_text(encoding="utf-8"))
    role = next(r for r in catalog["roles"] if r["id"] == "training-engineer")
    groups = page.locator("#capability-map h3.map-group").all_inner_texts()
    assert groups[:2] == ["Required route practice", "Optional extensions"]
    for kind, required in (("required", True), ("optional", False)):
        shown = page.locator(f"#capability-map li.map-{kind} > a:first-child").all_inner_texts()
        expected = [
            item["skill"]
            for item in role["skillEvidence"]
            if (item["scope"] == "Required route practice") == required
        ]
        assert shown == expected, kind
    for item in page.locator("#capability-map li.map-skill").all():
        assert item.locator(".map-evidence a[href*='#stage-']").count() >= 1
    hrefs = page.eval_on_selector_all("#capability-map a[href]", "els => els.map(e => e.href)")
    assert _follow(page, hrefs, site, build) > len(role["skillEvidence"])
    assert problems == []
    page.close()


def test_lesson_page_links_the_stages_that_practise_it(build: Path, server: str, browser) -> None:
    site = server + "site/"
    page = browser.new_page()
    problems = _watch(page)
    page.goto(site + "routes/training-engineer.html#capability-map")
    page.locator("#capability-map a", has_text="networks-02").click()
    page.wait_for_url("**/lessons/networks-02.html")
    text = page.evaluate("document.body.innerText")
    assert (
        "Project stages that practise it\nMLP classifier: stage 1 Model and explicit state" in text
    )
    lessons = yaml.safe_load((ROOT / "catalog" / "lessons.yaml").read_text("utf-8"))["lessons"]
    lesson = next(entry for entry in lessons if entry["id"] == "networks-02")
    if lesson.get("docs"):
        assert page.locator("#documentation a[rel~=external]").count() == len(lesson["docs"])
    else:
        assert "The catalog lists no documentation for this lesson yet" in text
    page.locator("#practice a", has_text="stage 1").click()
    page.wait_for_url("**/projects/mlp-classifier.html#stage-1")
    assert page.evaluate("document.querySelector('tr:target').id") == "stage-1"
    assert _below_header(page, "tr:target")
    page.go_back()
    page.wait_for_url("**/lessons/networks-02.html")
    hrefs = page.eval_on_selector_all(
        "main a[href]:not([rel~=external])", "els => els.map(e => e.href)"
    )
    assert _follow(page, hrefs, site, build) >= 4
    assert problems == []
    page.close()


def test_sample_dossier_and_a_coverage_page_open_with_every_link_resolving(
    build: Path, browser, tmp_path: Path
) -> None:
    """The site's sample dossier of a project with reference evidence, and the
    coverage page `catalog-compile coverage --format html` writes: each opens
    without a dialog or error, every link (fragments included) resolves, and
    text is shown as written (escaped, not interpreted)."""
    dossiers = sorted((build / "site" / "dossiers").glob("*/index.html"))
    assert dossiers, "the site publishes no sample dossier"
    out = tmp_path / "coverage"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [env.get("PYTHONPATH"), str(ROOT / "compiler" / "src")])
    )
    evidence = [
        str(p)
        for p in sorted((ROOT / "projects").glob("*/evidence"))
        if (p / "progress.json").is_file()
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "catalog_compiler.cli",
            "coverage",
            "--root",
            str(ROOT),
            "--role",
            "training-engineer",
            "--format",
            "html",
            "--out",
            str(out),
            *evidence,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pages = [*dossiers, out / "coverage-training-engineer.html"]
    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    for path in pages:
        page.goto(path.as_uri())
        ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        hrefs = page.eval_on_selector_all(
            "a[href], link[href]:not([rel=icon])", "els => els.map(e => e.href)"
        )
        assert hrefs, f"{path} has no links"
        for href in hrefs:
            target, fragment = urldefrag(href)
            assert target.startswith("file://"), f"{path}: link {href} leaves the folder"
            local = Path(urlsplit(target).path.replace("%20", " "))
            assert local.is_file(), f"{path}: {href} does not resolve"
            if fragment and local == path:
                assert fragment in ids, f"{path}: no #{fragment}"
        shown = page.evaluate("document.body.innerText")
        if path.name == "index.html":
            assert "self-run evidence" in shown and "not independent review" in shown
            assert "demonstrated" in shown
        else:
            assert "ML & training engineer: milestone coverage" in shown
            assert "Required skills covered:" in shown
    assert problems == []
    page.close()
