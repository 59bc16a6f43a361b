"""Tool kinds (``x-kind``) read off what the seeds' calls did, not off the tools' names.

Why behaviour: a name misleads (``checkout_book`` has the noun "book", ``renew_loan`` no
verb anyone listed), while a seed shows what a call did. A call is evidence of a **write**
when its observation

* names a new id at its top level: a record the call created (``{"loan_id": "L-7", ...}``,
  or an id-like word of a plain-text answer) that nothing before it in the conversation
  showed;
* shows a record changed since the conversation last saw it (the same id, another value
  under the same key: a cancelled status, a later due date);
* only acknowledges: every value it holds was in the call's arguments (``{"deleted":
  "f_90"}``);

and of a **read** when it returns data the arguments did not hold, none of it new or
changed. Refusals (``Error: ...``) and plain text without an id show nothing. A tool is
a write when at least as many of its calls show a write as a read, a read when more show
a read; a tool no call shows is left to its name (``factory.envs.scaffold.guess_kind``)
and said so, for a person to review.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from factory.core.labels import call_pairs, is_error_observation
from factory.core.trajectory import Trajectory

__all__ = ["Evidence", "observed_kinds"]

_ID_WORD = re.compile(r"\b(?=[A-Za-z0-9_#-]*\d)(?=[A-Za-z0-9_#-]*[A-Za-z])[A-Za-z0-9_#-]{4,}\b")


def _is_id_key(key: str) -> bool:
    return key == "id" or key.endswith(("_id", "_ids"))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v)


def _record_ids(obj: dict[str, Any]) -> list[str]:
    return [v for k, v in obj.items() if _is_id_key(k) and isinstance(v, str)]


@dataclass
class Evidence:
    """What the seeds' calls of one tool showed: counts, and one example of each."""

    writes: int = 0
    reads: int = 0
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, why: str) -> None:
        if kind == "write":
            self.writes += 1
        else:
            self.reads += 1
        self.examples.setdefault(kind, why)

    def verdict(self) -> tuple[str, str] | None:
        """``(kind, why)``, or None when no call showed anything."""
        if self.writes and self.writes >= self.reads:
            return "write", f"{self.writes} call(s) {self.examples['write']}"
        if self.reads:
            return "read", f"{self.reads} call(s) {self.examples['read']}"
        return None


class _Conversation:
    """What one seed has shown so far: its text, and the last view of each record."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.records: dict[str, dict[str, Any]] = {}

    def seen(self, value: str) -> bool:
        return any(value in chunk for chunk in self.text)

    def judge(self, arguments: Any, observation: str) -> tuple[str, str] | None:
        """The evidence of one call (``kind``, ``why``) or None."""
        if is_error_observation(observation):
            return None
        given = set(_strings(arguments))
        try:
            value = json.loads(observation)
        except ValueError:
            value = None
        if not isinstance(value, (dict, list)):
            text = observation.strip().strip('"')
            if _ID_WORD.fullmatch(text):  # the whole answer is an id: a lookup found it
                return "read", "answer with an id their arguments did not hold"
            new = [w for w in _ID_WORD.findall(observation) if w not in given and not self.seen(w)]
            return ("write", f"answer with the new id {new[0]!r}") if new else None
        if isinstance(value, dict):
            new_ids = [v for v in _record_ids(value) if v not in given and not self.seen(v)]
            if new_ids:
                return "write", f"return the new id {new_ids[0]!r}"
        for obj, rid in self._identified(arguments, value):
            before = self.records.get(rid)
            changed = [k for k in obj if before and k in before and before[k] != obj[k]]
            if changed:
                return "write", f"show {rid!r} with {changed[0]} changed"
        if not set(_strings(value)) - given:
            return "write", "only acknowledge their arguments"
        return "read", "return data their arguments did not hold"

    @staticmethod
    def _identified(arguments: Any, value: Any) -> Iterator[tuple[dict[str, Any], str]]:
        """``(record, id)`` of every object an observation shows: by its own id fields,
        and a top-level object without one by the id arguments it was asked for."""
        for obj in _objects(value):
            for rid in _record_ids(obj):
                yield obj, rid
        if isinstance(value, dict) and not _record_ids(value) and isinstance(arguments, dict):
            for key, arg in arguments.items():
                if _is_id_key(str(key)) and isinstance(arg, str):
                    yield value, arg

    def remember(self, arguments: Any, observation: str) -> None:
        self.text.append(json.dumps(arguments, ensure_ascii=False))
        self.text.append(observation)
        try:
            value = json.loads(observation)
        except ValueError:
            return
        for obj, rid in self._identified(arguments, value):
            self.records[rid] = {**self.records.get(rid, {}), **obj}


def observed_kinds(trajectories: Iterable[Trajectory]) -> dict[str, Evidence]:
    """Per tool, what its calls in the seeds showed (see the module)."""
    found: dict[str, Evidence] = {}
    for traj in trajectories:
        seen = _Conversation()
        answered = {c_index: tool for _turn, c_index, tool in _answers(traj)}
        for index, turn in enumerate(traj.turns):
            if turn.role in ("user", "assistant") and turn.content:
                seen.text.append(turn.content)
            for k, call in enumerate(turn.tool_calls):
                tool_turn = answered.get((index, k))
                if tool_turn is None:
                    continue
                observation = traj.turns[tool_turn].content or ""
                verdict = seen.judge(call.arguments, observation)
                if verdict is not None:
                    found.setdefault(call.name, Evidence()).add(*verdict)
                seen.remember(call.arguments, observation)
    return found


def _answers(traj: Trajectory) -> Iterator[tuple[int, tuple[int, int], int]]:
    """``(turn, (turn, call position), answering tool turn)`` of every answered call."""
    position: dict[int, int] = {}
    for turn, _call, tool in call_pairs(traj):
        k = position.get(turn, 0)
        position[turn] = k + 1
        if tool is not None:
            yield turn, (turn, k), tool
