"""Decontamination: reject rows that copy a benchmark's texts, or name its tasks.

A dataset whose rows contain tau-bench's test instructions inflates the score a
model trained on it reports (issue 13). Two checks, both on the workers:

* **n-gram overlap** -- every benchmark text is cut into word n-grams (lowercased,
  punctuation dropped); a row whose user turns hold at least ``threshold`` of one
  text's n-grams is contaminated, and the reject names the text and the longest
  overlapping span (the words, so a person sees what was copied);
* **ids** -- the ids the mixture already excludes (``exclude_task_ids``), checked
  against a row's ``task_id`` and ``seed_id``.

The index maps an n-gram's hash to the texts holding it: a few MB for thousands
of benchmark texts, built once per actor.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory
from factory.errors import ConfigError

__all__ = ["DECONTAM_STAGE", "Decontaminator", "load_benchmark_texts"]

DECONTAM_STAGE = "decontam"
_WORD = re.compile(r"\w+", re.UNICODE)
# Keys under which a benchmark file's records hold their text (tau-bench tasks:
# ``instruction``; tau2: ``user_scenario.instructions``, flattened below).
TEXT_KEYS = ("instruction", "instructions", "text", "prompt", "question", "task")
SPAN_WORDS = 40  # words of an overlapping span kept in the message


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _text_of(record: Any) -> str | None:
    if isinstance(record, str):
        return record
    if isinstance(record, Mapping):
        for key in TEXT_KEYS:
            value = record.get(key)
            if isinstance(value, str) and value.strip():
                return value
            if isinstance(value, Mapping):  # e.g. {"instructions": {"task_instructions": ...}}
                parts = [v for v in value.values() if isinstance(v, str)]
                if parts:
                    return "\n".join(parts)
        scenario = record.get("user_scenario")
        if scenario is not None:
            return _text_of(scenario)
    return None


def load_benchmark_texts(path: str | Path) -> list[tuple[str, str]]:
    """``(name, text)`` of every text in a benchmark file.

    Formats: ``.txt`` (one text per non-empty line), ``.jsonl`` or ``.json`` (a list;
    strings, or objects with one of ``TEXT_KEYS``; ``id``/``task_id`` names them).

    Raises:
        ConfigError: the file is missing or holds no text.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"benchmark file {p} not found", key_path="decontamination.benchmark")
    raw = p.read_text(encoding="utf-8")
    records: list[Any]
    if p.suffix == ".txt":
        records = [line for line in raw.splitlines() if line.strip()]
    elif p.suffix == ".jsonl":
        records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    else:
        data = json.loads(raw)
        records = data if isinstance(data, list) else list(data.get("tasks", [data]))
    out: list[tuple[str, str]] = []
    for i, record in enumerate(records):
        text = _text_of(record)
        if not text:
            continue
        name = (
            str(record.get("id", record.get("task_id", i)))
            if isinstance(record, Mapping)
            else str(i)
        )
        out.append((f"{p.name}#{name}", text))
    if not out:
        raise ConfigError(
            f"{p} holds no benchmark text (strings, or objects with one of {TEXT_KEYS})",
            key_path="decontamination.benchmark",
        )
    return out


@dataclass(frozen=True)
class _Text:
    name: str
    ngrams: int  # distinct n-grams of the text


class Decontaminator:
    """The benchmark's n-gram index and the excluded ids.

    Args:
        texts: ``(name, text)`` pairs (``load_benchmark_texts``).
        n: words per n-gram (13 is the GPT-3 paper's choice for long documents; task
            instructions are short, so 8 by default in the recipe).
        threshold: share of one text's n-grams a row must hold to be contaminated.
        exclude_ids: task / seed ids that are contaminated whatever their text.
    """

    def __init__(
        self,
        texts: Iterable[tuple[str, str]],
        *,
        n: int = 8,
        threshold: float = 0.5,
        exclude_ids: Iterable[str | int] = (),
    ):
        if n < 1 or not 0.0 < threshold <= 1.0:
            raise ConfigError("n must be >= 1 and threshold within (0, 1]")
        self.n = n
        self.threshold = threshold
        self.exclude_ids = {str(i) for i in exclude_ids}
        self._texts: list[_Text] = []
        self._index: dict[int, list[int]] = {}
        for name, text in texts:
            grams = {hash(g) for g in self._grams(_words(text))}
            if not grams:
                continue
            k = len(self._texts)
            self._texts.append(_Text(name, len(grams)))
            for g in grams:
                self._index.setdefault(g, []).append(k)

    def __len__(self) -> int:
        return len(self._texts)

    def _grams(self, words: list[str]) -> list[str]:
        if len(words) < self.n:
            return [" ".join(words)] if words else []
        return [" ".join(words[i : i + self.n]) for i in range(len(words) - self.n + 1)]

    def check_text(self, text: str) -> Issue | None:
        """A ``contaminated`` issue when ``text`` holds enough of one benchmark text."""
        if not self._texts:
            return None
        words = _words(text)
        grams = [hash(g) for g in self._grams(words)]
        hits: Counter[int] = Counter()
        seen: set[int] = set()
        for g in grams:
            if g in seen:
                continue
            seen.add(g)
            for k in self._index.get(g, ()):
                hits[k] += 1
        best = None
        for k, count in hits.items():
            share = count / self._texts[k].ngrams
            if share >= self.threshold and (best is None or share > best[1]):
                best = (k, share)
        if best is None:
            return None
        k, share = best
        span = self._longest_span(words, grams, k)
        return Issue(
            "contaminated",
            f"{share:.0%} of the {self.n}-grams of benchmark text {self._texts[k].name}: '{span}'",
            path=self._texts[k].name,
        )

    def _longest_span(self, words: list[str], grams: list[int], k: int) -> str:
        """The longest run of consecutive row n-grams that text ``k`` holds, as words."""
        best_start, best_len, start, run = 0, 0, 0, 0
        for i, g in enumerate(grams):
            if k in self._index.get(g, ()):
                if run == 0:
                    start = i
                run += 1
                if run > best_len:
                    best_start, best_len = start, run
            else:
                run = 0
        span = words[best_start : best_start + best_len + self.n - 1]
        text = " ".join(span[:SPAN_WORDS])
        return text + (" ..." if len(span) > SPAN_WORDS else "")

    def check(self, traj: Trajectory, seed_id: str | None = None) -> Issue | None:
        """Check ``traj``: its ids against the exclusions, its user turns against the texts."""
        for key in ("task_id", "seed_id"):
            value = seed_id if key == "seed_id" and seed_id else traj.metadata.get(key)
            if value is not None and str(value) in self.exclude_ids:
                return Issue("contaminated", f"{key} {value} is excluded", path=str(value))
        text = "\n".join(t.content for t in traj.turns if t.role == "user")
        return self.check_text(text)
