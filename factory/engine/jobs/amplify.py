"""The amplification job: seeds -> kept seeds -> rounds of calls until the target.

Phase 1 streams every seed through the rule checks and the LLM judge; the
kept seeds (a few thousand records) are gathered on the driver because every
amplification actor needs them. Phase 2 issues calls in rounds: the first
round asks for one call per missing row, each later one for what is still
missing divided by the yield observed so far (plus 5%), so the number of calls
follows the real yield (``expected_yield`` only serves the dry-run plan). It
stops when the target is reached, when a cap
(``max_calls``, ``max_cost_usd``, ``max_tokens``) leaves no room for another
call, or when a whole round accepted nothing (so a dead endpoint cannot burn
the budget), and says which.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from factory.config import RecipeConfig
from factory.core.dedup import DEDUP_STAGE, Deduper
from factory.core.diversity import DiversityStats
from factory.core.mixture import Mixture
from factory.core.selection import select
from factory.engine.collect import Collector
from factory.engine.console import top_reasons
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.engine.quality import build_decontaminator, build_neardup_index, decontam_summary
from factory.engine.result import RunResult, _progress, new_manifest
from factory.engine.stages.amplify import amplify_template
from factory.engine.stages.base import FAILED, OK, UNISSUED, reject
from factory.errors import SeedError
from factory.io.runstate import batch_summary, load_rounds, save_rounds
from factory.io.writer import Manifest, RejectWriter, ShardWriter

__all__ = ["plan_round", "preflight", "run_amplify"]

DEVSERVER_FINGERPRINT = "factory-devserver"


def plan_round(
    cfg: RecipeConfig, *, accepted: int, issued: int, spent_usd: float, tokens: int
) -> tuple[int, str | None]:
    """How many calls the next round issues, or 0 and the cap that forbids more."""
    assert cfg.amplify is not None
    amp = cfg.amplify
    remaining = amp.target - accepted
    if remaining <= 0:
        return 0, None
    # First round: one call per missing row (no surplus when nothing fails). Later
    # rounds scale what is missing by the observed yield, plus a 5% margin so the
    # target is usually met in one more round (each round restarts the actor pools).
    observed = accepted / issued if issued else 1.0
    n = remaining if observed >= 1.0 else math.ceil(remaining / max(observed, 0.05) * 1.05) + 2
    if amp.max_calls is not None:
        n = min(n, amp.max_calls - issued)
        if n <= 0:
            return 0, "max_calls"
    for cap, used, name in (
        (amp.max_cost_usd, spent_usd, "max_cost_usd"),
        (amp.max_tokens, tokens, "max_tokens"),
    ):
        if cap is None:
            continue
        if used >= cap:
            return 0, name
        if issued and used > 0:
            per_call = used / issued
            n = min(n, max(1, math.floor((cap - used) / per_call)))
    return n, None


ROWS_PER_CALL_BLOCK = 512
# Tasks (blocks) each LLM actor works on at once. Ray Data ends a task only when every
# row of its block is done, and hands outputs on in order (preserve_order keeps runs
# deterministic for resume); a task already keeps twice its actor's request slots in rows
# (``llm_batches_per_task``), so a few tasks per actor cover the tail of a block. Few, and
# at least 4 blocks per actor (``_call_dataset``): with 16, the actor that started first
# took all 8 blocks of a 1,400-call round while the other was still starting, and the
# round ran on half the slots (fault-storm benchmark, 2026-11-22).
LLM_TASKS_PER_ACTOR = 4
# Rows per batch of an LLM stage. Ray Data hands a batch on only when its slowest row is
# done, but a finished row frees its request slot at once (the actor's semaphore), so a
# slow request holds one slot and delays the hand-off of at most 7 finished rows. Smaller
# batches cost more than they save: per batch Ray Data and the stage chain spend ~5 ms of
# CPU (9k lognormal benchmark, 2026-11-22: 1 row per batch, 17.1 CPU-s per 1k rows and
# 0.40 of the limit; 4 rows, 10.2 and 0.60; 8 rows, 9.0 and 0.73; 40 rows and 4 batches
# per task as before, 9.9 and 0.64).
LLM_ROWS_PER_BATCH = 8


def run_tokens(*usages: Counter[str]) -> int:
    """Tokens of the run as the manifest counts them: prompt + completion (cached
    tokens are a part of the prompt tokens, never added again)."""
    return sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages)


def llm_batches_per_task(cfg: RecipeConfig) -> int:
    """Batches Ray Data awaits at once within one task of an LLM stage: enough for twice
    the actor's request slots, so a slot freed by a finished request is taken at once by
    a row already waiting on the actor's semaphore, even while a single task runs (Ray's
    own default, 4 batches per task, left a third of the server's slots idle under a
    heavy latency tail)."""
    from factory.engine.stages.llm_stage import per_actor_concurrency

    return -(-2 * per_actor_concurrency(cfg) // LLM_ROWS_PER_BATCH)


def rows_per_llm_block(cfg: RecipeConfig) -> int:
    """Rows per block of the judged seeds: twice what one task awaits, so a few thousand
    seeds still spread over the actors."""
    return 2 * LLM_ROWS_PER_BATCH * llm_batches_per_task(cfg)


def _start_budget(cfg: RecipeConfig) -> Any:
    """The run's budget actor, when the recipe sets a cap."""
    from factory.engine.budget import budget_actor
    from factory.engine.stages.llm_stage import budget_name

    amp = cfg.amplify
    assert amp is not None
    if amp.max_cost_usd is None and amp.max_tokens is None and amp.max_calls is None:
        return None
    return budget_actor(
        budget_name(cfg),
        max_cost_usd=amp.max_cost_usd,
        max_tokens=amp.max_tokens,
        max_calls=amp.max_calls,
    )


def select_mixture(cfg: RecipeConfig, out_dir: Path, collector: Collector) -> dict[str, Any]:
    """With a recipe mixture: choose from the accepted candidates and copy them to data/.

    The manifest's ``diversity`` then describes the selection (what ``data/`` holds and
    a trainer reads), counted while the rows are copied; the candidates' count is kept
    beside it.
    """
    import pyarrow.parquet as pq

    assert cfg.mixture is not None
    mx = cfg.mixture
    mixture = Mixture.load(cfg.resolve(mx.path))
    selection = select(
        collector.accepted_labels,
        mixture,
        seed=mx.seed,
        exclude_task_ids=mx.exclude_task_ids,
        exclude_user_ids=mx.exclude_user_ids,
    )
    chosen = set(selection.ids)
    collector.data.flush()  # the last candidates may still be buffered
    data = ShardWriter(out_dir, shard_rows=cfg.output.shard_rows)
    selected = DiversityStats()
    for path in sorted((out_dir / "candidates").glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
            rows = [r for r in batch.to_pylist() if r["id"] in chosen]
            data.extend(rows)
            for row in rows:
                meta = json.loads(row["meta"]) if row.get("meta") else {}
                selected.add(row, seed_id=meta.get("seed_id"), labels=meta.get("labels"))
    data.close()
    collector.candidate_rows = collector.diversity.rows
    collector.diversity = selected
    collector.manifest.files.update(data.files)
    if selection.shortfall and not mx.allow_shortfall:
        raise SeedError("shortfall", f"mixture quotas not met: {selection.shortfall}")
    return {**selection.summary(), "written": data.rows_written, "report": selection.report()}


def preflight(cfg: RecipeConfig) -> PromptTemplate:
    """Build on the driver what every actor will build, so a recipe error (missing key,
    bad sampling option, broken template) stops the run with its key path before any
    Ray work, instead of surfacing as a dead actor."""
    from factory.engine.stages.llm_stage import build_backend_for
    from factory.envs.pack import load_domain

    assert cfg.llm is not None and cfg.amplify is not None
    domain = load_domain(cfg)
    template = amplify_template(cfg, domain)
    if cfg.amplify.grounding is not None:
        from factory.engine.stages.amplify import grounding_world

        # bad world sizes (or a domain without grounding) fail here, with their key
        grounding_world(cfg.amplify.grounding, cfg.domain.name)
    if cfg.mixture is not None:
        Mixture.load(cfg.resolve(cfg.mixture.path))
    build_decontaminator(cfg)  # a missing or empty benchmark file
    models = {cfg.llm.model}
    if cfg.prefilter.enabled:
        PromptTemplate(cfg.resolve(cfg.prefilter.prompt), domain, key_path="prefilter.prompt")
        models.add(cfg.prefilter.model or cfg.llm.model)
    for model in sorted(models):
        build_backend_for(cfg, model)  # backend, options, keys, sampling; opens no connection
    return template


def _collect_seeds(
    cfg: RecipeConfig, out_dir: Path, manifest: Manifest, collector: Collector
) -> tuple[dict[str, str], Counter[str], float]:
    """Run phase 1: kept seeds ``{id: record JSON}``, judge tokens and cost.

    Rejected and failed seeds go to ``rejects/seeds/`` and ``failed/seeds/``; seeds a
    cap left unjudged are ``unissued`` (not rejects: nothing was decided about them).
    What the judge paid this run, its cache replays and any response the cache
    refused are recorded on ``collector`` (run-wide figures).
    """
    from factory.engine.pipeline import checked_seed_dataset, iter_rows
    from factory.engine.raycompat import map_stage
    from factory.engine.stages.llm_stage import sum_retries
    from factory.engine.stages.prefilter import build_prefilter

    ds = checked_seed_dataset(cfg)
    if cfg.prefilter.enabled:
        ds = ds.repartition(target_num_rows_per_block=rows_per_llm_block(cfg))
        ds = map_stage(
            ds,
            build_prefilter,
            cfg,
            ray_cfg=cfg.ray,
            is_async=True,
            batch_size=LLM_ROWS_PER_BATCH,
            max_concurrent_batches=LLM_TASKS_PER_ACTOR,
            batches_per_task=llm_batches_per_task(cfg),
        )
    rejects = RejectWriter(out_dir, subdir="rejects/seeds")
    failed = RejectWriter(out_dir, subdir="failed/seeds")
    kept: dict[str, str] = {}
    dedup = Deduper("same content as seed {first}")  # phase 1 owns the seeds' filter
    tokens: Counter[str] = Counter()
    counts = {"total": 0, "kept": 0, "rejected": 0, "failed": 0, "unissued": 0}
    reasons: dict[str, int] = {}
    retries: Counter[str] = Counter()
    examples: dict[str, tuple[str, str]] = {}  # the first row of each reason, for the console
    cost = 0.0
    for row in iter_rows(ds):
        counts["total"] += 1
        sum_retries(retries, row)
        collector.take_unstored(row)
        # Spend first: a judge row refused by a cap may hold an earlier, paid request.
        cost += float(row.get("cost_usd") or 0.0)
        collector.replayed += int(row.get("cached_responses") or 0)
        collector.paid_usd += float(row.get("paid_usd") or 0.0)
        if row.get("usage"):
            tokens.update(json.loads(row["usage"]))
        if row["status"] == UNISSUED:  # a cap (or a broken cache) stopped the judge call
            counts["unissued"] += 1
            continue
        duplicate = dedup.check_row(row) if row["status"] == OK else None
        if duplicate is not None:
            reject(row, DEDUP_STAGE, duplicate.code, duplicate.message)
        if row["status"] == OK:
            kept[row["id"]] = row["record"]
            counts["kept"] += 1
            continue
        counts["failed" if row["status"] == FAILED else "rejected"] += 1
        key = f"{row['stage']}:{row['reason']}"
        reasons[key] = reasons.get(key, 0) + 1
        examples.setdefault(key, (row.get("source") or row["id"] or "?", row.get("message") or ""))
        writer = failed if row["status"] == FAILED else rejects
        writer.add({k: v for k, v in row.items() if v is not None})
    rejects.close()
    failed.close()
    manifest.files.update({**rejects.files, **failed.files})
    manifest.extra["seeds"] = {**counts, "reasons": reasons, "retries": dict(retries)}
    if not kept and not counts["unissued"] and not collector.unstored:
        raise no_seeds_error(counts, reasons, examples, [rejects.dir, failed.dir])
    return kept, tokens, cost


def no_seeds_error(
    counts: dict[str, int],
    reasons: dict[str, int],
    examples: dict[str, tuple[str, str]],
    folders: list[Path],
) -> SeedError:
    """The error of a run left without seeds: counts, the commonest reasons with an
    example each, and the folders holding every row (only those that exist)."""
    where = [str(f) for f in folders if f.is_dir()]
    message = (
        f"no seed survived the checks: {counts['total']} read, {counts['rejected']} rejected, "
        f"{counts['failed']} failed" + (f"; every row is in {' and '.join(where)}" if where else "")
    )
    error = SeedError("no_seeds", message)
    error.details = tuple(top_reasons(reasons, examples))
    return error


def _call_dataset(
    cfg: RecipeConfig,
    kept: dict[str, str],
    start: int,
    n: int,
    plan: tuple[list[str], dict[str, int]] | None,
) -> Any:
    """Calls ``start .. start+n-1``: a range read straight into one actor pool that
    amplifies and post-processes (no per-block task operator in between)."""
    import ray.data

    from factory.engine.raycompat import map_stage
    from factory.engine.stages.amplify import build_amplify
    from factory.engine.stages.postprocess import build_postprocess

    # Few, large blocks: every read task costs a Ray worker ~0.3 CPU-s of fixed overhead
    # (measured: 700 blocks of 128 rows spent 200 CPU-s on 90k calls); a block of up to
    # 512 rows still streams, and at least four blocks per actor keep every actor busy
    # when one block waits for its slowest row.
    blocks = max(4 * cfg.ray.actors, math.ceil(n / ROWS_PER_CALL_BLOCK))
    ds = ray.data.range(n, override_num_blocks=min(n, blocks))
    return map_stage(
        ds,
        build_amplify,
        cfg,
        kept,
        start,
        plan,
        ray_cfg=cfg.ray,
        is_async=True,
        then=[(build_postprocess, (cfg, kept))],
        batch_size=LLM_ROWS_PER_BATCH,
        max_concurrent_batches=LLM_TASKS_PER_ACTOR,
        batches_per_task=llm_batches_per_task(cfg),
    )


def run_amplify(cfg: RecipeConfig, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Run an ``amplify`` recipe into ``out_dir``."""
    import ray

    from factory.engine.pipeline import iter_rows
    from factory.engine.raycompat import init_ray
    from factory.engine.stages.amplify import round_plan, seed_order
    from factory.engine.stages.llm_stage import sum_retries

    assert cfg.amplify is not None and cfg.llm is not None
    template = preflight(cfg)
    init_ray(cfg.ray.address)
    budget = _start_budget(cfg)
    manifest = new_manifest(cfg)
    target = cfg.amplify.target
    # With a mixture, accepted rows are candidates; the selection is written to data/.
    collector = Collector(
        out_dir,
        manifest,
        dataset_name=cfg.output.dataset_name,
        shard_rows=cfg.output.shard_rows,
        target=target,
        # No hard per-seed cap: later rounds steer calls to the seeds below their
        # share instead, so a low-yield seed cannot stall the run.
        data_subdir="candidates" if cfg.mixture else "data",
        keep_labels=cfg.mixture is not None,
        # Loads the earlier runs' indexes now: a bad one stops the run before any call.
        neardup=build_neardup_index(cfg),
    )
    if cfg.mixture:
        collector.mixture = Mixture.load(cfg.resolve(cfg.mixture.path))
    phase_start = time.time()
    kept, judge_tokens, judge_cost = _collect_seeds(cfg, out_dir, manifest, collector)
    collector.seeds = list(kept)
    timings: dict[str, Any] = {"seeds_s": round(time.time() - phase_start, 2), "rounds": []}
    seeds_unissued = manifest.extra["seeds"]["unissued"]
    order = seed_order(list(kept), cfg.amplify.seed)
    cap = math.ceil(target / max(1, len(kept)))
    # Rounds an earlier run of this folder issued: issued again first, exactly (their
    # answers are cached), so a resumed or extended run pays only for what is missing.
    previous = load_rounds(out_dir)
    issued_rounds: list[dict[str, Any]] = []
    calls: Counter[str] = Counter()  # calls made per seed: later rounds continue variations
    retries: Counter[str] = Counter()  # retried attempts by reason (amplification)
    fingerprints: set[str] = set()
    # ``next_index``: first call index of the next round; ``issued``: calls actually sent
    # (a budget cap may leave some of a round's calls unissued).
    next_index, issued, rounds, stopped_by, stalled = 0, 0, 0, None, False
    if not kept:  # a cap stopped the judge (or the cache refused its answers: below)
        stopped_by = _budget_stop(budget)
    with _progress(progress, target, "accepted") as bar, _batch_progress(cfg, out_dir, progress):
        while kept and not collector.done and collector.cache_error is None:
            used = collector.tokens + judge_tokens  # caps count the judge's spend too
            n, stopped_by = plan_round(
                cfg,
                accepted=collector.accepted,
                issued=issued,
                spent_usd=collector.cost_usd + judge_cost,
                tokens=used["prompt_tokens"] + used["completion_tokens"],
            )
            if n == 0:
                break
            replay = previous[rounds] if rounds < len(previous) else None
            if replay is not None and replay.get("start") == next_index:
                n, plan = int(replay["n"]), _plan_from_json(replay.get("plan"))
            else:
                previous = previous[:rounds]  # this run goes its own way from here
                plan = None if not rounds else round_plan(order, collector.per_seed, calls, cap)
            issued_rounds.append({"start": next_index, "n": n, "plan": plan})
            save_rounds(out_dir, issued_rounds + previous[len(issued_rounds) :])
            before = collector.accepted
            round_start = time.time()
            bar.new_phase()  # the ETA counts from this round's first completion
            for row in iter_rows(_call_dataset(cfg, kept, next_index, n, plan)):
                if row.get("seed_id"):
                    calls[row["seed_id"]] += 1
                sum_retries(retries, row)
                if collector.add(row) == "accepted":
                    bar.update(1)
                if row.get("fingerprint"):
                    fingerprints.add(row["fingerprint"])
                bar.set_postfix(
                    rejected=collector.counts["rejected"],
                    failed=collector.counts["failed"],
                    # As the manifest counts them: cached tokens are part of the prompt's.
                    tok=run_tokens(collector.tokens, judge_tokens),
                    usd=f"{collector.cost_usd:.2f}",
                    refresh=False,
                )
            next_index += n
            issued = collector.total
            rounds += 1
            timings["rounds"].append({"calls": n, "seconds": round(time.time() - round_start, 2)})
            if collector.cache_error is not None:
                stopped_by = "cache_write"
                break
            if budget is not None:
                stopped_by = ray.get(budget.snapshot.remote())["stopped_by"]
                if stopped_by:
                    break
            if collector.accepted == before:
                stalled = True
                break
    if collector.cache_error is not None:  # in either phase: no new call was started
        stopped_by = "cache_write"
    stopped_by = stopped_by or ("no_progress" if stalled else None)
    static = estimate_tokens(template.static)
    prompt_tokens = collector.tokens["prompt_tokens"]
    reached = collector.accepted >= target
    amplify_tokens = dict(collector.tokens)
    amplify_cost = collector.cost_usd
    collector.tokens.update(judge_tokens)  # manifest "tokens" / "cost_usd": whole-run totals
    collector.cost_usd += judge_cost
    amplify_unissued = collector.unissued
    collector.unissued += seeds_unissued  # calls a cap refused, whichever stage asked
    mixture_report = select_mixture(cfg, out_dir, collector) if cfg.mixture else None
    judge_retries = manifest.extra["seeds"].get("retries") or {}
    totals = collector.close(
        mixture=mixture_report,
        by_stage={
            "prefilter": {
                "tokens": dict(judge_tokens),
                "cost_usd": round(judge_cost, 6),
                "retries": judge_retries,
            },
            "amplify": {
                "tokens": amplify_tokens,
                "cost_usd": round(amplify_cost, 6),
                "retries": dict(retries),
            },
        },
        retries=dict(sorted((retries + Counter(judge_retries)).items())),
        pipeline="amplify",
        calls={"issued": issued, "rounds": rounds},
        unissued_by_stage={"prefilter": seeds_unissued, "amplify": amplify_unissued},
        target={"requested": target, "reached": reached, "stopped_by": stopped_by},
        prompt_cache={
            "static_prefix_tokens_per_call": static,
            "static_prefix_share": round(static * issued / prompt_tokens, 4)
            if prompt_tokens
            else None,
            "server_cached_share": round(collector.tokens["cached_tokens"] / prompt_tokens, 4)
            if prompt_tokens
            else None,
        },
        generated_with_devserver=DEVSERVER_FINGERPRINT in fingerprints,
        # What the run-wide budget counted (every stage): comparable with cost_usd and tokens.
        budget=None if budget is None else ray.get(budget.snapshot.remote()),
        batches=batch_summary(out_dir),  # llm.backend openai_batch: ids and outcomes
        timings=timings,
        model=cfg.llm.model,
        decontamination=decontam_summary(cfg, manifest),
    )
    manifest_dict = manifest.to_dict(**totals)
    result = RunResult(
        out_dir, totals, manifest_dict, stopped_by=stopped_by, wall_s=manifest_dict["wall_time_s"]
    )
    if collector.cache_error is not None:
        result.error = (
            f"cannot store LLM responses in the cache ({collector.cache_error}); the run stopped "
            f"issuing calls; {len(collector.unstored)} paid responses are counted (tokens, cost, "
            f"budget) and kept in {', '.join(collector.unstored_in)} (the next run stores them "
            "in the cache); make the cache writable and run the same command again to resume"
        )
    return result


def batch_line(summary: dict[str, Any] | None) -> str | None:
    """One progress line of a batched backend's batches: by state, and requests done."""
    if not summary:
        return None
    states = ", ".join(f"{n} {state}" for state, n in summary["by_status"].items())
    return (
        f"batches: {states}; requests {summary['requests_completed']}/"
        f"{summary['requests_submitted']} done, {summary['requests_failed']} failed"
    )


@contextlib.contextmanager
def _batch_progress(cfg: RecipeConfig, out_dir: Path, enabled: bool) -> Iterator[None]:
    """With a batched backend, print its batches' line when it changes (checked every
    5 s): rows arrive only as whole batches end, hours apart with a real Batch API, so
    the row bar alone would look stuck."""
    from factory.llm.backends import get_backend

    assert cfg.llm is not None
    if not enabled or not get_backend(cfg.llm.backend).batched:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        last = None
        while not stop.wait(5.0):
            line = batch_line(batch_summary(out_dir))
            if line is not None and line != last:
                last = line
                print(line, file=sys.stderr, flush=True)

    thread = threading.Thread(target=watch, name="batch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _budget_stop(budget: Any) -> str | None:
    """The cap the budget actor saw reached, if any."""
    if budget is None:
        return None
    import ray

    return ray.get(budget.snapshot.remote())["stopped_by"]


def _plan_from_json(plan: Any) -> tuple[list[str], dict[str, int]] | None:
    """A round plan as ``save_rounds`` stored it (JSON has no tuples)."""
    if not plan:
        return None
    room, base = plan
    return list(room), {str(k): int(v) for k, v in base.items()}
