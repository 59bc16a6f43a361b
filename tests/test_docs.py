"""The README and the documentation site say what the code does: a short README whose
commands are the ones CI runs and whose cost is the plan's, a site that builds strictly,
a recipe reference generated from the schema, and tables that list every option and
exit code the code has."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import pytest

from factory import errors
from factory.core.schemadoc import key_docs
from factory.recipe import Recipe, RecipeBase, json_schema, load_recipe
from factory.schemas import recipe_reference
from tests.conftest import ROOT
from tests.helpers import model_field_paths, readme_commands
from tests.helpers.browser import chromium_path, open_site_pages

README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 15_000  # issue 25: at most 15 KB; everything else lives in docs/


def _section(text: str, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    part = text.split(f"\n{heading}\n", 1)
    assert len(part) == 2, f"no heading {heading!r}"
    return re.split(rf"\n{level} ", part[1], maxsplit=1)[0]


def _fenced(text: str, lang: str = "bash") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    """The commands of a shell block, a line continued with a backslash joined (the docs
    break a long command so that the page shows it whole)."""
    lines = (line.strip() for line in re.sub(r"[ \t]*\\\n[ \t]*", " ", block).splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# --- the README --------------------------------------------------------------------------


def test_the_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move a section into docs/"


def test_the_readme_set_up_commands_are_the_ones_ci_runs() -> None:
    install, test, offline = readme_commands()
    assert install.startswith("python3 -m venv .venv") and "pip install" in install
    assert test.startswith(".venv/bin/python -m pytest")
    assert "factory.run airline.yaml --devserver" in offline
    # .ci/run quiets pip (-q); otherwise it runs each command as written.
    ci = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    quiet_install = install.replace("pip install ", "pip install -q ")
    for command in (quiet_install, test, offline):
        assert command in ci, f".ci/run does not run the README's {command!r}"
    # The site's home and getting-started pages open with the same three.
    for name in ("index.md", "getting-started.md"):
        page = (DOCS / name).read_text(encoding="utf-8")
        assert _commands(_fenced(page)[0]) == [install, test, offline], name


def test_the_first_screen_holds_the_set_up_and_the_headline_command_with_its_cost() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = "\n".join(text.splitlines()[:45])
    assert readme_commands()[2] in first_screen
    headline = "ray job submit --working-dir . -- python -m factory.run airline.yaml"
    assert headline in first_screen
    cost = re.search(
        r"about \$(\d[\d,]*) with (\S+) for (\d+)k rows; run `--dry-run` first", first_screen
    )
    assert cost, "the headline command must say what it costs"
    cap = re.search(r"`amplify\.max_cost_usd`, is \$(\d[\d,]*)", first_screen)
    assert cap
    usd, model, thousands = int(cost.group(1).replace(",", "")), cost.group(2), int(cost.group(3))
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml")
    assert cfg.llm is not None and cfg.amplify is not None
    assert (model, thousands * 1000) == (cfg.llm.model, cfg.amplify.target)
    assert cfg.amplify.max_cost_usd == float(cap.group(1).replace(",", ""))
    assert abs(_planned_cost(cfg) - usd) <= 0.03 * usd  # "about": the dry run's estimate


def _planned_cost(cfg: Recipe) -> float:
    from factory.engine.plan import make_plan

    plan = make_plan(cfg, with_examples=False)
    return sum(s.cost_usd for s in plan.stages if s.cost_usd is not None)


def test_readme_links_point_at_files_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, missing


# --- the site ----------------------------------------------------------------------------


def _build(site: Path) -> None:
    """``mkdocs build --strict`` in process: any warning (a broken link or anchor, a page
    missing from the nav, a missing include) aborts it."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True)
    build(config)


def test_the_site_builds_strictly(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.chdir(ROOT)  # the snippets' base path (ARCHITECTURE.md, BENCHMARKS.md)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    site = tmp_path / "site"
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        try:
            _build(site)
        except SystemExit as exc:  # mkdocs' Abort in strict mode
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            pytest.fail(f"mkdocs build --strict: {exc}: {warnings}")
    for page in ("index.html", "reference/recipe.html", "architecture.html", "benchmarks.html"):
        assert (site / page).is_file(), page
    assert "One row, from seed file to Parquet shard" in (site / "architecture.html").read_text()
    assert "fonts.googleapis" not in (site / "index.html").read_text()


def _rendered(pages: list[Path]) -> dict[Path, str]:
    """Docs pages as the site's Markdown renders them (mkdocs.yml's extensions, the
    snippets included), without building the site."""
    import markdown
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    md = markdown.Markdown(
        extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"]
    )
    return {page: md.reset().convert(page.read_text(encoding="utf-8")) for page in pages}


# A line of a rendered paragraph that starts like a list item: a list written without
# the blank line before it, or an item after a block indented 3 spaces instead of 4 (it
# ends the list and the next item reads as the paragraph's text).
_SWALLOWED_ITEM = re.compile(r"^\s*(?:\d+\.|[*+-])\s+\S.*", re.M)


def test_the_pages_render_as_github_shows_them(monkeypatch) -> None:
    """Python-Markdown, unlike GitHub, needs a blank line before a list and 4 spaces
    before a list item's second block (issue 39: docs/first-run.md's item 4 read as the
    paragraph before it), starts an ordered list at 1 unless told (``sane_lists``:
    ARCHITECTURE.md's steps count from 0) and shows a table's ``\\|`` inside code as
    written."""
    monkeypatch.chdir(ROOT)  # the snippets' base path (ARCHITECTURE.md, BENCHMARKS.md)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    wrong = []
    rendered = _rendered(sorted(DOCS.rglob("*.md")))
    for page, html in rendered.items():
        for paragraph in re.findall(r"<p>(.*?)</p>", html, re.S):
            text = re.sub(r"<[^>]+>", "", paragraph)
            wrong += [f"{page.relative_to(ROOT)}: {m}" for m in _SWALLOWED_ITEM.findall(text)]
        wrong += [f"{page.relative_to(ROOT)}: {c}" for c in re.findall(r"<code>[^<]*\\\|", html)]
    assert not wrong, wrong
    assert '<ol start="0">' in rendered[DOCS / "architecture.md"]


def test_every_page_is_in_the_nav() -> None:
    import yaml

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for v in node.values() for p in pages(v)]
        if isinstance(node, list):
            return [p for v in node for p in pages(v)]
        return []

    # mkdocs.yml holds no Python tags, so the safe loader reads it
    nav = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk


def test_the_recipe_reference_is_current() -> None:
    shipped = (DOCS / "reference" / "recipe.md").read_text(encoding="utf-8")
    assert shipped == recipe_reference(json_schema()), "run: python -m factory.schemas"


def test_the_recipe_reference_lists_every_field_with_a_description() -> None:
    documented = {d.path for d in key_docs(json_schema())}
    assert documented == model_field_paths(RecipeBase)
    undescribed = [d.path for d in key_docs(json_schema()) if not d.description]
    assert not undescribed, f"fields without a description in factory/recipe/: {undescribed}"


def test_every_run_option_is_documented() -> None:
    from factory.run import _parser

    table = _section((DOCS / "cli.md").read_text(encoding="utf-8"), "## `factory run`")
    documented = set(re.findall(r"`(-[-\w]+)", table))
    options = {opt for action in _parser()._actions for opt in action.option_strings if opt != "-h"}
    options.discard("--help")
    assert options <= documented, f"undocumented in docs/cli.md: {sorted(options - documented)}"


def test_every_exit_code_is_documented() -> None:
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    table = _section((DOCS / "cli.md").read_text(encoding="utf-8"), "## Exit codes")
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == codes


def test_documented_commands_name_options_that_exist() -> None:
    """Every ``factory.run`` command line in the docs parses with the real parser."""
    from factory.run import _parser

    parser = _parser()
    seen = 0
    for page in [README, *DOCS.rglob("*.md")]:
        for block in _fenced(page.read_text(encoding="utf-8")):
            text = block.replace("\\\n", " ")
            for line in _commands(text):
                line = line.split(" #", 1)[0]
                if "factory.run " not in line or "ray job submit" in line:
                    continue
                args = shlex.split(line.split("factory.run ", 1)[1])
                try:
                    parser.parse_args(args)
                except SystemExit:
                    pytest.fail(f"{page.relative_to(ROOT)}: {line}")
                seen += 1
    assert seen >= 10


@pytest.mark.slow
def test_every_page_opens_from_disk_whole_and_fetches_nothing(tmp_path: Path, monkeypatch) -> None:
    """Every page of the built site in one headless chromium, at a laptop's 1280 px, as
    a reader opens it from disk: no console error, no request off the disk, no code
    block or table wider than its column (issue 39: the plan's table scrolled sideways
    with `batch USD` cut off), the navigation reaching every page and the recipe
    reference's tables drawn. Each page's screenshot is left in the test's tmp_path."""
    chromium_path()
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    site = tmp_path / "site"
    _build(site)
    # 404.html links its styles from the server's root (/assets/...): it is what a web
    # server answers for a missing page, and no link on disk leads to it.
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    expected = {str(p.relative_to(DOCS).with_suffix(".html")) for p in DOCS.rglob("*.md")}
    assert {str(p.relative_to(site)) for p in pages} == expected
    shots = tmp_path / "shots"
    shots.mkdir()
    drawn = open_site_pages(site, pages, screenshots=shots)
    for path, page in drawn.items():
        name = str(path.relative_to(site))
        assert page.check.console_errors == [] and page.check.requests == [], name
        assert page.cut == [], (name, page.cut)
        assert (shots / name.replace("/", "_")).with_suffix(".png").stat().st_size > 10_000
    linked = {href.split("#", 1)[0] for href in drawn[site / "index.html"].nav}
    assert expected <= linked, sorted(expected - linked)
    reference = drawn[site / "reference" / "recipe.html"]
    assert reference.table_rows >= len(list(key_docs(json_schema())))
