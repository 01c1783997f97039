"""The built site in a real browser (headless Chromium through Playwright).

Builds the repository with ``catalog-compile``, serves the build folder on
127.0.0.1 (the site sits under ``/site/``, so links must be relative) and
crawls from the index, opening every internal link once. Every page answers
200 with no console error, page error or dialog (an unescaped
``<script>alert(…)</script>`` would open one); every link fragment names an
element; and every route page's ``document.body.innerText`` equals the text
build's ``routes/<role-id>.txt`` line for line, and for training-engineer the
published reference text. Opening the site from ``file://`` works too.

Needs Debian's Chromium at /usr/bin/chromium (or ``CHROMIUM``); skipped with
the install command when it is missing, except where ``REQUIRE_BROWSER=1``
(CI sets it): there a missing browser fails the test instead.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest

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


def test_crawl_every_page(build: Path, server: str, browser) -> None:
    site = server + "site/"
    page = browser.new_page()
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
        hrefs = page.eval_on_selector_all(
            "a[href], link[href]:not([rel=icon])", "els => els.map(e => e.href)"
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
        if relative.startswith("routes/"):
            role_id = Path(urlsplit(relative).path).stem
            route_pages.add(role_id)
            shown = page.evaluate("document.body.innerText")
            expected = (build / "routes" / f"{role_id}.txt").read_text(encoding="utf-8")
            assert _lines(shown) == _lines(expected), f"{url}: rendered text differs"
            if role_id == "training-engineer" and REFERENCE_ROUTE.is_file():
                reference = REFERENCE_ROUTE.read_text(encoding="utf-8")
                assert _lines(shown) == _lines(reference), f"{url}: differs from the reference"

    assert problems == []
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
    page.locator("a[href='routes/training-engineer.html']").click()
    page.wait_for_url("**/routes/training-engineer.html")
    expected = (build / "routes" / "training-engineer.txt").read_text(encoding="utf-8")
    assert _lines(page.evaluate("document.body.innerText")) == _lines(expected)
    # The stylesheet applied: the header items are inline but spaced apart.
    margin = page.evaluate("getComputedStyle(document.querySelector('.site-header a')).marginRight")
    assert margin not in ("", "0px")
    page.locator("a", has_text="Practice project").first.click()
    page.wait_for_url("**/projects/*.html")
    assert page.locator("table.stages").count() == 1
    assert dialogs == []
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
