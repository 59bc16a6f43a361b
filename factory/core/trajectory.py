"""The canonical trajectory record every seed format and every model output becomes.

Why one model: readers, repair, validation, the executor and the writers then
each deal with one shape. It is deliberately close to OpenAI chat messages
(roles user / assistant / tool) because that is what most seeds and all
OpenAI-compatible models speak, with two differences that make downstream
work safe:

* tool-call ``arguments`` are always a JSON *object* (``dict``), never the
  string OpenAI sends; turning strings into objects is the repair stage's job
  and is recorded in ``metadata["repairs"]``;
* assistant ``reasoning`` is its own field, so the writers can keep it as
  ``<think>...</think>`` or strip it without parsing text.

Rows travel through Ray Data as ``to_json()`` strings (a single column), since
tool arguments have no fixed Arrow schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

__all__ = [
    "ROLES",
    "IdentityMemo",
    "ToolCall",
    "Trajectory",
    "Turn",
    "canonical_json",
    "normalize_tool_spec",
]

K = TypeVar("K")
V = TypeVar("V")

Role = Literal["user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("user", "assistant", "tool")


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for hashing and dedup."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class IdentityMemo(Generic[K, V]):
    """One-entry memo keyed by object identity, for the large, never mutated values a
    pipeline passes with every row (the domain's tool list, its system prompt): their
    hash or JSON is computed once per process instead of once per row.

    The last ``(key, value)`` pair is one tuple, replaced in one assignment, so the
    threads of an actor sharing a memo never read one key with another key's value;
    holding the key keeps its identity unique while it is remembered.
    """

    def __init__(self, compute: Callable[[K], V]):
        self._compute = compute
        self._last: tuple[Any, Any] = (_UNSET, None)

    def __call__(self, key: K) -> V:
        last = self._last
        if last[0] is key:
            return cast(V, last[1])
        value = self._compute(key)
        self._last = (key, value)
        return value


_UNSET = object()


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


# SHA-256 of the canonical tool list: a pipeline hashes the same domain tool list every row.
_tools_digest: IdentityMemo[Any, str] = IdentityMemo(_sha256_json)
# The canonical JSON of the system prompt, the same string for every row of a pipeline.
_system_json: IdentityMemo[Any, str] = IdentityMemo(canonical_json)


def normalize_tool_spec(spec: Any) -> dict[str, Any]:
    """Return the bare function spec ``{name, description, parameters}``.

    Accepts both the bare form and OpenAI's ``{"type": "function", "function": {...}}``.
    Extra keys of the bare spec (such as the factory's ``x-kind``) are kept, and so are
    ``x-`` keys written beside ``function`` in the OpenAI form (a pack written that way
    keeps its kinds).

    Raises:
        ValueError: ``spec`` is not a function spec with a string name.
    """
    if (
        isinstance(spec, dict)
        and spec.get("type") == "function"
        and isinstance(spec.get("function"), dict)
    ):
        beside = {k: v for k, v in spec.items() if isinstance(k, str) and k.startswith("x-")}
        spec = {**beside, **spec["function"]}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ValueError("a tool spec needs a non-empty string 'name'")
    params = spec.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ValueError(f"tool {spec['name']!r}: 'parameters' must be an object")
    out = dict(spec)
    out["description"] = spec.get("description") or ""
    out["parameters"] = params
    return out


@dataclass
class ToolCall:
    """One call of a tool; ``arguments`` is an object, never a JSON string."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(name=data["name"], arguments=data.get("arguments") or {}, id=data.get("id"))


@dataclass
class Turn:
    """One message. ``tool_calls``/``reasoning`` only on assistant turns; ``name``/
    ``tool_call_id`` only on tool turns (which tool answered, which call it answers)."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=[ToolCall.from_dict(c) for c in data.get("tool_calls") or []],
            reasoning=data.get("reasoning"),
            name=data.get("name"),
            tool_call_id=data.get("tool_call_id"),
        )


@dataclass
class Trajectory:
    """A whole agent episode: system prompt, tool specs, ordered turns, metadata.

    ``metadata`` holds provenance and labels, never content that changes what a
    model is trained on: ``id`` (content hash), ``source``, ``format``,
    ``task_id``, ``reward``, ``repairs`` (list of applied JSON repairs), and
    later-stage labels. ``content_id()`` ignores metadata so the same
    conversation read from two files is one trajectory.
    """

    system: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    # --- identity -------------------------------------------------------------------
    def content_id(self) -> str:
        """Stable id from system, tools and turns (24 hex chars of SHA-256)."""
        h = hashlib.sha256()
        h.update(_system_json(self.system).encode("utf-8"))
        h.update(b"\x1e")
        h.update(_tools_digest(self.tools).encode("ascii"))
        h.update(b"\x1e")
        h.update(canonical_json([t.to_dict() for t in self.turns]).encode("utf-8"))
        return h.hexdigest()[:24]

    def conversation_hash(self) -> str:
        """Hash of the turns alone: dedup key that ignores system prompt and tool list."""
        body = [t.to_dict() for t in self.turns]
        return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()[:24]

    @property
    def id(self) -> str:
        return str(self.metadata.get("id") or self.content_id())

    # --- derived views ----------------------------------------------------------------
    def tool_names(self) -> set[str]:
        return {t["name"] for t in self.tools}

    def calls(self) -> list[tuple[int, ToolCall]]:
        """Every tool call with the index of the turn that makes it, in order."""
        return [(i, c) for i, t in enumerate(self.turns) for c in t.tool_calls]

    def add_repair(self, what: str) -> None:
        self.metadata.setdefault("repairs", []).append(what)

    # --- serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "tools": self.tools,
            "turns": [t.to_dict() for t in self.turns],
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            system=data.get("system") or "",
            tools=list(data.get("tools") or []),
            turns=[Turn.from_dict(t) for t in data.get("turns") or []],
            metadata=dict(data.get("metadata") or {}),
        )

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        return cls.from_dict(json.loads(text))
