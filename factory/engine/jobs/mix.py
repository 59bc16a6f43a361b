"""The mixed amplification job: several domains, one dataset, a quota per domain.

Why parts and not one run over every seed: a domain is more than its seeds. The
seed checks, the judge prompt, the amplification prompt (its static block is the
domain's tools and policy), post-processing and validation all read one domain
pack, and the prompt caches want one static prefix per call stream. So a recipe
with ``parts`` runs the amplify job once per part, each a whole amplify run of its
own (seed checks, judge, rounds to its quota, resume, cache) in ``OUT/parts/LABEL/``
with the recipe's ``llm``, ``prefilter`` and ``amplify`` settings, the part's domain
and seeds, and ``amplify.target`` = the part's quota. Then the accepted rows of every
part are copied, in part order, into ``OUT/data/`` with the part's label in
``meta.domain``, and one ``dataset_info.json`` and ``manifest.json`` describe the
mixed dataset (``manifest.parts`` holds each part's totals and why it stopped).

Nothing here knows a domain: a part is a ``domain`` section like any recipe's.
Every part shares the recipe's response cache (``OUT/cache`` unless ``cache.path``
names one), so ``--fresh`` keeps what every part paid for. Caps are run-wide: a part
gets what the parts before it left of ``max_cost_usd``, ``max_tokens`` and
``max_calls``, and a cap reached stops the parts after it (they are recorded as not
run): one run-wide ``Ledger`` carries each part's spend, and its cap calculation (the
one every job and the simulated environments use) says what is left and when a cap is
reached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from factory.engine.jobs.amplify import amplify_caps
from factory.engine.ledger import Ledger
from factory.engine.result import RunResult, new_manifest
from factory.io.writer import ShardWriter, write_dataset_info
from factory.llm.backends.openai_wire import tokens_record, tokens_usage
from factory.recipe import AmplifyRecipe, MixRecipe, PartConfig

__all__ = [
    "Composite",
    "RunJob",
    "check_part_seeds",
    "label_rows",
    "part_label",
    "part_recipe",
    "run_mix",
]

PARTS_DIR = "parts"
TOTAL_KEYS = ("total", "accepted", "surplus", "rejected", "failed")


def part_label(part: PartConfig) -> str:
    """The label a part's rows carry (``meta.domain``) and its folder's name."""
    return part.label or part.domain.name


def part_recipe(
    cfg: MixRecipe, index: int, out_dir: Path, spent: dict[str, float] | None = None
) -> AmplifyRecipe:
    """The amplify recipe of part ``index``: ``cfg`` with the part's domain and seeds, its
    quota as target, its own folder, the shared cache and what is left of the caps.

    Args:
        cfg: a recipe with ``parts``.
        index: which part.
        out_dir: the mixed run's output folder.
        spent: what earlier parts used (``cost_usd``, ``tokens``, ``calls``).
    """
    part = cfg.parts[index]
    spent = spent or {}
    left = amplify_caps(cfg).left(
        spent.get("cost_usd", 0.0), int(spent.get("tokens", 0)), int(spent.get("calls", 0))
    )
    amp = cfg.amplify.model_copy(
        update={
            "target": part.quota,
            "max_cost_usd": left.max_cost_usd,
            "max_tokens": left.max_tokens,
            "max_calls": left.max_calls,
        }
    )
    cache = cfg.cache.model_copy(update={"path": cfg.cache.path or str(out_dir / "cache")})
    output = cfg.output.model_copy(
        update={
            "dir": str(out_dir / PARTS_DIR / part_label(part)),
            "dataset_name": f"{cfg.output.dataset_name}_{part_label(part)}",
        }
    )
    return cfg.part(index).model_copy(update={"amplify": amp, "cache": cache, "output": output})


def check_part_seeds(cfg: MixRecipe, out_dir: Path) -> None:
    """Every part's seed files, before the folder or Ray (``pipeline.check_seed_files``)."""
    from factory.engine.pipeline import check_seed_files

    for seeds in cfg.seed_sections():
        check_seed_files(seeds)


def label_rows(rows: Iterator[dict[str, Any]], label: str) -> Iterator[dict[str, Any]]:
    """The rows with ``label`` written as ``meta.domain`` (meta is a JSON object text)."""
    for row in rows:
        meta = json.loads(row.get("meta") or "{}")
        meta["domain"] = label
        yield {**row, "meta": json.dumps(meta, ensure_ascii=False)}


def _part_rows(part_dir: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for path in sorted((part_dir / "data").glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
            yield from batch.to_pylist()


class RunJob(Protocol):
    """``factory.engine.runner.run_job``: one job of the loop, run into its folder."""

    def __call__(
        self, cfg: AmplifyRecipe, out_dir: Path, *, progress: bool = True
    ) -> RunResult: ...


class Composite(Protocol):
    """A job that runs jobs of the loop of its own, each through ``run_job`` (``run_mix``)."""

    def __call__(
        self, cfg: MixRecipe, out_dir: Path, *, run_job: RunJob, progress: bool = True
    ) -> RunResult: ...


def _run_part(
    sub: AmplifyRecipe, part_dir: Path, progress: bool, run_job: RunJob
) -> tuple[dict[str, Any], str | None]:
    """Run (or resume, or reuse when done) one part in its folder; (manifest, stopped_by)."""
    from factory.io.runstate import finish_run, prepare_output

    # the mixed run's own folder checked the shared cache already
    mode = prepare_output(sub, part_dir, fresh=False, retry_failed=False, other_cache=True)
    if mode == "done":
        manifest = json.loads((part_dir / "manifest.json").read_text(encoding="utf-8"))
        return manifest, None
    result = run_job(sub, part_dir, progress=progress)
    if result.error is None:
        finish_run(sub, part_dir, stopped_by=result.stopped_by)
    return {**result.manifest, "error": result.error}, result.stopped_by


def run_mix(cfg: MixRecipe, out_dir: Path, *, run_job: RunJob, progress: bool = True) -> RunResult:
    """Run a recipe with ``parts`` into ``out_dir`` (see the module docstring): each part
    through ``run_job``, the one driver loop's entry (``factory.engine.runner``)."""
    # each part's rows carry their own domain's tools: the manifest names the parts
    domain = {"name": cfg.domain.name, "parts": [part_label(p) for p in cfg.parts]}
    manifest = new_manifest(cfg, domain)
    data = ShardWriter(out_dir, shard_rows=cfg.output.shard_rows)
    totals = dict.fromkeys(TOTAL_KEYS, 0)
    ledger = Ledger(amplify_caps(cfg))  # what every part spent, against the run-wide caps
    parts: dict[str, Any] = {}
    stopped_by: str | None = None
    error: str | None = None
    for index, part in enumerate(cfg.parts):
        label = part_label(part)
        cap = ledger.exhausted()
        if cap is not None or error is not None:
            stopped_by = stopped_by or cap
            parts[label] = {"quota": part.quota, "run": False, "stopped_by": cap}
            continue
        spent = {"cost_usd": ledger.cost_usd, "tokens": ledger.run_tokens, "calls": ledger.calls}
        sub = part_recipe(cfg, index, out_dir, spent)
        part_dir = Path(sub.output.dir)
        part_manifest, part_stop = _run_part(sub, part_dir, progress, run_job)
        before = data.rows_written
        data.extend(label_rows(_part_rows(part_dir), label))
        data.flush()
        written = data.rows_written - before
        part_totals = part_manifest.get("totals") or {}
        for key in TOTAL_KEYS:
            totals[key] += int(part_totals.get(key, 0))
        for stage, outcomes in (part_manifest.get("stages") or {}).items():
            manifest.stages.setdefault(stage, {})
            for outcome, n in outcomes.items():
                manifest.stages[stage][outcome] = manifest.stages[stage].get(outcome, 0) + n
        for stage, codes in (part_manifest.get("reasons") or {}).items():
            for code, n in codes.items():
                manifest.reason(stage, code, n)
        part_tokens = part_manifest.get("tokens") or {}
        ledger.carry(
            label,
            usage=tokens_usage(part_tokens) if part_tokens else None,
            cost_usd=float(part_manifest.get("cost_usd") or 0.0),
            calls=int((part_manifest.get("calls") or {}).get("issued", 0)),
        )
        parts[label] = {
            "quota": part.quota,
            "run": True,
            "dir": part_dir.relative_to(out_dir).as_posix(),
            "rows": written,
            "totals": part_totals,
            "stopped_by": part_stop,
            "cost_usd": part_manifest.get("cost_usd"),
            "generated_with_devserver": part_manifest.get("generated_with_devserver"),
        }
        stopped_by = stopped_by or part_stop
        error = error or part_manifest.get("error")
    data.close()
    manifest.add_files(data)
    # A tools column unless every part is a text-action domain (no tool list to render).
    tools = any(p.domain.grammar is None for p in cfg.parts)
    write_dataset_info(out_dir, cfg.output.dataset_name, tools=tools)
    manifest.extra.update(
        pipeline="amplify",
        parts=parts,
        cost_usd=round(ledger.cost_usd, 6),
        tokens={} if (used := ledger.usage) is None else tokens_record(used),
        calls={"issued": ledger.calls},
        target={
            "requested": sum(p.quota for p in cfg.parts),
            "reached": totals["accepted"] >= sum(p.quota for p in cfg.parts),
            "stopped_by": stopped_by,
        },
        generated_with_devserver=any(p.get("generated_with_devserver") for p in parts.values()),
    )
    manifest.write(out_dir, **totals)
    manifest_dict = manifest.to_dict(**totals)
    result = RunResult(
        out_dir, totals, manifest_dict, stopped_by=stopped_by, wall_s=manifest_dict["wall_time_s"]
    )
    result.error = error
    return result
