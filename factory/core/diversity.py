"""Diversity and yield of the accepted rows, computed as they stream past.

The counts in a manifest say how many rows a run made, not whether they are
worth training on: 90k rows that call the same three tools in the same order,
or that come from 40 of 1.5k seeds, are a small dataset (issue 13). The
``Collector`` feeds every accepted training row to a ``DiversityStats``; its
``summary`` is the manifest's ``diversity`` section. The simulator-data job
(envsim) writes step samples, not conversations: its selection is counted by a
``StepDiversity`` (distinct calls and states, tools, labels, rows per task).

Memory is bounded whatever the run's size: distinct counts are K-minimum-values
sketches (exact up to ``KMV_K`` distinct items, an estimate with ~1.6% relative
error beyond), length distributions are exact histograms of small integers
(tokens in bins of ``TOKEN_BIN``), and per-seed counts are one integer per seed.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from factory.core.mixture import Mixture
from factory.core.trajectory import canonical_json

__all__ = ["DistinctCounter", "DiversityStats", "StepDiversity", "histogram_summary"]

KMV_K = 4096
TOKEN_BIN = 64  # tokens per bin of the token-length histogram
USER_NGRAMS = (1, 2, 3)  # distinct-n of the user turns
ZERO_SEEDS_LISTED = 50  # seeds (tasks) that produced nothing, named in the manifest (all counted)
# A step's provenance: one value per episode, not a distribution worth counting.
STEP_PROVENANCE = ("kind", "task_id", "user_id", "env_id")
_WORD = re.compile(r"\w+", re.UNICODE)
_CALL_TAG, _USER_TAG = "function_call", "human"


class DistinctCounter:
    """Distinct items seen: exact below ``k`` distinct, a KMV estimate above.

    Keeps the ``k`` smallest 64-bit hashes (a max-heap), so memory is fixed.
    """

    def __init__(self, k: int = KMV_K) -> None:
        self.k = k
        self._heap: list[int] = []  # negated hashes: the largest kept one is on top
        self._kept: set[int] = set()
        self.full = False

    def add(self, item: str) -> None:
        self.add_many((item,))

    def add_many(self, items: Iterable[str]) -> None:
        """``add`` each of ``items``, in one loop: a row's user n-grams are a hundred or so,
        and this runs on the driver for every accepted row, where a call per item was a
        quarter of the driver's CPU in a 300-calls/s run."""
        heap, kept, k = self._heap, self._kept, self.k
        blake2b, from_bytes = hashlib.blake2b, int.from_bytes
        for item in items:
            h = from_bytes(blake2b(item.encode(), digest_size=8).digest(), "little")
            if h in kept:
                continue
            if len(heap) < k:
                heapq.heappush(heap, -h)
                kept.add(h)
            elif h < -heap[0]:
                self.full = True
                kept.discard(-heapq.heapreplace(heap, -h))
                kept.add(h)
            else:
                self.full = True

    def count(self) -> int:
        if not self.full:
            return len(self._heap)
        return round((self.k - 1) * 2**64 / -self._heap[0])


def histogram_summary(hist: Counter[int], bin_width: int = 1) -> dict[str, Any]:
    """min / median / p90 / max / mean and the histogram (``{bin start: rows}``)."""
    n = sum(hist.values())
    if not n:
        return {"rows": 0}
    values = sorted(hist)

    def quantile(q: float) -> int:
        rank, seen = q * (n - 1), 0
        for v in values:
            seen += hist[v]
            if seen > rank:
                return v * bin_width
        return values[-1] * bin_width

    return {
        "rows": n,
        "min": values[0] * bin_width,
        "median": quantile(0.5),
        "p90": quantile(0.9),
        "max": values[-1] * bin_width,
        "mean": round(sum(v * c for v, c in hist.items()) * bin_width / n, 2),
        "histogram": {str(v * bin_width): hist[v] for v in values},
    }


class DiversityStats:
    """Streaming statistics over accepted ShareGPT rows (``{"conversations": [...]}``)."""

    def __init__(self) -> None:
        self.rows = 0
        self.sequences = DistinctCounter()
        self.tool_use: Counter[str] = Counter()  # calls per tool
        self.tools_per_row: Counter[int] = Counter()  # distinct tools in a row
        self.calls_per_row: Counter[int] = Counter()
        self.turns: Counter[int] = Counter()
        self.tokens: Counter[int] = Counter()  # in bins of TOKEN_BIN
        self.user_ngrams = {n: DistinctCounter() for n in USER_NGRAMS}
        self.user_ngram_total: Counter[int] = Counter()
        self.per_seed: Counter[str] = Counter()
        self.labels: dict[str, Counter[str]] = {}

    def add(
        self,
        row: Mapping[str, Any],
        *,
        seed_id: str | None = None,
        labels: Mapping[str, Any] | None = None,
    ) -> None:
        """Count one accepted row (its training columns, as written to ``data/``)."""
        conversations = row.get("conversations") or []
        self.rows += 1
        names: list[str] = []
        chars = len(row.get("system") or "")
        for message in conversations:
            value = str(message.get("value") or "")
            chars += len(value)
            tag = message.get("from")
            if tag == _CALL_TAG:
                names.extend(_call_names(value))
            elif tag == _USER_TAG:
                words = _WORD.findall(value.lower())
                for n in USER_NGRAMS:
                    grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
                    self.user_ngrams[n].add_many(grams)
                    self.user_ngram_total[n] += len(grams)
        self.sequences.add("\x1f".join(names))
        self.tool_use.update(names)
        self.tools_per_row[len(set(names))] += 1
        self.calls_per_row[len(names)] += 1
        self.turns[len(conversations)] += 1
        self.tokens[-(-chars // 4) // TOKEN_BIN] += 1  # 4 characters a token, as plans count
        if seed_id:
            self.per_seed[seed_id] += 1
        for key, value in (labels or {}).items():
            if isinstance(value, (str, int, bool)) or value is None:
                self.labels.setdefault(key, Counter())[str(value)] += 1

    def summary(
        self, seeds: Iterable[str] | None = None, mixture: Mixture | None = None
    ) -> dict[str, Any]:
        """The manifest's ``diversity`` section.

        Args:
            seeds: every seed the run amplified (for the seeds that produced nothing).
            mixture: the recipe's mixture, for the label distribution against its quotas.
        """
        out: dict[str, Any] = {
            "rows": self.rows,
            "distinct_tool_sequences": self.sequences.count(),
            "distinct_tool_sequences_share": round(self.sequences.count() / self.rows, 4)
            if self.rows
            else None,
            "tool_calls": dict(sorted(self.tool_use.items())),
            "tools_per_row": histogram_summary(self.tools_per_row),
            "calls_per_row": histogram_summary(self.calls_per_row),
            "turns": histogram_summary(self.turns),
            "tokens": histogram_summary(self.tokens, TOKEN_BIN),
            "user_distinct_ngrams": {
                str(n): {
                    "distinct": self.user_ngrams[n].count(),
                    "total": self.user_ngram_total[n],
                    "ratio": round(self.user_ngrams[n].count() / self.user_ngram_total[n], 4)
                    if self.user_ngram_total[n]
                    else None,
                }
                for n in USER_NGRAMS
            },
            "labels": {k: dict(sorted(c.items())) for k, c in sorted(self.labels.items())},
        }
        if seeds is not None:
            out["per_seed"] = self._per_seed(list(seeds))
        if mixture is not None:
            out["quotas"] = self._quotas(mixture)
        return out

    def _per_seed(self, seeds: list[str]) -> dict[str, Any]:
        out = rows_per_source(self.per_seed, seeds)
        return {
            "seeds": out["sources"],
            **{k: out[k] for k in ("min", "median", "max")},
            "seeds_with_nothing": out["with_nothing"],
            "seeds_with_nothing_ids": out["with_nothing_ids"],
        }

    def _quotas(self, mixture: Mixture) -> dict[str, Any]:
        """Per quota: rows it wants and accepted rows whose labels could fill it.

        Matching needs the joint labels, so it is counted from the label histograms
        only for the quota's own selectors: a quota on ``group`` and ``outcome`` counts
        rows of that group (upper bound) -- the exact selection is ``mixture`` in the
        manifest.
        """
        out: dict[str, Any] = {}
        for quota in mixture.quotas:
            available = None
            for key, wanted in (("group", quota.groups), ("outcome", quota.outcomes)):
                if wanted is None:
                    continue
                n = sum(self.labels.get(key, Counter()).get(w, 0) for w in wanted)
                available = n if available is None else min(available, n)
            out[quota.name] = {"wanted": quota.count, "matching_labels": available}
        return out


class StepDiversity:
    """Streaming statistics over selected step samples (``factory.envsim.steps``).

    A step sample is one executed call, so "distinct tool sequences" and user-turn
    n-grams say nothing of it; what makes simulator data worth training on is how many
    different calls (tool and arguments) and world states it shows, how its labels
    spread, and how many episodes it draws from.
    """

    def __init__(self) -> None:
        self.rows = 0
        self.calls = DistinctCounter()  # tool and canonical arguments
        self.states = DistinctCounter()  # the state slice before the call
        self.tool_use: Counter[str] = Counter()
        self.tokens: Counter[int] = Counter()  # in bins of TOKEN_BIN
        self.per_task: Counter[str] = Counter()
        self.labels: dict[str, Counter[str]] = {}

    def add(self, sample: Mapping[str, Any], *, chars: int) -> None:
        """Count one selected sample (``StepSample.to_dict()``); ``chars`` is the length
        of the training row written for it (instruction, input and output)."""
        self.rows += 1
        tool = str(sample.get("tool") or "")
        self.calls.add(tool + "\x1f" + canonical_json(sample.get("arguments") or {}))
        self.states.add(canonical_json(sample.get("state_before") or {}))
        self.tool_use[tool] += 1
        self.tokens[-(-chars // 4) // TOKEN_BIN] += 1
        labels = sample.get("labels") or {}
        task = labels.get("task_id") or sample.get("task_id")
        if task:
            self.per_task[str(task)] += 1
        for key, value in labels.items():
            if key in STEP_PROVENANCE:
                continue
            if isinstance(value, (str, int, bool)) or value is None:
                self.labels.setdefault(key, Counter())[str(value)] += 1

    def summary(self, tasks: Iterable[str] | None = None) -> dict[str, Any]:
        """The envsim manifest's ``diversity`` section.

        Args:
            tasks: every task (episode) the selection could draw from, for the tasks
                that gave it no row.
        """

        def share(n: int) -> float | None:
            return round(n / self.rows, 4) if self.rows else None

        out: dict[str, Any] = {
            "unit": "step",
            "rows": self.rows,
            "distinct_calls": self.calls.count(),
            "distinct_calls_share": share(self.calls.count()),
            "distinct_states": self.states.count(),
            "distinct_states_share": share(self.states.count()),
            "tool_calls": dict(sorted(self.tool_use.items())),
            "tokens": histogram_summary(self.tokens, TOKEN_BIN),
            "labels": {k: dict(sorted(c.items())) for k, c in sorted(self.labels.items())},
        }
        if tasks is not None:
            per = rows_per_source(self.per_task, list(tasks))
            out["per_task"] = {
                "tasks": per["sources"],
                **{k: per[k] for k in ("min", "median", "max")},
                "tasks_with_nothing": per["with_nothing"],
            }
        return out


def rows_per_source(counts: Mapping[str, int], sources: list[str]) -> dict[str, Any]:
    """Rows per seed (or task) over every source, the ones that gave nothing included."""
    per = [counts.get(s, 0) for s in sources]
    zero = sorted(s for s in sources if not counts.get(s))
    return {
        "sources": len(sources),
        "min": min(per) if per else None,
        "median": median(per) if per else None,
        "max": max(per) if per else None,
        "with_nothing": len(zero),
        "with_nothing_ids": zero[:ZERO_SEEDS_LISTED],
    }


def _call_names(value: str) -> list[str]:
    """Tool names of a ``function_call`` value (one call or a list of calls)."""
    try:
        data = json.loads(value)
    except ValueError:
        return []
    calls = data if isinstance(data, list) else [data]
    return [str(c.get("name")) for c in calls if isinstance(c, dict) and c.get("name")]
