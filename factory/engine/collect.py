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

from factory.core.dedup import Deduper
from factory.core.diversity import DiversityStats
from factory.core.mixture import Mixture
from factory.core.neardup import NearDupIndex
from factory.engine.filing import Check, Filing, NearDuplicates, exact_duplicates
from factory.engine.quality import index_path
from factory.engine.rows import Fate, Row, Status
from factory.engine.stages.export import SHARED_COLUMNS, training_row
from factory.engine.work import ItemResult
from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info

__all__ = ["Collector"]


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
        self.target = target
        self.per_seed_cap = per_seed_cap
        # The run's exact-duplicate filter (``factory.core.dedup``): the collector owns it.
        self.dedup = Deduper("same content as an earlier row ({first})")
        # The run's near-duplicate index (signatures only; ``factory.core.neardup``).
        self.neardup = neardup
        self.near = NearDuplicates(neardup) if neardup is not None else None
        checks: list[Check[Row]] = [exact_duplicates(self.dedup)]
        if self.near is not None:
            checks.append(self.near)
        # Reject files leave out what only an accepted row needs.
        self.filing: Filing[Row] = Filing(
            RejectWriter(self.out_dir, subdir="rejects", shard_rows=shard_rows),
            RejectWriter(self.out_dir, subdir="failed", shard_rows=shard_rows),
            checks=checks,
            drop=("output", *SHARED_COLUMNS, "unstored", "minhash"),
        )
        # Diversity and yield of the accepted rows (manifest ``diversity``); the job sets
        # ``seeds`` (every seed it amplified) and ``mixture`` when it has them.
        self.diversity = DiversityStats()
        self.candidate_rows: int | None = None  # with a mixture: what it chose from
        self.seeds: list[str] | None = None
        self.mixture: Mixture | None = None
        self.per_seed: Counter[str] = Counter()
        self.fingerprints: set[str] = set()  # who answered (the devserver says so)
        # Paid responses the cache refused (request id, cache record) and why; kept by
        # ``save_unstored`` before anything else is written.
        self.unstored: list[str] = []  # request ids
        self.unstored_in: list[str] = []  # where they were kept
        self.cache_error: str | None = None
        self.cache_dir: Path | None = None  # where the response cache lives (a 2nd refuge)
        self.grounding: Counter[str] = Counter()
        # (id, labels) of accepted rows, kept only when a mixture will select from them,
        # and each one's seed and parsed labels by id (the selection's diversity reads
        # them there instead of parsing the rows' ``meta`` again).
        self.keep_labels = keep_labels
        self.accepted_labels: list[dict[str, Any]] = []
        self.kept_meta: dict[str, tuple[str | None, dict[str, Any] | None]] = {}

    # -- accounting ------------------------------------------------------------------------
    @property
    def counts(self) -> Counter[Fate]:
        """Rows by fate (``unissued`` ones among them, apart from the ``total``)."""
        return self.filing.counts

    @property
    def accepted(self) -> int:
        return self.counts[Fate.ACCEPTED]

    @property
    def total(self) -> int:
        return sum(n for fate, n in self.counts.items() if fate != Fate.UNISSUED)

    @property
    def near_rejected(self) -> int:
        return self.near.rejected if self.near is not None else 0

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

    def add(self, row: Row, stream: str = "") -> Fate:
        """File one final row (``factory.engine.filing``); returns its fate."""
        if row["status"] != Status.UNISSUED:  # never sent: a budget cap stopped it
            self._note(row)
        return self.filing.file(row, self._keep)

    def _note(self, row: Row) -> None:
        """What the manifest reports of every row sent: who answered, grounding."""
        if row.get("fingerprint"):
            self.fingerprints.add(row["fingerprint"] or "")
        if row.get("grounding"):
            info = json.loads(row["grounding"] or "{}")
            self.grounding["trajectories"] += 1
            self.grounding["calls"] += int(info.get("total") or 0)
            self.grounding["matched"] += int(info.get("matched") or 0)
            self.grounding["observations_replaced"] += int(info.get("observations_replaced") or 0)

    def _keep(self, row: Row) -> Fate:
        """A valid row to ``data/`` (counted in the diversity), or past the target or its
        seed's cap to ``surplus/``."""
        out = training_row(row)
        seed = row.get("seed_id") or ""
        over_seed = self.per_seed_cap is not None and self.per_seed[seed] >= self.per_seed_cap
        if self.done or over_seed:
            self.surplus.add(out)
            return Fate.SURPLUS
        self.data.add(out)
        self.per_seed[seed] += 1
        labels = json.loads(row["labels"] or "null") if row.get("labels") else None
        if self.keep_labels:
            key = row.get("id") or ""
            if labels:
                self.accepted_labels.append({"id": key, "labels": labels})
            self.kept_meta[key] = (seed or None, labels)
        self.diversity.add(out, seed_id=seed or None, labels=labels)
        return Fate.ACCEPTED

    def take_unstored(self, row: Row) -> None:
        """Keep a paid response the cache could not store, at once (before any other
        write can fail on the same full disk); the row itself counts as usual."""
        from factory.engine.console import console
        from factory.io.runstate import save_unstored

        if not row.get("unstored"):
            return
        info = json.loads(row["unstored"] or "{}")
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
        for w in (self.data, self.surplus):
            w.close()
            self.manifest.add_files(w)
        for rw in self.filing.close():
            self.manifest.add_files(rw)
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
