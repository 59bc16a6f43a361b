"""Pipelines built from a recipe and run on Ray Data; the driver only collects.

``curate``:  read -> seed_check -> export -> collect
``amplify``: read -> seed_check -> prefilter (LLM) -> [kept seeds]
             then rounds of: work items -> amplify (LLM) -> postprocess -> collect,
             until the target is reached or a cap stops it.

Each arrow is one stage (``factory/engine/stages``); ``raycompat.map_stage`` turns a
stage into an actor-pool operator. The driver iterates the last operator's
batches (streaming: no stage holds all rows) and hands rows to the Collector.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from factory.config import RecipeConfig
from factory.engine.stages.base import rows_to_table
from factory.engine.stages.export import ExportStage
from factory.engine.stages.seeds import SeedCheckStage, raw_record_rows
from factory.envs.pack import load_domain
from factory.errors import ConfigError, SeedFormatError
from factory.io.readers import iter_hf_records, records_from_bytes, resolve_paths, unusable_reason

__all__ = ["build_seed_check", "check_seed_files", "expand_seed_paths", "seed_rows_local"]


def expand_seed_paths(cfg: RecipeConfig) -> list[str]:
    """The seed files a recipe names (paths, folders, globs; relative to the recipe).

    Raises:
        ConfigError: a spec matches nothing (key path ``seeds.path``).
    """
    assert cfg.seeds is not None  # curate / amplify recipes always have seeds (config check)
    specs = cfg.seeds.path if isinstance(cfg.seeds.path, list) else [cfg.seeds.path]
    try:
        files = resolve_paths([str(cfg.resolve(s)) for s in specs if s is not None])
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], key_path="seeds.path") from exc
    return sorted(dict.fromkeys(str(f) for f in files))


def check_seed_files(cfg: RecipeConfig) -> list[str]:
    """The recipe's seed files, each checked to hold usable records at its start.

    Runs on the driver before Ray starts (seconds, a few MB of memory at most):
    a wrong file (CSV, a compressed or binary file, an empty one, records in no
    known format) stops the run naming the file, instead of surfacing minutes
    later as "no seed survived". Hugging Face sources are not checked here.

    Raises:
        ConfigError: a spec matches no file (exit 2, key path ``seeds.path``).
        SeedFormatError: a file holds nothing usable (exit 3, the path and why).
    """
    assert cfg.seeds is not None
    if cfg.seeds.hf_dataset:
        return []
    paths = expand_seed_paths(cfg)
    for path in paths:
        why = unusable_reason(Path(path))
        if why is not None:
            raise SeedFormatError(
                "unreadable_file", f"seeds.path: {path}: {why}; no seed can be read from it"
            )
    return paths


def _raw_rows(cfg: RecipeConfig) -> Iterator[dict[str, Any]]:
    """Raw seed rows read on the driver (dry runs and Hugging Face sources)."""
    assert cfg.seeds is not None
    if cfg.seeds.hf_dataset:
        records = iter_hf_records(cfg.seeds.hf_dataset, cfg.seeds.hf_split)
        yield from raw_record_rows(records)
        return
    for path in expand_seed_paths(cfg):
        yield from raw_record_rows(records_from_bytes(path, Path(path).read_bytes()))


def seed_rows_local(cfg: RecipeConfig) -> Iterator[dict[str, Any]]:
    """Raw rows with ``seeds.limit`` applied: the driver-side twin of ``seed_dataset``."""
    assert cfg.seeds is not None
    for n, row in enumerate(_raw_rows(cfg)):
        if cfg.seeds.limit is not None and n >= cfg.seeds.limit:
            return
        yield row


def build_seed_check(cfg: RecipeConfig) -> SeedCheckStage:
    """Inside an actor: load the domain pack once and build the stage."""
    assert cfg.seeds is not None
    return SeedCheckStage(
        load_domain(cfg),
        tools_from_domain=cfg.seeds.tools_from_domain,
        min_reward=cfg.seeds.min_reward,
        reasoning=cfg.output.reasoning,
    )


def build_export(cfg: RecipeConfig) -> ExportStage:
    from factory.engine.quality import build_decontaminator, neardup_params

    return ExportStage(
        cfg.output.reasoning,
        decontam=build_decontaminator(cfg),
        neardup=neardup_params(cfg),
        text_actions=cfg.domain.grammar is not None,
    )


def _file_to_rows(batch: pa.Table) -> pa.Table:
    rows: list[dict[str, Any]] = []
    paths, blobs = batch.column("path").to_pylist(), batch.column("bytes").to_pylist()
    for path, data in zip(paths, blobs, strict=True):
        rows += raw_record_rows(records_from_bytes(path, data))
    return rows_to_table(rows)


def seed_dataset(cfg: RecipeConfig) -> Any:
    """Raw seed rows as a Ray Dataset: files are read by Ray tasks, one file per task."""
    assert cfg.seeds is not None
    import ray.data

    if cfg.seeds.hf_dataset:
        tables = []
        chunk: list[dict[str, Any]] = []
        for row in seed_rows_local(cfg):
            chunk.append(row)
            if len(chunk) >= 1000:
                tables.append(rows_to_table(chunk))
                chunk = []
        tables.append(rows_to_table(chunk))
        return ray.data.from_arrow(tables)
    ds = ray.data.read_binary_files(expand_seed_paths(cfg), include_paths=True)
    ds = ds.map_batches(_file_to_rows, batch_format="pyarrow", batch_size=1, num_cpus=0.25)
    if cfg.seeds.limit is not None:
        ds = ds.limit(cfg.seeds.limit)
    return ds


def checked_seed_dataset(cfg: RecipeConfig) -> Any:
    from factory.engine.raycompat import map_stage

    return map_stage(seed_dataset(cfg), build_seed_check, cfg, ray_cfg=cfg.ray)


def iter_rows(ds: Any, batch_size: int = 256) -> Iterator[dict[str, Any]]:
    """Stream a dataset's rows to the driver, batch by batch."""
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=batch_size):
        yield from batch.to_pylist()


def curate_dataset(cfg: RecipeConfig) -> Any:
    from factory.engine.raycompat import map_stage

    return map_stage(checked_seed_dataset(cfg), build_export, cfg, ray_cfg=cfg.ray)
