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

from factory.engine.settings import ExportSettings, SeedCheckSettings
from factory.engine.stages.export import ExportStage
from factory.engine.stages.seeds import SeedCheckStage, raw_record_rows
from factory.envs.pack import Domain
from factory.errors import ConfigError, SeedFormatError
from factory.io.readers import iter_hf_records, iter_records, resolve_paths, unusable_reason
from factory.recipe import SeedsConfig

__all__ = [
    "build_export",
    "build_seed_check",
    "check_seed_files",
    "expand_seed_paths",
    "seed_rows_local",
]


def expand_seed_paths(seeds: SeedsConfig) -> list[str]:
    """The seed files a recipe's ``seeds`` section names (paths, folders, globs; resolved
    when the recipe was loaded; a URI such as ``s3://...`` is read where it is).

    Raises:
        ConfigError: a spec matches nothing (key path ``seeds.path``).
    """
    specs = seeds.path if isinstance(seeds.path, list) else [seeds.path]
    try:
        files = resolve_paths([s for s in specs if s])
    except ConfigError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], key_path="seeds.path") from exc
    return sorted(dict.fromkeys(str(f) for f in files))


def check_seed_files(seeds: SeedsConfig) -> list[str]:
    """The section's seed files, each checked to hold usable records at its start.

    Runs on the driver before Ray starts (seconds, a few MB of memory at most):
    a wrong file (CSV, a compressed or binary file, an empty one, records in no
    known format) stops the run naming the file, instead of surfacing minutes
    later as "no seed survived". Hugging Face sources are not checked here.

    Raises:
        ConfigError: a spec matches no file (exit 2, key path ``seeds.path``).
        SeedFormatError: a file holds nothing usable (exit 3, the path and why).
    """
    if seeds.hf_dataset:
        return []
    paths = expand_seed_paths(seeds)
    for path in paths:
        why = unusable_reason(path)
        if why is not None:
            raise SeedFormatError(
                "unreadable_file", f"seeds.path: {path}: {why}; no seed can be read from it"
            )
    return paths


def _raw_rows(seeds: SeedsConfig) -> Iterator[dict[str, Any]]:
    """Raw seed rows read on the driver (dry runs and Hugging Face sources)."""
    if seeds.hf_dataset:
        records = iter_hf_records(seeds.hf_dataset, seeds.hf_split)
        yield from raw_record_rows(records)
        return
    for path in expand_seed_paths(seeds):  # a record at a time (JSONL and Parquet stream)
        yield from raw_record_rows(iter_records(path))


def seed_rows_local(seeds: SeedsConfig) -> Iterator[dict[str, Any]]:
    """Raw rows with ``seeds.limit`` applied: the driver-side twin of ``seed_dataset``."""
    for n, row in enumerate(_raw_rows(seeds)):
        if seeds.limit is not None and n >= seeds.limit:
            return
        yield row


def build_seed_check(settings: SeedCheckSettings, domain: Domain) -> SeedCheckStage:
    """Inside an actor: the seed checks over the domain the driver loaded."""
    return SeedCheckStage(
        domain,
        tools_from_domain=settings.tools_from_domain,
        min_reward=settings.min_reward,
        reasoning=settings.reasoning,
    )


def build_export(settings: ExportSettings, domain: Domain) -> ExportStage:
    """Inside an actor: the curate job's export (quality filters, the domain's kind)."""
    from factory.engine.quality import build_decontaminator, neardup_params

    return ExportStage(
        settings.reasoning,
        decontam=build_decontaminator(settings.quality),
        neardup=neardup_params(settings.quality.near_duplicates),
        text_actions=domain.grammar is not None,
    )
