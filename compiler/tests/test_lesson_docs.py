"""Lesson documentation links: the real catalog's links, and how bad ones are refused.

Every lesson of ``catalog/lessons.yaml`` lists 1 to 3 pages of official
documentation (``docs``: ``title`` and ``url``), each an https address on one
of the official hosts below and none twice in a lesson; the site renders them
on the lesson page. A link with a non-https address, without a title, with a
repeated address or with an unknown key is refused by the compiler with one
located schema diagnostic. The real catalog is read with PyYAML directly, not
through the compiler, so these checks do not depend on the code they test.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import REPO, run_cli, run_json

LESSONS = "catalog/lessons.yaml"

# The official documentation sites a lesson may link (the project's own docs).
OFFICIAL_HOSTS = {
    "docs.jax.dev",  # JAX, including Pallas and jax.export
    "flax.readthedocs.io",  # Flax NNX
    "optax.readthedocs.io",  # Optax
    "orbax.readthedocs.io",  # Orbax
    "google-grain.readthedocs.io",  # Grain
    "num.pyro.ai",  # NumPyro
    "docs.kidger.site",  # Diffrax
    "mlflow.org",  # MLflow
    "tunix.readthedocs.io",  # Tunix
    "docs.python.org",  # Python standard library
    "pypi.org",  # package pages of XProf and Tunix
    "cloud.google.com",  # Cloud TPU and Vertex AI
}


def _real_lessons() -> list[dict]:
    data = yaml.safe_load((REPO / LESSONS).read_text(encoding="utf-8"))
    return data["lessons"]


def _ids(lessons: list[dict]) -> list[str]:
    return [lesson["id"] for lesson in lessons]


REAL = _real_lessons()


def test_the_real_catalog_has_lessons_to_check() -> None:
    """The checks below run over the real catalog's lessons, and there are some."""
    assert len(REAL) >= 80
    assert len(set(_ids(REAL))) == len(REAL)


@pytest.mark.parametrize("lesson", REAL, ids=_ids(REAL))
def test_every_real_lesson_links_one_to_three_docs(lesson: dict) -> None:
    """Each lesson lists at least one and at most three documentation links."""
    docs = lesson.get("docs")
    assert isinstance(docs, list), f"{lesson['id']} has no `docs` list"
    assert 1 <= len(docs) <= 3, f"{lesson['id']} lists {len(docs)} docs"
    for doc in docs:
        assert set(doc) == {"title", "url"}, doc
        assert isinstance(doc["title"], str) and doc["title"].strip(), doc


@pytest.mark.parametrize("lesson", REAL, ids=_ids(REAL))
def test_every_real_doc_url_is_https_on_an_official_host(lesson: dict) -> None:
    """Every link is an https address whose host is an official documentation site."""
    for doc in lesson.get("docs") or []:
        parts = urlsplit(doc["url"])
        assert parts.scheme == "https", doc["url"]
        assert parts.hostname in OFFICIAL_HOSTS, doc["url"]
        assert not any(c.isspace() for c in doc["url"]), doc["url"]


@pytest.mark.parametrize("lesson", REAL, ids=_ids(REAL))
def test_no_real_lesson_repeats_a_url(lesson: dict) -> None:
    """Within one lesson, no documentation address appears twice."""
    urls = [doc["url"] for doc in lesson.get("docs") or []]
    assert len(urls) == len(set(urls)), urls


# The compiler on the valid fixture with documentation links added -----------

FIRST_TITLE = "    title: First lesson\n"


def _with_docs(repo: Path, block: str) -> str:
    """Give the fixture's first lesson the ``docs`` block ``block``; return the text."""
    path = repo / LESSONS
    text = path.read_text(encoding="utf-8")
    assert FIRST_TITLE in text
    text = text.replace(FIRST_TITLE, FIRST_TITLE + "    docs:\n" + block, 1)
    path.write_text(text, encoding="utf-8")
    return text


def _position(text: str, line_text: str, value: str) -> tuple[int, int]:
    """1-based line and column of ``value`` on the line that reads ``line_text``."""
    lines = text.splitlines()
    index = lines.index(line_text)
    return index + 1, lines[index].index(value) + 1


def _only(repo: Path) -> dict:
    exit_code, report = run_json(repo)
    assert exit_code == 1, report
    assert len(report["diagnostics"]) == 1, report["diagnostics"]
    return report["diagnostics"][0]


def test_valid_docs_compile_and_render_on_the_lesson_page(valid_repo: Path) -> None:
    """Well-formed links compile cleanly and appear, in order, on the lesson page."""
    _with_docs(
        valid_repo,
        "      - title: Quickstart guide\n"
        "        url: https://docs.jax.dev/en/latest/quickstart.html\n"
        "      - title: Second page\n"
        "        url: https://flax.readthedocs.io/en/latest/\n",
    )
    result = run_cli("--root", valid_repo, "--strict")
    assert result.exit_code == 0, result.output
    page = (valid_repo / "build" / "site" / "lessons" / "basics-01.html").read_text("utf-8")
    first = page.index('href="https://docs.jax.dev/en/latest/quickstart.html"')
    second = page.index('href="https://flax.readthedocs.io/en/latest/"')
    assert first < second
    assert ">Quickstart guide</a>" in page
    other = (valid_repo / "build" / "site" / "lessons" / "basics-02.html").read_text("utf-8")
    assert "quickstart.html" not in other


@pytest.mark.parametrize(
    "url",
    [
        "http://docs.jax.dev/en/latest/",
        "ftp://docs.jax.dev/en/latest/",
        "docs.jax.dev/en/latest/",
        "/en/latest/quickstart.html",
        "https://",
        "'https://docs.jax.dev/a page.html'",
    ],
)
def test_a_doc_url_that_is_not_https_is_refused(valid_repo: Path, url: str) -> None:
    """A non-https (or host-less, relative, spaced) address is one SCH003 at the value."""
    line_text = f"        url: {url}"
    text = _with_docs(valid_repo, f"      - title: Guide\n{line_text}\n")
    d = _only(valid_repo)
    assert d["code"] == "SCH003"
    assert d["file"] == LESSONS
    assert d["pointer"] == "/lessons/0/docs/0/url"
    assert (d["line"], d["column"]) == _position(text, line_text, url)
    assert "https://" in d["message"]
    assert "host name" in d["message"]


def test_a_doc_without_a_title_is_refused(valid_repo: Path) -> None:
    """A link with no title is one SCH002 naming the missing key."""
    text = _with_docs(valid_repo, "      - url: https://docs.jax.dev/en/latest/\n")
    d = _only(valid_repo)
    assert d["code"] == "SCH002"
    assert d["file"] == LESSONS
    assert d["pointer"] == "/lessons/0/docs/0/title"
    assert "`title`" in d["message"]
    assert d["line"] == text.splitlines().index("      - url: https://docs.jax.dev/en/latest/") + 1


def test_a_doc_with_an_empty_title_is_refused(valid_repo: Path) -> None:
    """An empty title is one SCH004 at the title."""
    _with_docs(valid_repo, '      - title: ""\n        url: https://docs.jax.dev/en/latest/\n')
    d = _only(valid_repo)
    assert (d["code"], d["pointer"]) == ("SCH004", "/lessons/0/docs/0/title")
    assert "must not be empty" in d["message"]


def test_a_repeated_doc_url_is_refused(valid_repo: Path) -> None:
    """The same address twice in one lesson is one diagnostic at `docs` naming it."""
    url = "https://docs.jax.dev/en/latest/jit-compilation.html"
    _with_docs(
        valid_repo,
        f"      - title: One\n        url: {url}\n      - title: Two\n        url: {url}\n",
    )
    d = _only(valid_repo)
    assert (d["code"], d["pointer"]) == ("SCH003", "/lessons/0/docs")
    assert "once" in d["message"]
    assert url in d["message"]


def test_an_unknown_key_in_a_doc_is_refused(valid_repo: Path) -> None:
    """A misspelt key (`link` for `url`) is refused; the missing `url` is reported too."""
    _with_docs(valid_repo, "      - title: Guide\n        link: https://docs.jax.dev/\n")
    exit_code, report = run_json(valid_repo)
    assert exit_code == 1
    found = {(d["code"], d["pointer"]) for d in report["diagnostics"]}
    assert found == {
        ("SCH001", "/lessons/0/docs/0/link"),
        ("SCH002", "/lessons/0/docs/0/url"),
    }


def test_docs_that_are_not_a_list_are_refused(valid_repo: Path) -> None:
    """`docs` given as one mapping instead of a list is one SCH003 at `docs`."""
    path = valid_repo / LESSONS
    text = path.read_text(encoding="utf-8").replace(
        FIRST_TITLE, FIRST_TITLE + "    docs: {title: Guide, url: 'https://docs.jax.dev/'}\n", 1
    )
    path.write_text(text, encoding="utf-8")
    d = _only(valid_repo)
    assert (d["code"], d["pointer"]) == ("SCH003", "/lessons/0/docs")
    assert "a list" in d["message"]
