"""The driver-side end of every trajectory job: dedup, file, write (the loop's ``Sink``).

Why on the driver: exact targets and a global duplicate check need one place that
sees every row, in the order the loop uses them (``factory.engine.loop``). Rows
arrive already exported (and keyed: ``factory.core.dedup``) by the workers, so the
driver only looks the key up, appends to a buffer and writes shards; 90k rows are
a few seconds of its time. The duplicate set holds 24-hex-char keys (a few MB for
millions of rows), never the rows. What rows cost and how many there were is the
run's ledger's (``factory.engine.ledger``); this module says where each one goes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from factory.core.dedup import DEDUP_STAGE, Deduper
from factory.core.diversity import DiversityStats
from factory.core.mixture import Mixture
from factory.core.neardup import NEARDUP_STAGE, NearDupIndex
from factory.engine.quality import index_path
from factory.engine.stages.base import FAILED, OK, REJECTED, UNISSUED, reject
from factory.engine.stages.export import SHARED_COLUMNS, training_row
from factory.engine.work import ItemResult
from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info

__all__ = ["Collector"]

ACCEPTED, SURPLUS = "accepted", "surplus"


class Collector:
    """Consume final rows: accepted ones to ``data/``, the rest to ``rejects/`` / ``failed/``.

    ``target`` (optional) caps accepted rows; valid rows beyond it are kept in
    ``surplus/`` (they were paid for) and counted, never silently dropped.
    ``per_seed_cap`` caps accepted rows per seed the same way.
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
        self.fingerprints: set[str] = set()  # who answered (the devserver says so)
        # Paid responses the cache refused (request id, cache record) and why; kept by
        # ``save_unstored`` before anything else is written.
        self.unstored: list[str] = []  # request ids
        self.unstored_in: list[str] = []  # where they were kept
        self.cache_error: str | None = None
        self.cache_dir: Path | None = None  # where the response cache lives (a 2nd refuge)
        self.grounding: Counter[str] = Counter()
        # (id, labels) of accepted rows, kept only when a mixture will select from them.
        self.keep_labels = keep_labels
        self.accepted_labels: list[dict[str, Any]] = []

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

    # -- rows ------------------------------------------------------------------------------
    @property
    def stop_reason(self) -> str | None:
        """``cache_write`` once the cache refused a paid answer: no new call may start."""
        return "cache_write" if self.cache_error is not None else None

    def arrived(self, result: ItemResult) -> None:
        """Keep, at once, the paid answers of ``result`` the cache could not store."""
        for row in result.rows:
            self.take_unstored(row)

    def add(self, row: dict[str, Any]) -> str:
        """File one final row; returns accepted | surplus | rejected | failed | unissued."""
        if row.get("status") == UNISSUED:  # never sent: a budget cap stopped it
            return UNISSUED
        if row.get("fingerprint"):
            self.fingerprints.add(row["fingerprint"])
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
                row = reject(row, DEDUP_STAGE, duplicate.code, duplicate.message)
                status = REJECTED
        if status == OK and self.neardup is not None and row.get("minhash"):
            near = self.neardup.check(row.get("id") or "", row["minhash"])
            if near is not None:
                row = reject(row, NEARDUP_STAGE, near.code, near.message)
                status = REJECTED
                self.near_rejected += 1
        if status == OK:
            key = row.get("id") or ""
            out = training_row(row)
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
        else:
            kind = FAILED if status == FAILED else REJECTED
            slim = {
                k: v
                for k, v in row.items()
                if v is not None and k not in ("output", *SHARED_COLUMNS, "unstored", "minhash")
            }
            (self.failed if kind == FAILED else self.rejects).add(slim)
        self.counts[kind] += 1
        return kind

    def take_unstored(self, row: dict[str, Any]) -> None:
        """Keep a paid response the cache could not store, at once (before any other
        write can fail on the same full disk); the row itself counts as usual."""
        from factory.engine.console import console
        from factory.io.runstate import save_unstored

        if not row.get("unstored"):
            return
        info = json.loads(row["unstored"])
        where = save_unstored(
            self.out_dir,
            [(info["request_id"], info["record"])],
            cache_dir=self.cache_dir,
            console=console(),  # the terminal: the run's stderr is its log, on that disk
        )
        self.unstored.append(info["request_id"])
        if where not in self.unstored_in:
            self.unstored_in.append(where)
        self.cache_error = self.cache_error or info.get("error")

    def close(self) -> None:
        """Flush every writer and write dataset_info.json; put what the collector knows
        (files, grounding, diversity, near-duplicates, unstored answers) in the manifest."""
        for w in (self.data, self.surplus, self.rejects, self.failed):
            w.close()
            self.manifest.add_files(w)
        write_dataset_info(self.out_dir, self.dataset_name, tools=self.tools_column)
        if self.grounding:
            g: dict[str, float] = dict(self.grounding)
            g["fidelity"] = round(g["matched"] / g["calls"], 4) if g.get("calls") else 1.0
            self.manifest.extra["grounding"] = g
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
