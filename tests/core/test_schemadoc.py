"""``factory.core.schemadoc``: a JSON Schema as a Markdown reference of key paths."""

from __future__ import annotations

import re
from typing import Any

import pytest

from factory.core.schemadoc import KeyDoc, key_docs, reference_markdown

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "llm"],
    "properties": {
        "name": {"type": "string", "description": "The name | with a pipe."},
        "mode": {"enum": ["a", "b"], "default": "a", "description": "<mode> *chosen*"},
        "llm": {"$ref": "#/$defs/LLM"},
        "retry": {
            "anyOf": [{"$ref": "#/$defs/Retry"}, {"type": "null"}],
            "default": None,
            "description": "Retries, or none.",
        },
        "prices": {
            "type": "object",
            "additionalProperties": {"$ref": "#/$defs/Price"},
            "default": {},
        },
        "ports": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}]},
    },
    "$defs": {
        "LLM": {
            "type": "object",
            "description": "The model.",
            "required": ["model"],
            "properties": {
                "model": {"type": "string", "description": "Model id, `gpt-5|mini`."},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": "#/$defs/Endpoint"},
                    "default": [{"url": "x"}],
                },
                "concurrency": {"type": "integer", "minimum": 1, "default": 64},
            },
        },
        "Endpoint": {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "Base URL."}},
        },
        "Retry": {
            "type": "object",
            "properties": {"share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        },
        "Price": {"type": "object", "properties": {"input": {"type": "number"}}},
    },
}


def test_every_key_path_with_its_type_default_and_description() -> None:
    docs = {d.path: d for d in key_docs(SCHEMA)}
    assert list(docs) == [
        "name", "mode", "llm", "llm.model", "llm.endpoints", "llm.endpoints[].url",
        "llm.concurrency", "retry", "retry.share", "prices", "prices.<name>.input", "ports",
    ]  # fmt: skip
    assert docs["name"] == KeyDoc("name", "string", "required", "The name | with a pipe.")
    assert docs["mode"].type == 'one of: "a", "b"' and docs["mode"].default == '"a"'
    assert docs["llm"] == KeyDoc("llm", "object", "required", "The model.")  # the def's text
    assert docs["llm.endpoints"].type == "list of object (at least 1)"
    assert docs["llm.endpoints"].default == '[{"url": "x"}]'
    assert docs["llm.concurrency"].type == "integer >= 1"
    assert docs["retry"].type == "object or null" and docs["retry"].default == "null"
    assert docs["retry.share"].type == "number > 0, <= 1"
    assert docs["retry.share"].default == ""  # optional, no default: the section's own
    assert docs["prices"].type == "map of name to object" and docs["prices"].default == "{}"
    assert docs["ports"].type == "[integer, integer]"


def test_markdown_has_a_section_per_top_level_object_and_escapes_cells() -> None:
    page = reference_markdown(SCHEMA, title="T", intro="Intro.")
    assert page.startswith("# T\n\nIntro.\n")
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections == ["## Top level", "## `llm`", "## `retry`", "## `prices`"]
    top = page.split("## Top level", 1)[1].split("## `llm`", 1)[0]
    assert "`name`" in top and "`mode`" in top and "`ports`" in top
    assert r"The name \| with a pipe." in page  # a pipe would end the table cell
    assert r"&lt;mode&gt; \*chosen\*" in page  # no raw HTML, no emphasis
    assert r"`gpt-5\|mini`" in page  # code spans are kept, only the pipe escaped
    for line in page.splitlines():
        if line.startswith("| `"):
            assert len(re.split(r"(?<!\\)\|", line)) == 6, line  # four cells, no stray pipe


def test_a_schema_that_nests_forever_is_refused() -> None:
    loop: dict[str, Any] = {
        "type": "object",
        "properties": {"me": {"$ref": "#/$defs/Me"}},
        "$defs": {"Me": {"type": "object", "properties": {"me": {"$ref": "#/$defs/Me"}}}},
    }
    with pytest.raises(ValueError, match="nests deeper"):
        list(key_docs(loop))
