"""Recipe -> the quality filters of ``factory.core`` (near-duplicates, decontamination).

Core stays free of the recipe schema; this module reads the recipe once and builds
what a stage (``Decontaminator``, signature parameters) or the driver
(``NearDupIndex`` with the earlier runs' indexes loaded) needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factory.core.decontam import DECONTAM_STAGE, Decontaminator, load_benchmark_texts
from factory.core.neardup import NearDupIndex, NearDupParams
from factory.engine.settings import QualitySettings, quality_settings
from factory.io.writer import Manifest
from factory.recipe import NearDupConfig, Recipe

__all__ = [
    "INDEX_FILE",
    "build_decontaminator",
    "build_neardup_index",
    "decontam_summary",
    "index_path",
    "neardup_params",
]

INDEX_FILE = "neardup.index"  # OUT/neardup.index: what a later run's near_duplicates.index names


def neardup_params(nd: NearDupConfig | None) -> NearDupParams | None:
    """The signature parameters of ``near_duplicates`` (None without the section)."""
    if nd is None:
        return None
    return NearDupParams(
        view=nd.view, ngram=nd.ngram, num_perm=nd.num_perm, seed=nd.seed, threshold=nd.threshold
    )


def build_neardup_index(nd: NearDupConfig | None) -> NearDupIndex | None:
    """The run's index, holding every earlier run's index the section names."""
    params = neardup_params(nd)
    if nd is None or params is None:
        return None
    index = NearDupIndex(params)
    for path in nd.index:
        index.load_into(Path(path))
    return index


def build_decontaminator(quality: QualitySettings) -> Decontaminator | None:
    """The decontaminator of a stage's quality settings (its benchmark files read now)."""
    dc = quality.decontamination
    if dc is None:
        return None
    texts = [t for path in dc.benchmark for t in load_benchmark_texts(Path(path))]
    excluded = [*dc.exclude_task_ids, *quality.excluded_ids]
    return Decontaminator(texts, n=dc.n, threshold=dc.threshold, exclude_ids=excluded)


def decontam_summary(cfg: Recipe, manifest: Manifest) -> dict[str, Any] | None:
    """The manifest's ``decontamination`` section (``None`` without the recipe section)."""
    decontam = build_decontaminator(quality_settings(cfg))
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
