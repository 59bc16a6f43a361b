"""A JSON Schema as a Markdown reference: every key path with its type, default and text.

Why generated: the recipe reference in the documentation site
(``docs/reference/recipe.md``) must say what the recipe schema says, and a
hand-written page drifts the day a field is added. The recipe's one source of
truth is ``factory/recipe/``; ``python -m factory.schemas`` writes the shipped
JSON Schema from it and this page from that schema, and a test fails while the
committed page differs from what this module renders.

Pure: a schema dict in, Markdown text out. Handles what pydantic emits for the
recipe: ``$ref`` into ``$defs``, ``anyOf`` (a nullable field is ``X or null``),
enums, arrays (``key[]``), tuples (``prefixItems``), maps (``additionalProperties``
with a schema: ``key.<name>``) and numeric bounds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KeyDoc", "key_docs", "reference_markdown"]

_MAX_DEPTH = 12  # a self-referencing schema would recurse forever; the recipe nests 4 deep


@dataclass(frozen=True)
class KeyDoc:
    """One documented key: its dotted path (``llm.endpoints[].base_url``), its type as
    a reader says it, its default as JSON (``required`` when it has none and must be
    given, ``""`` when it is optional without one: a section that fills in its own
    defaults) and its description."""

    path: str
    type: str
    default: str
    description: str


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow a local ``$ref`` (``#/$defs/Name``); sibling keys of the ref win."""
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    merged = dict(target)
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _alternatives(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(node.get("anyOf") or node.get("oneOf") or [node])


def _non_null(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [_resolve(a, root) for a in _alternatives(node) if a.get("type") != "null"]


def _bounds(node: Mapping[str, Any]) -> str:
    marks = [
        (">=", node.get("minimum")),
        (">", node.get("exclusiveMinimum")),
        ("<=", node.get("maximum")),
        ("<", node.get("exclusiveMaximum")),
    ]
    return ", ".join(f"{op} {value}" for op, value in marks if value is not None)


def type_name(node: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    """How a reader says a schema's type: ``integer >= 1``, ``one of: a, b``,
    ``list of string``, ``map of name to object``, ``number or null``."""
    parts = []
    for alt in (_resolve(a, root) for a in _alternatives(node)):
        parts.append(_one_type(alt, root))
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    return " or ".join(seen)


def _one_type(node: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    if "enum" in node:
        return "one of: " + ", ".join(json.dumps(v) for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    kind = node.get("type")
    if kind == "array":
        if "prefixItems" in node:
            items = ", ".join(type_name(_resolve(i, root), root) for i in node["prefixItems"])
            return f"[{items}]"
        items_node = node.get("items")
        inner = type_name(_resolve(items_node, root), root) if items_node else "any"
        text = f"list of {inner}"
        if node.get("minItems"):
            text += f" (at least {node['minItems']})"
        return text
    if kind == "object" or "properties" in node:
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) and "properties" not in node:
            return f"map of name to {type_name(_resolve(extra, root), root)}"
        return "object" if "properties" in node or extra is False else "mapping"
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind is None:
        return "any"
    bounds = _bounds(node)
    return f"{kind} {bounds}" if bounds else str(kind)


def _default(node: Mapping[str, Any], required: bool) -> str:
    if "default" in node:
        return json.dumps(node["default"], ensure_ascii=False)
    return "required" if required else ""  # optional: a section fills in its own


def _description(node: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    if "description" in node:
        return str(node["description"])
    for alt in _non_null(node, root):
        if "description" in alt:
            return str(alt["description"])
    return ""


def _children(node: Mapping[str, Any], root: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The sub-schema whose keys a path continues into, with the path's joint
    (``.`` an object, ``[].`` a list of objects, ``.<name>.`` a map of objects);
    ("", {}) for a leaf."""
    for alt in _non_null(node, root):
        if "properties" in alt:
            return ".", alt
        if alt.get("type") == "array" and isinstance(alt.get("items"), Mapping):
            items = _resolve(alt["items"], root)
            if "properties" in items:
                return "[].", items
        extra = alt.get("additionalProperties")
        if isinstance(extra, Mapping):
            target = _resolve(extra, root)
            if "properties" in target:
                return ".<name>.", target
    return "", {}


def key_docs(schema: Mapping[str, Any]) -> Iterator[KeyDoc]:
    """Every key path of ``schema``'s properties, depth first, in declaration order
    (an object's own row before its keys')."""
    yield from _walk(schema, schema, "", 0)


def _walk(
    node: Mapping[str, Any], root: Mapping[str, Any], prefix: str, depth: int
) -> Iterator[KeyDoc]:
    if depth > _MAX_DEPTH:
        raise ValueError(f"schema nests deeper than {_MAX_DEPTH} levels at {prefix!r}")
    required = set(node.get("required", ()))
    for name, raw in node.get("properties", {}).items():
        prop = _resolve(raw, root)
        path = prefix + name
        joint, sub = _children(prop, root)
        yield KeyDoc(
            path=path,
            type=type_name(prop, root),
            default=_default(prop, name in required),
            description=_description(prop, root),
        )
        if joint:
            yield from _walk(sub, root, path + joint, depth + 1)


_ESCAPES = {"|": r"\|", "<": "&lt;", ">": "&gt;", "*": r"\*"}


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell: no pipe, no raw HTML, no emphasis
    outside its code spans (which stay as written)."""
    text = re.sub(r"\s+", " ", text).strip()
    out, at = [], 0
    for span in _CODE_SPAN.finditer(text):
        out.append(_escape(text[at : span.start()]))
        out.append(span.group(0).replace("|", r"\|"))
        at = span.end()
    out.append(_escape(text[at:]))
    return "".join(out)


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(ch, ch) for ch in text)


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def reference_markdown(schema: Mapping[str, Any], *, title: str, intro: str) -> str:
    """The Markdown page: ``title``, ``intro``, then one section per top-level key
    (top-level scalars first, under "Top level"), each a table of its key paths.

    Args:
        schema: a JSON Schema whose root is an object with ``properties``.
        title: the page's heading.
        intro: Markdown placed under the heading (how the page is made, where the
            schema lives).
    """
    props = schema.get("properties", {})
    sections: dict[str, list[KeyDoc]] = {}
    for doc in key_docs(schema):
        top = re.split(r"[.\[]", doc.path, maxsplit=1)[0]
        leaf = not _children(_resolve(props[top], schema), schema)[0]
        sections.setdefault("" if leaf else top, []).append(doc)
    lines = [f"# {title}", "", intro.strip(), ""]
    for top, docs in sorted(sections.items(), key=lambda kv: kv[0] != ""):
        lines += [f"## {_code(top) if top else 'Top level'}", ""]
        lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for doc in docs:
            default = doc.default if doc.default in ("", "required") else _code(doc.default)
            lines.append(
                f"| {_code(doc.path)} | {_cell(doc.type)} | {_cell(default)} "
                f"| {_cell(doc.description)} |"
            )
        lines.append("")
    return "\n".join(lines)
