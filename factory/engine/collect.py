"""The driver-side end of every pipeline: dedup, count, write.

Why on the driver: exact accounting (accepted + rejected + failed = total),
exact targets and a global duplicate check need one place that sees every
row. Rows arrive already exported (and keyed: ``factory.core.dedup``) by the
distributed stages, so the driver only looks the key up, appends to a buffer
and writes shards; 90k rows are a few seconds of its time. The duplicate set
holds 24-hex-char keys (a few MB for millions of rows), never the rows.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from factory.core.dedup import DEDUP_STAGE, Deduper
from factory.core.diversity import DiversityStats
from factory.core.mixture import Mixture
from factory.core.neardup import NEARDUP_STAGE, NearDupIndex
from factory.engine.quality import index_path
from factory.engine.stages.base import FAILED, OK, REJECTED, UNISSUED, reject
from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info

__all__ = ["Collector"]

ACCEPTED, SURPLUS = "accepted", "surplus"
# The run's time series (manifest ``timeline``, plotted by the run report): one point
# per TIMELINE_EVERY_S at most, halved in resolution whenever it passes TIMELINE_MAX
# points, so a day-long run keeps a few kB.
TIMELINE_COLUMNS = ("seconds", "total", "accepted", "cost_usd", "paid_usd", "responses_from_cache")
TIMELINE_EVERY_S = 1.0
TIMELINE_MAX = 400


class Collector:
    """Consume final rows: accepted ones to ``data/``, the rest to ``rejects/`` / ``failed/``.

    ``target`` (optional) caps accepted rows; valid rows beyond it are kept in
    ``surplus/`` (they were paid for) and counted, never silently dropped.
    ``per_seed_cap`` caps accepted rows per seed (balanced amplification).
    """

    def __init__(
        self,
        out_dir: Path,
        manifest: Manifest,
        *,
        dataset_name: str,
        shard_rows: int = 5000,
        target: int | None = None,
        per_seed_cap: int | None = None,
        data_subdir: str = "data",
        keep_labels: bool = False,
        neardup: NearDupIndex | None = None,
        tools_column: bool = True,
    ):
        self.out_dir = Path(out_dir)
        self.tools_column = tools_column  # False: text-action rows (dataset_info without tools)
        self.manifest = manifest
        self.dataset_name = dataset_name
        self.data = ShardWriter(self.out_dir, subdir=data_subdir, shard_rows=shard_rows)
        self.surplus = ShardWriter(self.out_dir, subdir="surplus", shard_rows=shard_rows)
        self.rejects = RejectWriter(self.out_dir, subdir="rejects", shard_rows=shard_rows)
        self.failed = RejectWriter(self.out_dir, subdir="failed", shard_rows=shard_rows)
        self.target = target
        self.per_seed_cap = per_seed_cap
        # The run's exact-duplicate filter (``factory.core.dedup``): the collector owns it.
        self.dedup = Deduper("same content as an earlier row ({first})")
        # The run's near-duplicate index (signatures only; ``factory.core.neardup``).
        self.neardup = neardup
        self.near_rejected = 0
        # Diversity and yield of the accepted rows (manifest ``diversity``); the job sets
        # ``seeds`` (every seed it amplified) and ``mixture`` when it has them.
        self.diversity = DiversityStats()
        self.candidate_rows: int | None = None  # with a mixture: what it chose from
        self.seeds: list[str] | None = None
        self.mixture: Mixture | None = None
        self.per_seed: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.decided: dict[str, Counter[str]] = defaultdict(Counter)  # stage -> status counts
        self.tokens: Counter[str] = Counter()
        self.cost_usd = 0.0
        self.paid_usd = 0.0
        self.replayed = 0
        self.unissued = 0
        # Paid responses the cache refused (request id, cache record) and why; kept by
        # ``save_unstored`` before anything else is written.
        self.unstored: list[str] = []  # request ids
        self.unstored_in: list[str] = []  # where they were kept
        self.cache_error: str | None = None
        self.grounding: Counter[str] = Counter()
        # (id, labels) of accepted rows, kept only when a mixture will select from them.
        self.keep_labels = keep_labels
        self.accepted_labels: list[dict[str, Any]] = []
        self.timeline: list[list[float]] = []
        self._timeline_every = TIMELINE_EVERY_S
        self._timeline_last = 0.0

    # -- accounting ------------------------------------------------------------------------
    @property
    def accepted(self) -> int:
        return self.counts[ACCEPTED]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def done(self) -> bool:
        return self.target is not None and self.accepted >= self.target

    def _usage(self, row: dict[str, Any]) -> None:
        if row.get("usage"):
            usage = json.loads(row["usage"])
            for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                self.tokens[key] += int(usage.get(key) or 0)
        cost = float(row.get("cost_usd") or 0.0)
        self.cost_usd += cost  # what the output cost, whichever run paid for it
        self.replayed += int(row.get("cached_responses") or 0)
        self.paid_usd += float(row.get("paid_usd") or 0.0)  # what this run paid

    # -- rows ------------------------------------------------------------------------------
    def add(self, row: dict[str, Any]) -> str:
        """File one final row; returns accepted | surplus | rejected | failed | unissued."""
        self.take_unstored(row)
        if row.get("status") == UNISSUED:  # never sent: a budget cap stopped it
            self.unissued += 1
            return UNISSUED
        self._usage(row)
        if row.get("grounding"):
            info = json.loads(row["grounding"])
            self.grounding["trajectories"] += 1
            self.grounding["calls"] += int(info.get("total") or 0)
            self.grounding["matched"] += int(info.get("matched") or 0)
            self.grounding["observations_replaced"] += int(info.get("observations_replaced") or 0)
        status = row.get("status")
        if status == OK:
            duplicate = self.dedup.check_row(row)
            if duplicate is not None:
                row = reject(dict(row), DEDUP_STAGE, duplicate.code, duplicate.message)
                status = REJECTED
        if status == OK and self.neardup is not None and row.get("minhash"):
            near = self.neardup.check(row.get("id") or "", row["minhash"])
            if near is not None:
                row = reject(dict(row), NEARDUP_STAGE, near.code, near.message)
                status = REJECTED
                self.near_rejected += 1
        if status == OK:
            key = row.get("id") or ""
            out = json.loads(row["output"])
            seed = row.get("seed_id") or ""
            over_seed = self.per_seed_cap is not None and self.per_seed[seed] >= self.per_seed_cap
            if self.done or over_seed:
                self.surplus.add(out)
                kind = SURPLUS
            else:
                self.data.add(out)
                self.per_seed[seed] += 1
                kind = ACCEPTED
                labels = json.loads(row["labels"]) if row.get("labels") else None
                if self.keep_labels and labels:
                    self.accepted_labels.append({"id": key, "labels": labels})
                self.diversity.add(out, seed_id=seed or None, labels=labels)
            self.decided[row.get("stage") or "?"][kind] += 1
        else:
            kind = FAILED if status == FAILED else REJECTED
            self.manifest.reason(row.get("stage") or "?", row.get("reason") or "unknown")
            self.decided[row.get("stage") or "?"][kind] += 1
            slim = {
                k: v
                for k, v in row.items()
                if v is not None and k not in ("output", "unstored", "minhash")
            }
            (self.failed if kind == FAILED else self.rejects).add(slim)
        self.counts[kind] += 1
        self._sample()
        return kind

    def _sample(self, *, force: bool = False) -> None:
        """Add a point to the time series (throughput and cost over time)."""
        now = time.time()
        if not force and now - self._timeline_last < self._timeline_every:
            return
        self._timeline_last = now
        point = [round(now - self.manifest.started, 3), self.total, self.accepted]
        point += [round(self.cost_usd, 6), round(self.paid_usd, 6), self.replayed]
        self.timeline.append(point)
        if len(self.timeline) > TIMELINE_MAX:
            self.timeline = self.timeline[1::2]
            self._timeline_every *= 2

    def take_unstored(self, row: dict[str, Any]) -> None:
        """Keep a paid response the cache could not store, at once (before any other
        write can fail on the same full disk); the row itself counts as usual."""
        from factory.io.runstate import save_unstored

        if not row.get("unstored"):
            return
        info = json.loads(row["unstored"])
        where = save_unstored(self.out_dir, [(info["request_id"], info["record"])])
        self.unstored.append(info["request_id"])
        if where not in self.unstored_in:
            self.unstored_in.append(where)
        self.cache_error = self.cache_error or info.get("error")

    def close(self, **extra: Any) -> dict[str, Any]:
        """Flush everything; write dataset_info.json and manifest.json. Returns the totals."""
        self._sample(force=True)
        for w in (self.data, self.surplus, self.rejects, self.failed):
            w.close()
            self.manifest.files.update(w.files)
        write_dataset_info(self.out_dir, self.dataset_name, tools=self.tools_column)
        totals = {
            "total": self.total,
            "accepted": self.counts[ACCEPTED],
            "surplus": self.counts[SURPLUS],
            "rejected": self.counts[REJECTED],
            "failed": self.counts[FAILED],
        }
        self.manifest.stages = {s: dict(c) for s, c in self.decided.items()}
        if self.grounding:
            g: dict[str, float] = dict(self.grounding)
            g["fidelity"] = round(g["matched"] / g["calls"], 4) if g.get("calls") else 1.0
            self.manifest.extra["grounding"] = g
        self.manifest.extra.update(
            tokens=dict(self.tokens),
            cost_usd=round(self.cost_usd, 6),
            cost_usd_paid_this_run=round(self.paid_usd, 6),
            responses_from_cache=self.replayed,
            unissued=self.unissued,
            timeline={"columns": list(TIMELINE_COLUMNS), "points": self.timeline},
            **extra,
        )
        diversity = self.diversity.summary(self.seeds, self.mixture)
        if self.candidate_rows is not None:
            diversity["candidates"] = self.candidate_rows
        self.manifest.extra["diversity"] = diversity
        if self.neardup is not None:
            self.neardup.save(index_path(self.out_dir))
            p = self.neardup.params
            self.manifest.extra["near_duplicates"] = {
                "view": p.view,
                "ngram": p.ngram,
                "threshold": p.threshold,
                "num_perm": p.num_perm,
                "num_bands": p.num_bands,
                "rejected": self.near_rejected,
                "index_rows": len(self.neardup),
                "loaded_from_earlier_runs": self.neardup.loaded,
                "index_file": index_path(self.out_dir).name,
            }
        if self.unstored:
            self.manifest.extra["unstored"] = {
                "responses": len(self.unstored),
                "kept_in": self.unstored_in,
                "request_ids": self.unstored,
                "error": self.cache_error,
            }
        self.manifest.write(self.out_dir, **totals)
        return totals
