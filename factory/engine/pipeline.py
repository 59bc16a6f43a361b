"""Where a job's rows start: the recipe's seed files, read lazily on the driver.

``curate``:  seed record -> seed_check -> export -> collect
``amplify``: seed record -> seed_check -> prefilter (LLM) -> [kept seeds]
             then call k -> amplify (LLM) -> postprocess -> collect,
             until the target is reached or a cap stops it.

Each arrow is one stage (``factory/engine/stages``), run by the workers
(``factory.engine.worker``) in the chains a job declares; the driver loop
(``factory.engine.loop``) feeds them records as they have room (streaming: a
seed file is read a record at a time, never held whole) and collects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from factory.recipe import Recipe
from factory.engine.stages.export import ExportStage
from factory.engine.stages.seeds import SeedCheckStage, raw_record_rows
from factory.envs.pack import load_domain
from factory.errors import ConfigError, SeedFormatError
from factory.io.objectstore import is_uri
from factory.io.readers import iter_hf_records, iter_records, resolve_paths, unusable_reason

__all__ = [
    "build_export",
    "build_seed_check",
    "check_seed_files",
    "expand_seed_paths",
    "seed_rows_local",
]


def expand_seed_paths(cfg: Recipe) -> list[str]:
    """The seed files a recipe names (paths, folders, globs; relative to the recipe).

    Raises:
        ConfigError: a spec matches nothing (key path ``seeds.path``).
    """
    assert cfg.seeds is not None  # curate / amplify recipes always have seeds (config check)
    specs = cfg.seeds.path if isinstance(cfg.seeds.path, list) else [cfg.seeds.path]
    try:
        # A URI (s3://...) is read where it is; a path is relative to the recipe.
        files = resolve_paths([s if is_uri(s) else str(cfg.resolve(s)) for s in specs if s])
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], key_path="seeds.path") from exc
    return sorted(dict.fromkeys(str(f) for f in files))


def check_seed_files(cfg: Recipe) -> list[str]:
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
        why = unusable_reason(path)
        if why is not None:
            raise SeedFormatError(
                "unreadable_file", f"seeds.path: {path}: {why}; no seed can be read from it"
            )
    return paths


def _raw_rows(cfg: Recipe) -> Iterator[dict[str, Any]]:
    """Raw seed rows read on the driver (dry runs and Hugging Face sources)."""
    assert cfg.seeds is not None
    if cfg.seeds.hf_dataset:
        records = iter_hf_records(cfg.seeds.hf_dataset, cfg.seeds.hf_split)
        yield from raw_record_rows(records)
        return
    for path in expand_seed_paths(cfg):  # a record at a time (JSONL and Parquet stream)
        yield from raw_record_rows(iter_records(path))


def seed_rows_local(cfg: Recipe) -> Iterator[dict[str, Any]]:
    """Raw rows with ``seeds.limit`` applied: the driver-side twin of ``seed_dataset``."""
    assert cfg.seeds is not None
    for n, row in enumerate(_raw_rows(cfg)):
        if cfg.seeds.limit is not None and n >= cfg.seeds.limit:
            return
        yield row


def build_seed_check(cfg: Recipe) -> SeedCheckStage:
    """Inside an actor: load the domain pack once and build the stage."""
    assert cfg.seeds is not None
    return SeedCheckStage(
        load_domain(cfg),
        tools_from_domain=cfg.seeds.tools_from_domain,
        min_reward=cfg.seeds.min_reward,
        reasoning=cfg.output.reasoning,
    )


def build_export(cfg: Recipe) -> ExportStage:
    from factory.engine.quality import build_decontaminator, neardup_params

    return ExportStage(
        cfg.output.reasoning,
        decontam=build_decontaminator(cfg),
        neardup=neardup_params(cfg),
        text_actions=cfg.domain.grammar is not None,
    )
