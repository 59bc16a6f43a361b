"""What the run report plots, counted in one pass over a folder's accepted rows.

Pure: ``RowStats.add`` takes one row (as ``OutputFolder.rows`` yields it) and
updates counters; nothing holds a row. The manifest already has the funnel,
reasons, tokens and cost; these are the distributions only the rows know.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from factory.io.report.training import row_tokens

__all__ = ["RowStats", "tool_calls"]


def tool_calls(conversations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls of a ShareGPT conversation (``function_call`` turns; a turn may hold a
    list of parallel calls), each ``{"name", "arguments"}``; an unreadable value is skipped."""
    calls: list[dict[str, Any]] = []
    for turn in conversations or ():
        if turn.get("from") != "function_call":
            continue
        try:
            value = json.loads(turn.get("value") or "")
        except ValueError:
            continue
        for call in value if isinstance(value, list) else [value]:
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                calls.append(call)
    return calls


def _tool_names(tools: Any) -> list[str]:
    try:
        specs = json.loads(tools) if isinstance(tools, str) else tools
    except ValueError:
        return []
    names = []
    for spec in specs or ():
        fn = spec.get("function", spec) if isinstance(spec, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


@dataclass
class RowStats:
    """Counters over accepted rows (ShareGPT conversations or alpaca step samples)."""

    rows: int = 0
    per_seed: Counter[str] = field(default_factory=Counter)
    tools_used: Counter[str] = field(default_factory=Counter)
    tools_offered: set[str] = field(default_factory=set)
    outcome: Counter[str] = field(default_factory=Counter)
    group: Counter[str] = field(default_factory=Counter)
    delta_size: Counter[int] = field(default_factory=Counter)
    arg_cardinality: Counter[int] = field(default_factory=Counter)
    turns: Counter[int] = field(default_factory=Counter)
    calls_per_row: Counter[int] = field(default_factory=Counter)
    # Tokens per row as the trainer sees them (``training.row_tokens``), when ``count`` is
    # given: one int per row, 90k rows ~ 3 MB.
    tokens: list[int] = field(default_factory=list)
    count: Callable[[str], int] | None = None
    _tool_lists: set[int] = field(default_factory=set)  # hashes of the tools values seen

    def add(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if self.count is not None:
            self.tokens.append(row_tokens(row, self.count))
        meta = row.get("meta") or {}
        labels: dict[str, Any] = meta["labels"] if isinstance(meta.get("labels"), dict) else {}
        if meta.get("seed_id"):
            self.per_seed[str(meta["seed_id"])] += 1
        for key, counter in (("outcome", self.outcome), ("group", self.group)):
            if labels.get(key) is not None:
                counter[str(labels[key])] += 1
        if isinstance(labels.get("delta_size"), int):
            self.delta_size[labels["delta_size"]] += 1
        if isinstance(labels.get("arg_cardinality"), int):
            self.arg_cardinality[labels["arg_cardinality"]] += 1
        if "conversations" in row:
            conv = row.get("conversations") or []
            calls = tool_calls(conv)
            self.turns[len(conv)] += 1
            self.calls_per_row[len(calls)] += 1
            self.tools_used.update(c["name"] for c in calls)
            tools = row.get("tools")
            seen = hash(tools) if isinstance(tools, str) else None
            if seen is None or seen not in self._tool_lists:  # one domain: one list, read once
                self.tools_offered.update(_tool_names(tools))
                if seen is not None:
                    self._tool_lists.add(seen)
        elif meta.get("tool"):  # an alpaca step sample: one call of the tool named in meta
            self.tools_used[str(meta["tool"])] += 1

    def seed_yield(self, seeds_kept: int | None = None) -> dict[str, Any]:
        """Accepted rows per seed: min / median / max over the seeds that produced rows,
        and how many kept seeds produced none (when the kept count is known)."""
        counts = sorted(self.per_seed.values())
        if not counts:
            return {}
        out: dict[str, Any] = {
            "seeds_with_rows": len(counts),
            "min": counts[0],
            "median": statistics.median(counts),
            "max": counts[-1],
        }
        if seeds_kept is not None:
            out["seeds_without_rows"] = max(0, seeds_kept - len(counts))
        return out

    def coverage(self, offered: Iterable[str] = ()) -> dict[str, int]:
        """Calls per tool, every offered tool included (0 for a tool never called):
        those the rows' tools columns list, and ``offered`` (the domain's, from the
        manifest: step samples carry no tool list)."""
        out = dict.fromkeys(sorted({*self.tools_offered, *offered}), 0)
        out.update(self.tools_used)
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))
