"""Tool specs in either layout become the same bare spec, the factory's ``x-`` keys kept."""

from __future__ import annotations

import pytest

from factory.core.trajectory import normalize_tool_spec

BARE = {"name": "lend", "description": "Lend a book.", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    "spec",
    [
        {**BARE, "x-kind": "write"},
        {"type": "function", "function": {**BARE, "x-kind": "write"}},
        {"type": "function", "function": BARE, "x-kind": "write"},  # beside the function
    ],
    ids=["bare", "openai", "openai-kind-beside"],
)
def test_both_layouts_keep_the_kind(spec: dict[str, object]) -> None:
    assert normalize_tool_spec(spec) == {**BARE, "x-kind": "write"}


def test_the_kind_inside_the_function_wins() -> None:
    spec = {"type": "function", "function": {**BARE, "x-kind": "read"}, "x-kind": "write"}
    assert normalize_tool_spec(spec)["x-kind"] == "read"
