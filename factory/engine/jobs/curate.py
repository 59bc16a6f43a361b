"""The curate job, declared: seed records -> rule checks -> LLaMA-Factory rows (no LLM).

One stream, ``seeds``: every record of the recipe's seed files, read lazily on
the driver, through the ``curate`` chain (the seed check, then the export that
renders the training row); the collector keeps valid rows in record order and
files every reject with its reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from factory.engine.collect import Collector
from factory.engine.ledger import Caps, Ledger
from factory.engine.loop import Bar, Declaration, JobReport, Workers
from factory.engine.pipeline import build_export, build_seed_check, seed_rows_local
from factory.engine.quality import build_decontaminator, build_neardup_index, decontam_summary
from factory.engine.rows import Fate
from factory.engine.settings import export_settings, quality_settings, seed_check_settings
from factory.engine.work import Item, ItemResult
from factory.io.writer import Manifest
from factory.recipe import CurateRecipe

__all__ = ["CurateJob", "CuratePlanner"]


class CuratePlanner:
    """Issue every record once, in file order; done when all came back."""

    def __init__(self, records: Iterator[dict[str, Any]], collector: Collector) -> None:
        self._records = records
        self.collector = collector
        self.issued = 0
        self.used = 0
        self.read_all = False

    @property
    def finished(self) -> bool:
        return self.read_all and self.used == self.issued

    @property
    def stopped_by(self) -> str | None:
        return None

    def issue(self, room: int, llm_room: int) -> list[Item]:
        items: list[Item] = []
        while len(items) < room and not self.read_all:
            row = next(self._records, None)
            if row is None:
                self.read_all = True
                break
            items.append(Item("seeds", self.issued, "curate", row))
            self.issued += 1
        return items

    def wanted(self, result: ItemResult) -> bool:
        return True

    def observe(self, result: ItemResult) -> None:
        self.used += 1

    def bars(self) -> list[Bar]:
        c = self.collector
        return [
            Bar(
                "seeds",
                self.used,
                self.issued if self.read_all else None,
                {"accepted": c.accepted, "rejected": c.counts[Fate.REJECTED]},
            )
        ]


class CurateJob(Declaration):
    """Validate and convert seeds into a LLaMA-Factory dataset (``loop.Job``: no LLM, no
    caps, a few CPU items per worker)."""

    pipeline = "curate"
    caps = Caps()
    workers = Workers()

    def __init__(self, cfg: CurateRecipe, out_dir: Path, manifest: Manifest) -> None:
        from factory.envs.pack import load_domain

        self.cfg, self.manifest = cfg, manifest
        domain = load_domain(cfg.domain)  # once, on the driver: the stages get it
        # a missing benchmark file fails here, not in a worker
        build_decontaminator(quality_settings(cfg))
        self.collector = Collector(
            out_dir,
            manifest,
            dataset_name=cfg.output.dataset_name,
            shard_rows=cfg.output.shard_rows,
            neardup=build_neardup_index(cfg.near_duplicates),
            tools_column=cfg.domain.grammar is None,
        )
        super().__init__(
            name="curate",
            chains={
                "curate": [
                    (build_seed_check, (seed_check_settings(cfg), domain)),
                    (build_export, (export_settings(cfg), domain)),
                ]
            },
            planner=CuratePlanner(seed_rows_local(cfg.seeds), self.collector),
            sink=self.collector,
        )

    def running(self, progress: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def finish(self, ledger: Ledger, stopped_by: str | None) -> JobReport:
        self.collector.close()
        return JobReport({"decontamination": decontam_summary(self.cfg, self.manifest)})

    def error(self, stopped_by: str | None) -> str | None:
        return None
