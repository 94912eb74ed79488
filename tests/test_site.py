"""The course website: `make site`'s Jupyter Book build, opened in headless Chromium.

One test: build the site from the committed notebooks into a temporary folder (no notebook is run), then load the home
page and every lesson and deep dive in a real browser. Each page renders its title, its plots and its math, logs no
console error and fetches nothing it cannot find; every relative link on those pages points at a file of the build
(and at an anchor that exists there). Needs the `site` extra (`pip install -e ".[site]"`: jupyter-book, playwright)
and a Chromium (`apt-get install chromium`; CHROMIUM=/path/to/chrome names another); skipped, saying which is
missing, without them. CI (.ci/run) installs both and sets MINIGRPO_SITE_TEST=required, which makes a missing one a
failure instead.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from minigrpo_course.colab import BADGE_IMAGE, release

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
RELEASE = release(ROOT)
BADGE_STAND_IN = ('<svg xmlns="http://www.w3.org/2000/svg" width="117" height="20"><rect width="117" height="20" '
                  'fill="#555"/></svg>')
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DEEP_DIVES = sorted((ROOT / "notebooks" / "deep_dives").glob("[0-9][0-9][a-z]_*.ipynb"))


def _chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def _missing() -> str | None:
    if importlib.util.find_spec("jupyter_book") is None:
        return 'jupyter-book is not installed: pip install -e ".[site]" (or run `make site` once)'
    if importlib.util.find_spec("playwright") is None:
        return 'playwright is not installed: pip install -e ".[site]" (or run `make site` once)'
    if _chromium() is None:
        return "no Chromium found: apt-get install chromium (or set CHROMIUM=/path/to/chrome)"
    return None


def _plain_quotes(text: str) -> str:
    """``text`` with typographic quotes made straight, as they were written in the notebook."""
    return text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'}))


def _title(notebook: Path) -> str:
    """The notebook's first level-1 Markdown heading, as the page's <h1> shows it."""
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise AssertionError(f"{notebook.name} has no title")


def _has_plot(notebook: Path) -> bool:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return any("image/png" in out.get("data", {}) for c in cells if c["cell_type"] == "code" for out in c["outputs"])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if (reason := _missing()) is not None:
        if os.environ.get("MINIGRPO_SITE_TEST") == "required":  # CI (.ci/run) installs both: a skip would hide it
            pytest.fail(f"MINIGRPO_SITE_TEST=required, but {reason}", pytrace=False)
        pytest.skip(f"site test skipped, {reason}")
    out = tmp_path_factory.mktemp("site")
    # the same build as `make site` (warnings are errors), into a temporary folder
    code = "import sys; from jupyter_book.cli.main import main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", code, "build", str(SITE), "--path-output", str(out),
                             "-W", "-n", "--keep-going"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"jupyter-book build failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    html = out / "_build" / "html"
    assert (html / "index.html").is_file()
    return html


def _page_of(notebook: Path, html: Path) -> Path:
    return html / notebook.relative_to(ROOT).with_suffix(".html")


def _check_links(page: Path, html: Path, hrefs: list[str]) -> list[str]:
    """Relative links on a built page that name no file of the build, or an anchor missing from the target."""
    broken = []
    for href in hrefs:
        if not href or urlparse(href).scheme or href.startswith("//"):
            continue  # external (https:, mailto:) or empty
        path, fragment = urldefrag(href)
        target = (page.parent / unquote(path)).resolve() if path else page
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or not target.is_relative_to(html.resolve()):
            broken.append(f"{href} (no such file)")
        elif fragment and target.suffix == ".html" and f'id="{unquote(fragment)}"' not in target.read_text("utf-8"):
            broken.append(f"{href} (no such anchor)")
    return broken


def test_site_builds_and_renders_in_a_browser(site):
    from playwright.sync_api import sync_playwright

    pages = [(nb, _title(nb)) for nb in LESSONS + DEEP_DIVES]
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            # each notebook's Colab badge (minigrpo_course/colab.py) is Google's image: a stand-in serves it here, so
            # that the test needs no network and every other outside request still shows up as a failure
            page.route(BADGE_IMAGE, lambda route: route.fulfill(status=200, content_type="image/svg+xml",
                                                                body=BADGE_STAND_IN))
            errors: list[str] = []
            page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))

            # the home page: the README, with the syllabus as navigation
            page.goto((site / "index.html").as_uri())  # a redirect to the root page, the README
            page.wait_for_url("**/README.html", wait_until="load", timeout=15_000)
            assert "minigrpo" in page.title(), page.title()
            assert page.locator("h1").first.inner_text().strip().rstrip("#").strip() == "minigrpo"
            nav = [unquote(h) for h in page.locator("nav.bd-docs-nav a").evaluate_all("a => a.map(x => x.href)")]
            for nb in LESSONS + DEEP_DIVES:
                assert any(h.endswith(nb.relative_to(ROOT).with_suffix(".html").as_posix()) for h in nav), (
                    f"the navigation does not list {nb.name}")
            problems += [f"README.html: {b}" for b in _check_links(Path(unquote(urlparse(page.url).path)), site,
                                                                   page.locator("article a[href]").evaluate_all(
                                                                       "a => a.map(x => x.getAttribute('href'))"))]
            plots_seen = 0
            for nb, title in pages:
                built = _page_of(nb, site)
                name = nb.relative_to(ROOT).as_posix()
                errors.clear()
                page.goto(built.as_uri(), wait_until="load")
                h1 = page.locator("article h1").first.inner_text()
                # Sphinx typesets quotes (smartquotes): ' and " arrive curly
                if _plain_quotes(title) not in _plain_quotes(h1):
                    problems.append(f"{name}: title {h1!r}, expected {title!r}")
                # plots: every output image on the page has loaded (a plot of zero width did not)
                widths = page.locator("article .cell_output img").evaluate_all("i => i.map(x => x.naturalWidth)")
                if _has_plot(nb) and not widths:
                    problems.append(f"{name}: its committed plots are missing from the page")
                problems += [f"{name}: an output image did not load" for w in widths if w == 0]
                plots_seen += sum(w > 0 for w in widths)
                # math: MathJax typesets every $...$ into an <mjx-container>
                if page.locator("article .math").count():
                    try:
                        page.wait_for_selector("article mjx-container", state="attached", timeout=15_000)
                    except Exception:
                        problems.append(f"{name}: math is present but MathJax rendered none of it")
                hrefs = page.locator("article a[href]").evaluate_all("a => a.map(x => x.getAttribute('href'))")
                problems += [f"{name}: broken link {b}" for b in _check_links(built, site, hrefs)]
                if RELEASE.colab_url(name) not in hrefs:
                    problems.append(f"{name}: no Open-in-Colab badge linking {RELEASE.colab_url(name)}")
                problems += [f"{name}: {e}" for e in errors]
            assert plots_seen > 0, "no plot rendered on any lesson page"
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


def test_lessons_link_their_deep_dives():
    # each deep dive sits under its lesson in the site's navigation, so its lesson must link it
    toc = (SITE / "_toc.yml").read_text()
    for dd in DEEP_DIVES:
        lesson = next((ROOT / "notebooks").glob(f"{dd.name[:2]}_*.ipynb"))
        assert f"deep_dives/{dd.name}" in lesson.read_text(encoding="utf-8"), f"{lesson.name} does not link {dd.name}"
        assert f"file: notebooks/deep_dives/{dd.stem}" in toc, f"{dd.name} is not in site/_toc.yml"
    for lesson in LESSONS:
        assert re.search(rf"file: notebooks/{re.escape(lesson.stem)}\n", toc), f"{lesson.name} is not in site/_toc.yml"
    assert "solutions/" not in toc and "exercises/" not in toc
