"""Layers you can see (issues 9 and 23): engine code names no domain and imports none.

Both checks follow the domain registry, so a new domain adds cases instead of breaking
them. Outside a domain's own subpackage (``factory/envs/<domain>/``) the name of a domain
the factory ships may appear only in prose: docstrings, comments and help or description
texts (the JSON Schema's descriptions come from ``Field(description=...)``), matched as a
word. The import graph (grimp, what ``lint-imports`` reads) is checked for every registered
domain, a third-party one included: no module of ``factory`` outside a domain's package
imports it, and no two domain packages import each other. The other import contracts
(layers, no cycles) are ``lint-imports``' in ``tests/test_lint.py``.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import grimp
import pytest

from factory.envs.registry import ENTRY_POINT_GROUP, available_domains
from tests.conftest import ROOT

PACKAGE = ROOT / "factory"
PROSE_KEYWORDS = {"help", "description", "epilog"}


def _prose(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or help/description texts."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg in PROSE_KEYWORDS:
            ids.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return ids


def _code_words(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every identifier and non-prose string of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _prose(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.alias)):
            yield node.lineno, node.name


def _engine_modules() -> list[Path]:
    domains = {
        d for d in (PACKAGE / "envs").iterdir() if d.is_dir() and (d / "__init__.py").is_file()
    }
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not domains & set(p.parents)]


def _packages() -> dict[str, str]:
    """Registered domain -> the package its plug-in lives in (``factory.envs.airline``,
    ``factory_library`` for one installed from another distribution)."""
    out = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        module = point.value.partition(":")[0]
        depth = 3 if module.startswith("factory.envs.") else 1
        out[point.name] = ".".join(module.split(".")[:depth])
    return out


def _shipped() -> list[str]:
    """The domains the factory's own distribution registers."""
    return sorted(
        p.name
        for p in entry_points(group=ENTRY_POINT_GROUP)
        if p.dist is not None and p.dist.name == "factory"
    )


def test_the_registry_is_not_empty() -> None:
    assert _shipped() and set(_shipped()) <= set(available_domains())  # not a vacuous check


@cache
def _engine_words() -> list[tuple[str, int, str]]:
    """(module, line, lowercased text) of every code word outside the domains: parsed
    once per process, not once per domain."""
    return [
        (str(path.relative_to(ROOT)), line, text.lower())
        for path in _engine_modules()
        for line, text in _code_words(path)
    ]


@pytest.mark.parametrize("domain", _shipped())
def test_engine_code_names_no_domain(domain: str) -> None:
    word = re.compile(rf"(?<![a-z0-9]){re.escape(domain)}(?![a-z0-9])")
    words = _engine_words()
    found = [f"{path}:{line}: {text!r}" for path, line, text in words if word.search(text)]
    assert not found, "\n".join(found)


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("factory", include_external_packages=True, cache_dir=None)


@pytest.mark.parametrize("domain", sorted(_packages()))
def test_no_factory_module_outside_a_domain_imports_it(domain: str) -> None:
    package = _packages()[domain]
    graph = _graph()
    if package not in graph.modules:
        return  # nothing in factory imports it at all (a third-party domain)
    for module in sorted(graph.modules):
        inside = module == package or module.startswith(package + ".")
        if inside or package.startswith(module + "."):  # the domain, or a package holding it
            continue
        if module.startswith("factory."):
            chain = graph.find_shortest_chain(importer=module, imported=package, as_packages=True)
            assert chain is None, f"{' -> '.join(chain)} (a domain is found by the registry)"


def test_the_import_checks_see_an_import(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = grimp.build_graph("factory", include_external_packages=True, cache_dir=None)
    graph.add_import(importer="factory.engine.plan", imported="factory.envs.airline.tools")
    monkeypatch.setitem(globals(), "_graph", lambda: graph)
    with pytest.raises(AssertionError, match=r"factory\.engine\.plan -> factory\.envs\.airline"):
        test_no_factory_module_outside_a_domain_imports_it("airline")


@pytest.mark.parametrize(
    ("one", "other"), list(itertools.permutations(sorted(set(_packages().values())), 2))
)
def test_domains_are_independent_plugins(one: str, other: str) -> None:
    """What two domains share lives in ``factory.envs``, not in one of them."""
    graph = _graph()
    if one in graph.modules and other in graph.modules:
        assert not graph.chain_exists(importer=one, imported=other, as_packages=True)


def test_the_check_sees_code_strings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""Docstring: airline."""\n'
        "import argparse\n"
        'p = argparse.ArgumentParser(description="airline")\n'
        'p.add_argument("--recipe", default="pipelines/airline.yaml", help="airline")\n',
        encoding="utf-8",
    )
    words = [text for _, text in _code_words(module) if "airline" in text]
    assert words == ["pipelines/airline.yaml"]


def _layer_names(container: str | None) -> set[str]:
    """The modules named in the layers of the ``layers`` contract over ``container`` (None:
    the top-level one, without containers) in pyproject.toml."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    names: set[str] = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        if contract.get("containers", []) != ([container] if container else []):
            continue
        for layer in contract["layers"]:
            for name in re.split(r"[|:]", layer):
                names.add(name.strip().removeprefix(f"{container}."))
    return names


def _children(package: Path, prefix: str) -> set[str]:
    """Every module and subpackage directly in ``package``, dotted under ``prefix``."""
    out = {f"{prefix}{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    out |= {f"{prefix}{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    return out


def test_every_top_level_module_has_a_layer() -> None:
    """Issue 34: the import contracts cover all of ``factory/``; a module or package added at
    the top must take its place in the layers (pyproject.toml) before it can import freely."""
    missing = _children(PACKAGE, "factory.") - _layer_names(None)
    assert not missing, f"not in the layers contract of pyproject.toml: {sorted(missing)}"


def test_every_engine_module_has_a_layer() -> None:
    """Issue 34: the engine's own layers (runner above jobs above the loop above the pool and
    its workers above the stages) name every module of ``factory/engine/``."""
    missing = _children(PACKAGE / "engine", "") - _layer_names("factory.engine")
    assert not missing, f"not in the engine's layers contract: {sorted(missing)}"
