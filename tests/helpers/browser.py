"""Open a page in a real headless browser (Debian's chromium, driven by Playwright).

The browser is the system's (``apt-get install chromium``, docs/getting-started.md);
Playwright downloads nothing. Tests that need it skip, saying why, when either
is missing.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def chromium_path() -> str:
    """The system chromium, or skip the calling test with the reason."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            break
    else:
        pytest.skip("no chromium on PATH (docs/getting-started.md: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    return found


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # anything not file: or data:
    plots: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    # The page's structure as rendered: tables inside table cells (a nested dump), each
    # section's title, text and tables/plots, each "More from the manifest" entry's.
    nested_tables: int = 0
    sections: list[dict[str, Any]] = field(default_factory=list)
    more: list[dict[str, Any]] = field(default_factory=list)
    # What each plot's SVG draws, laid out by the browser (issue 39): data lines drawn
    # twice (one hides the other), a legend over the plotted area, a scale in a corner
    # label (``1e6``) instead of readable ticks.
    drawn: list[dict[str, Any]] = field(default_factory=list)


_STRUCTURE = """() => {
  const count = (el, sel) => (el.matches(sel) ? 1 : 0) + el.querySelectorAll(sel).length;
  const sections = Array.from(document.querySelectorAll('section')).map(s => {
    const h = s.querySelector('h2');
    return {title: h.textContent, text: s.innerText.slice(h.innerText.length).trim(),
            tables: count(s, 'table'), plots: count(s, 'img.plot')};
  });
  const more = [];
  for (const h of document.querySelectorAll('#more h3')) {
    let tables = 0, plots = 0, text = '';
    for (let n = h.nextElementSibling; n && n.tagName !== 'H3'; n = n.nextElementSibling) {
      tables += count(n, 'table'); plots += count(n, 'img.plot'); text += n.innerText;
    }
    more.push({title: h.textContent, tables, plots, text: text.trim()});
  }
  return {nested: document.querySelectorAll('td table, th table').length, sections, more};
}"""


# Each img.plot's SVG put into the page (off screen, so the browser lays it out) and
# measured: the paths of its data lines (an axes' own line2d groups; ticks and legend
# keys are inside other groups) drawn more than once, the legend boxes that overlap an
# axes' background patch, and the texts that are a scale exponent (1e6, 1e-05).
_DRAWN = """() => {
  const out = [];
  const box = document.createElement('div');
  box.style.cssText = 'position:absolute;left:-20000px;top:0';
  document.body.appendChild(box);
  for (const img of document.querySelectorAll('img.plot')) {
    const text = atob(img.src.split(',', 2)[1]);
    const svg = new DOMParser().parseFromString(text, 'image/svg+xml').documentElement;
    box.replaceChildren(document.importNode(svg, true));
    const areas = [];
    const paths = [];
    for (const axes of box.querySelectorAll('g[id^="axes_"]')) {
      const bg = axes.querySelector(':scope > g[id^="patch_"]');
      if (bg) areas.push(bg.getBoundingClientRect());
      for (const p of axes.querySelectorAll(':scope > g[id^="line2d_"] > path')) {
        const d = (p.getAttribute('d') || '').trim();
        if (d) paths.push(d);
      }
    }
    const overlaps = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
      && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
    const legends = Array.from(box.querySelectorAll('g[id^="legend_"]'))
      .map(l => l.getBoundingClientRect());
    out.push({
      alt: img.alt,
      lines: paths.length,
      repeated_lines: paths.length - new Set(paths).size,
      legends: legends.length,
      legends_on_plot: legends.filter(l => areas.some(a => overlaps(l, a))).length,
      exponents: Array.from(box.querySelectorAll('text')).map(t => t.textContent.trim())
        .filter(t => /^[-+\u2212]?[0-9.]*e[-+\u2212]?[0-9]+$/i.test(t) || t.includes('\u00d710')),
    });
  }
  box.remove();
  return out;
}"""


@contextlib.contextmanager
def _browser() -> Iterator[Any]:
    """One headless chromium (the system's), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            browser.close()


def _tab(browser: Any, checks: list[PageCheck], *, width: int, height: int) -> Any:
    """A new tab of ``browser`` whose console errors and requests off the disk go to the
    last of ``checks`` (a tab reused for many pages appends a check per page)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.on(
        "console",
        lambda msg: checks[-1].console_errors.append(msg.text) if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: checks[-1].console_errors.append(str(exc)))
    page.on(
        "request",
        lambda req: (
            checks[-1].requests.append(req.url)
            if not req.url.startswith(("file:", "data:"))
            else None
        ),
    )
    return page


def _goto(page: Any, path: Path, check: PageCheck, *, timeout_ms: int) -> None:
    page.goto(path.resolve().as_uri(), wait_until="load", timeout=timeout_ms)
    check.title = page.title()


@contextlib.contextmanager
def _loaded(
    path: Path, check: PageCheck, *, width: int, height: int, timeout_ms: int
) -> Iterator[Any]:
    """A chromium page with ``path`` (file://) loaded, its console errors and its
    requests off the disk recorded in ``check``; the browser closes on exit."""
    with _browser() as browser:
        page = _tab(browser, [check], width=width, height=height)
        _goto(page, path, check, timeout_ms=timeout_ms)
        yield page


def open_page(path: Path, *, screenshot: Path | None = None, full_page: bool = False) -> PageCheck:
    """Load ``path`` (file://) and report console errors, outside requests, how each
    ``img.plot`` rendered (complete, natural size, size on the page) and the structure
    of the sections (``PageCheck``); ``screenshot`` saves what the browser drew."""
    check = PageCheck()
    with _loaded(path, check, width=1280, height=1600, timeout_ms=120_000) as page:
        page.wait_for_function(
            "Array.from(document.images).every(i => i.complete)", timeout=120_000
        )
        check.plots = page.evaluate(
            """Array.from(document.querySelectorAll('img.plot')).map(i => ({
                alt: i.alt, complete: i.complete, width: i.naturalWidth,
                height: i.naturalHeight, shown: i.getBoundingClientRect().width}))"""
        )
        found = page.evaluate(_STRUCTURE)
        check.nested_tables, check.sections, check.more = (
            found["nested"],
            found["sections"],
            found["more"],
        )
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=full_page)
        check.drawn = page.evaluate(_DRAWN)
    return check


# What a reader of a docs page cannot see (issue 39): a code block or a table whose
# content is wider than its box (scrolled sideways, the rest cut off at the edge).
_CUT = """() => Array.from(document.querySelectorAll(
    '.md-content pre > code, .md-content .md-typeset__scrollwrap'))
  .filter(el => el.scrollWidth > el.clientWidth + 1)
  .map(el => ({over: el.scrollWidth - el.clientWidth, text: el.innerText.slice(0, 100)}))"""


@dataclass
class SitePage:
    """A documentation page as the browser drew it: what ``PageCheck`` records, the
    targets of the navigation's links, the number of table rows, and the code blocks
    and tables cut at the column's edge."""

    check: PageCheck
    nav: list[str]
    table_rows: int
    cut: list[dict[str, Any]]


def open_site_pages(
    site: Path, pages: list[Path], *, screenshots: Path | None = None, width: int = 1280
) -> dict[Path, SitePage]:
    """Load each of ``pages`` of the built documentation site (file://, as a reader
    opens it from disk) in one browser, at a laptop's ``width``, and report what
    ``SitePage`` holds; ``screenshots``: a folder for a picture of each page's first screen."""
    found: dict[Path, SitePage] = {}
    checks: list[PageCheck] = []
    with _browser() as browser:
        page = _tab(browser, checks, width=width, height=900)
        for path in pages:
            check = PageCheck()
            checks.append(check)
            _goto(page, path, check, timeout_ms=60_000)
            nav = page.evaluate(
                "Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link'))"
                ".map(a => a.getAttribute('href')).filter(h => h)"
            )
            rows = page.evaluate("document.querySelectorAll('.md-content table tbody tr').length")
            if screenshots is not None:
                name = str(path.relative_to(site).with_suffix(".png")).replace("/", "_")
                page.screenshot(path=str(screenshots / name))
            found[path] = SitePage(check, list(nav), int(rows), page.evaluate(_CUT))
    return found


def assert_readable(check: PageCheck) -> None:
    """What a report worth opening holds, as the browser rendered it (issue 25): every
    plot drawn, no table nested in a table, no section empty or reading "None", and
    every entry of "More from the manifest" a table or a plot."""
    assert check.console_errors == [] and check.requests == []
    assert all(p["complete"] and p["width"] > 50 and p["shown"] > 50 for p in check.plots)
    assert check.nested_tables == 0
    for section in check.sections:
        assert section["text"] or section["plots"], section["title"]
        assert section["text"] not in ("None", "empty"), section["title"]
    for entry in check.more:
        assert entry["tables"] + entry["plots"] >= 1, entry
        assert entry["text"] not in ("None", "empty"), entry
    # Every plot as a reader sees it (issue 39): no line hidden under an identical one,
    # no legend on the bars or lines, tick labels that carry their own scale.
    assert len(check.drawn) == len(check.plots)
    for plot in check.drawn:
        assert plot["repeated_lines"] == 0, plot
        assert plot["legends_on_plot"] == 0, plot
        assert plot["exponents"] == [], plot
