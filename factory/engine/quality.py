"""Recipe -> the quality filters of ``factory.core`` (near-duplicates, decontamination).

Core stays free of the recipe schema; this module reads the recipe once and builds
what a stage (``Decontaminator``, signature parameters) or the driver
(``NearDupIndex`` with the earlier runs' indexes loaded) needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factory.recipe import Recipe
from factory.core.decontam import DECONTAM_STAGE, Decontaminator, load_benchmark_texts
from factory.core.neardup import NearDupIndex, NearDupParams
from factory.io.writer import Manifest

__all__ = [
    "INDEX_FILE",
    "build_decontaminator",
    "build_neardup_index",
    "decontam_summary",
    "index_path",
    "neardup_params",
]

INDEX_FILE = "neardup.index"  # OUT/neardup.index: what a later run's near_duplicates.index names


def neardup_params(cfg: Recipe) -> NearDupParams | None:
    nd = cfg.near_duplicates
    if nd is None:
        return None
    return NearDupParams(
        view=nd.view, ngram=nd.ngram, num_perm=nd.num_perm, seed=nd.seed, threshold=nd.threshold
    )


def build_neardup_index(cfg: Recipe) -> NearDupIndex | None:
    """The run's index, holding every earlier run's index the recipe names."""
    params = neardup_params(cfg)
    if params is None:
        return None
    assert cfg.near_duplicates is not None
    index = NearDupIndex(params)
    for path in cfg.near_duplicates.index:
        index.load_into(cfg.resolve(path))
    return index


def build_decontaminator(cfg: Recipe) -> Decontaminator | None:
    dc = cfg.decontamination
    if dc is None:
        return None
    texts = [t for path in dc.benchmark for t in load_benchmark_texts(cfg.resolve(path))]
    excluded = [*dc.exclude_task_ids, *(cfg.mixture.exclude_task_ids if cfg.mixture else [])]
    return Decontaminator(texts, n=dc.n, threshold=dc.threshold, exclude_ids=excluded)


def decontam_summary(cfg: Recipe, manifest: Manifest) -> dict[str, Any] | None:
    """The manifest's ``decontamination`` section (``None`` without the recipe section)."""
    decontam = build_decontaminator(cfg)
    if decontam is None:
        return None
    rejected = manifest.reasons.get(DECONTAM_STAGE)
    return {
        "benchmark_texts": len(decontam),
        "n": decontam.n,
        "threshold": decontam.threshold,
        "excluded_ids": len(decontam.exclude_ids),
        "rejected": int(rejected["contaminated"]) if rejected else 0,
    }


def index_path(out_dir: Path) -> Path:
    return Path(out_dir) / INDEX_FILE
