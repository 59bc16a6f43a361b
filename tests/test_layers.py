"""Layers you can see (issue 9): engine code names no domain.

Outside a domain's own subpackage (``factory/envs/<domain>/``) a domain's name may
appear only in prose: docstrings, comments and help or description texts (the
JSON Schema's descriptions come from ``Field(description=...)``). The import
contracts themselves are checked by ``lint-imports`` in ``tests/test_lint.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from factory.envs.registry import available_domains
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


def test_engine_code_names_no_domain() -> None:
    names = available_domains()
    assert "airline" in names  # the built-in domain is registered, so the check is not vacuous
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in _engine_modules()
        for line, text in _code_words(path)
        if any(name in text.lower() for name in names)
    ]
    assert not found, "\n".join(found)


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
