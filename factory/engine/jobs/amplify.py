"""The amplification job, declared: seeds -> checked and judged seeds -> calls until the target.

Two streams through the one driver loop (``factory.engine.loop``):

* ``seeds``: every seed record, read lazily on the driver, through the rule checks
  and the LLM judge (``seeds`` chain). Kept seeds are gathered in record order
  (every amplification actor needs them); rejects and failures go to
  ``rejects/seeds/`` and ``failed/seeds/``; seeds a cap left unjudged are
  ``unissued`` (nothing was decided about them).
* ``calls``: once every seed is in, call ``k = 0, 1, 2, ...`` (``calls`` chain:
  amplify, then post-processing), seed and variation a pure function of ``k``
  (``factory.engine.stages.amplify.assign``). Calls go out while what is in flight
  is not expected to cover the target at the yield observed so far (no margin
  before any call came back, 5% after), so the number of calls follows the real
  yield and a slow call never holds the others back.

The run ends when the target is reached in call order (the rows are used in
call order, so the same cache always gives the same dataset), when a cap leaves
no room (the loop's ledger), or when ``no_progress_calls`` calls in a row gave no
row (a dead endpoint cannot burn the budget), and says which.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from factory.core.dedup import Deduper
from factory.core.diversity import DiversityStats
from factory.core.mixture import Mixture
from factory.core.selection import select
from factory.engine.collect import Collector
from factory.engine.console import console, top_reasons
from factory.engine.filing import Filing, exact_duplicates
from factory.engine.ledger import Caps, Ledger
from factory.engine.loop import Bar, Declaration, JobReport, Workers
from factory.engine.pipeline import build_seed_check, seed_rows_local
from factory.engine.prompts import PromptTemplate, estimate_tokens
from factory.engine.quality import build_decontaminator, build_neardup_index, decontam_summary
from factory.engine.rows import Fate, Row, Status
from factory.engine.settings import (
    LLMStageSettings,
    amplify_prompt,
    amplify_settings,
    cache_location,
    llm_stages,
    per_actor_concurrency,
    postprocess_settings,
    prefilter_prompt,
    quality_settings,
    seed_check_settings,
)
from factory.engine.stages.amplify import amplify_template, build_amplify, seed_order
from factory.engine.stages.base import StageSpec
from factory.engine.stages.postprocess import build_postprocess, seed_systems
from factory.engine.stages.prefilter import build_prefilter
from factory.engine.work import Item, ItemResult
from factory.envs.pack import Domain
from factory.errors import SeedError
from factory.io.runstate import batch_summary
from factory.io.writer import Manifest, RejectWriter, ShardWriter
from factory.llm.costs import cache_read_share
from factory.llm.types import Usage
from factory.recipe import AmplifyRecipe, MixRecipe, MixtureConfig, Recipe

__all__ = [
    "AmplifyJob",
    "AmplifyPlanner",
    "amplify_caps",
    "calls_wanted",
    "no_seeds_error",
    "preflight",
    "yield_estimate",
]

DEVSERVER_FINGERPRINT = "factory-devserver"
MAX_AHEAD = 4096  # calls issued ahead of the oldest unfinished one (what waits in order)


PRIOR_CALLS = 20  # weight of the recipe's expected yield in the yield estimate


def calls_wanted(
    *, remaining: int, pending: int, released: int, accepted: int, expected: float = 0.9
) -> int:
    """How many more calls to issue now (pure).

    Args:
        remaining: rows still missing to the target.
        pending: calls issued and not used yet.
        released: calls used so far; ``accepted``: the rows they gave.
        expected: the recipe's ``amplify.expected_yield``, the prior of the estimate.

    Before any call came back, or while every call gave a row, one call per missing
    row; after that, what is missing over the estimated yield plus 5%, so the target
    is usually met without another wave. The estimate starts at ``expected`` and moves
    to the observed yield as calls come back (weight ``PRIOR_CALLS``): one reject among
    the first two calls must not read as a 50% yield and double what goes out (floored
    at 5%).
    """
    if remaining <= 0:
        return 0
    if released == 0 or accepted >= released:
        return max(0, remaining - pending)
    estimate = yield_estimate(accepted, released, expected)
    return max(0, math.ceil(remaining / estimate * 1.05) - pending)


def yield_estimate(accepted: int, released: int, expected: float) -> float:
    """The share of calls that give a row: the observed ``accepted / released`` with the
    recipe's ``expected`` counted as ``PRIOR_CALLS`` calls, floored at 5% (pure). The
    run's planner and the plan of a resumed folder (``factory.engine.plan``) both use it."""
    return max((accepted + expected * PRIOR_CALLS) / (released + PRIOR_CALLS), 0.05)


def no_progress_calls(target: int, concurrency: int) -> int:
    """Calls in a row without a row after which a run gives up (``no_progress``)."""
    return max(20, min(target, 2 * concurrency))


def preflight(cfg: AmplifyRecipe, domain: Domain) -> PromptTemplate:
    """Build on the driver what every actor will build, so a recipe error (missing key,
    bad sampling option, broken template) stops the run with its key path before any
    Ray work, instead of surfacing as a dead actor."""
    from factory.engine.stages.llm_stage import build_backend_for

    template = amplify_template(amplify_prompt(cfg), domain)
    if cfg.amplify.grounding is not None:
        from factory.engine.stages.amplify import grounding_world

        # bad world sizes (or a domain without grounding) fail here, with their key
        grounding_world(cfg.amplify.grounding, cfg.domain.name)
    if cfg.mixture is not None:
        Mixture.load(Path(cfg.mixture.path))
    build_decontaminator(quality_settings(cfg))  # a missing or empty benchmark file
    if cfg.prefilter.enabled:
        prompt = prefilter_prompt(cfg)
        PromptTemplate(prompt.path, domain, key_path=prompt.key)
    for settings in llm_stages(cfg).values():
        build_backend_for(settings)  # backend, options, keys, sampling; opens no connection
    return template


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


class SeedSide:
    """What the ``seeds`` stream decided, filed as it is used (in record order)."""

    def __init__(self, out_dir: Path) -> None:
        # the seeds' own duplicate filter; rejects/seeds/ and failed/seeds/
        self.filing: Filing[Row] = Filing(
            RejectWriter(out_dir, subdir="rejects/seeds"),
            RejectWriter(out_dir, subdir="failed/seeds"),
            checks=[exact_duplicates(Deduper("same content as seed {first}"))],
        )
        self.kept: dict[str, str] = {}
        self.unread = 0  # records a stop left unread: unissued, never filed
        self.reasons: dict[str, int] = {}
        self.examples: dict[str, tuple[str, str]] = {}  # first row of each reason (console)
        self.judged = 0

    @property
    def counts(self) -> dict[str, int]:
        """The manifest's ``seeds`` counts (a kept seed is the seed side's accepted)."""
        c = self.filing.counts
        unissued = c[Fate.UNISSUED] + self.unread
        return {
            "total": sum(c.values()) + self.unread,
            "kept": c[Fate.ACCEPTED],
            Fate.REJECTED: c[Fate.REJECTED],
            Fate.FAILED: c[Fate.FAILED],
            Fate.UNISSUED: unissued,
        }

    def add(self, row: Row) -> None:
        if row.get("llm_stage") == "prefilter" and row["status"] != Status.UNISSUED:
            self.judged += 1
        fate = self.filing.file(row, self._keep)
        if fate in (Fate.REJECTED, Fate.FAILED):
            key = f"{row['stage']}:{row['reason']}"
            self.reasons[key] = self.reasons.get(key, 0) + 1
            source = row.get("source") or row.get("id") or "?"
            self.examples.setdefault(key, (source, row.get("message") or ""))

    def _keep(self, row: Row) -> Fate:
        self.kept[row["id"] or ""] = row["record"] or ""
        return Fate.ACCEPTED

    def close(self, manifest: Manifest, retries: dict[str, int]) -> None:
        for writer in self.filing.close():
            manifest.add_files(writer)
        manifest.extra["seeds"] = {**self.counts, "reasons": self.reasons, "retries": retries}

    def error(self) -> SeedError:
        folders = [w.dir for w in (self.filing.rejects, self.filing.failed) if w is not None]
        return no_seeds_error(self.counts, self.reasons, self.examples, folders)


class AmplifyPlanner:
    """Seeds first, then calls as the observed yield requires (see the module docstring).

    Args:
        records: the raw seed rows, read lazily.
        judged: whether the seed chain makes LLM calls (the pre-filter is on).
        start_calls: called once with the kept seeds; declares the ``calls`` chain.
        collector: where call rows go (its ``accepted`` is the target's count).
        seeds: the seed side's filing.
        target, give_up: the run's target and ``no_progress_calls``.
    """

    def __init__(
        self,
        records: Iterator[dict[str, Any]],
        *,
        judged: bool,
        start_calls: Callable[[dict[str, str]], None],
        collector: Collector,
        seeds: SeedSide,
        target: int,
        give_up: int,
        expected_yield: float = 0.9,
    ) -> None:
        self._records = records
        self.expected_yield = expected_yield
        self._judged = judged
        self._start_calls = start_calls
        self.collector = collector
        self.seeds = seeds
        self.target = target
        self.give_up = give_up
        self.phase = "seeds"
        self.seeds_issued = 0
        self.seeds_read_all = False
        self.seeds_used = 0
        self.calls_issued = 0
        self.calls_used = 0
        self.results_in = 0
        self._streak = 0
        self._accepted_before = 0
        self._stopped_by: str | None = None
        self.clock: dict[str, float] = {}

    # -- the Planner protocol -------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase == "done"

    @property
    def stopped_by(self) -> str | None:
        return self._stopped_by

    def issue(self, room: int, llm_room: int) -> list[Item]:
        if self.phase == "seeds":
            return self._issue_seeds(min(room, llm_room) if self._judged else room)
        if self.phase == "calls":
            return self._issue_calls(min(room, llm_room))
        return []

    def wanted(self, result: ItemResult) -> bool:
        return True

    def observe(self, result: ItemResult) -> None:
        if result.stream == "seeds":
            for row in result.rows:
                self.seeds.add(row)
            self.seeds_used += 1
            if self.seeds_read_all and self.seeds_used == self.seeds_issued:
                self._seeds_done()
            return
        if result.cancelled:  # never started, or its retries cut once the target was met:
            return  # it counts nowhere, as if it had not been issued (``ItemResult``)
        self.calls_used += 1
        if self.collector.accepted > self._accepted_before:
            self._streak = 0
        else:
            self._streak += 1
        self._accepted_before = self.collector.accepted
        if self.collector.done:
            self.phase = "done"
        elif self._streak >= self.give_up:
            self.phase, self._stopped_by = "done", "no_progress"
        if self.phase == "done":
            self.clock["calls_done"] = time.time()

    def bars(self) -> list[Bar]:
        s = self.seeds
        total = self.seeds_issued if self.seeds_read_all else None
        out = [
            Bar(
                "seeds checked",
                self.seeds_used,
                total,
                {"kept": s.counts["kept"], "rejected": s.counts["rejected"] + s.counts["failed"]},
            )
        ]
        if self._judged:
            out.append(Bar("judge", s.judged, None, {"kept": s.counts["kept"]}))
        if self.phase != "seeds":
            c = self.collector
            out.append(
                Bar(
                    "accepted",
                    c.accepted,
                    self.target,
                    {
                        "calls": self.calls_used,
                        "rejected": c.counts[Fate.REJECTED],
                        "failed": c.counts[Fate.FAILED],
                    },
                )
            )
        return out

    # -- seeds ----------------------------------------------------------------------------
    def unread_seeds(self) -> int:
        """Read (and count) the seed records never issued: a stop came first."""
        left = 0 if self.seeds_read_all else sum(1 for _ in self._records)
        self.seeds_read_all = True
        return left

    def _issue_seeds(self, n: int) -> list[Item]:
        items: list[Item] = []
        while len(items) < n and not self.seeds_read_all:
            row = next(self._records, None)
            if row is None:
                self.seeds_read_all = True
                if self.seeds_used == self.seeds_issued:
                    self._seeds_done()
                break
            items.append(Item("seeds", self.seeds_issued, "seeds", row, llm=self._judged))
            self.seeds_issued += 1
        return items

    def _seeds_done(self) -> None:
        if not self.seeds.kept:
            self.phase = "done"  # the loop says which cap stopped the judge, if one did
            return
        self.phase = "calls"
        self._start_calls(self.seeds.kept)

    # -- calls ----------------------------------------------------------------------------
    def _issue_calls(self, n: int) -> list[Item]:
        pending = self.calls_issued - self.calls_used
        want = calls_wanted(
            remaining=self.target - self.collector.accepted,
            pending=pending,
            released=self.calls_used,
            accepted=self.collector.accepted,
            expected=self.expected_yield,
        )
        n = min(n, want, MAX_AHEAD - pending)
        items = [
            Item("calls", k, "calls", {"call_index": k}, llm=True)
            for k in range(self.calls_issued, self.calls_issued + max(0, n))
        ]
        self.calls_issued += len(items)
        return items


def seed_chain(
    cfg: AmplifyRecipe, stages: dict[str, LLMStageSettings], domain: Domain
) -> list[StageSpec]:
    """The seeds' stages: the checks, then the judge when the pre-filter is on (each spec
    carries its settings and the domain, not the recipe)."""
    chain: list[StageSpec] = [(build_seed_check, (seed_check_settings(cfg), domain))]
    if "prefilter" in stages:
        chain.append((build_prefilter, (stages["prefilter"], prefilter_prompt(cfg), domain)))
    return chain


def amplify_caps(cfg: AmplifyRecipe | MixRecipe) -> Caps:
    """The run-wide budget caps of an amplify recipe (``amplify.max_*``)."""
    return Caps(*cfg.spend_caps())


def amplify_workers(cfg: AmplifyRecipe) -> Workers:
    """Items one worker holds at once: twice its LLM request slots (a finished request's
    slot is refilled from its queue without waiting for the driver).

    Three times the slots left fewer slots idle in the peer benchmark's S1 (16 against 20
    idle slot-seconds in the middle of a 10 s run, noisy), but a run whose every call
    fails then took 139 s instead of 42 s to stop
    (``tests/e2e/test_budget.py::test_a_run_whose_calls_all_fail_exits_incomplete_not_0``
    with ``amplify.target=5``, as it was until 2026-11-28):
    each queued item still goes through its failure. Kept at twice (2026-11-26)."""
    slots = per_actor_concurrency(cfg)
    return Workers(capacity=2 * slots, slots=slots)


class AmplifyJob(Declaration):
    """The declaration plus what it writes into the manifest when the loop is done
    (``factory.engine.loop.Job``)."""

    pipeline = "amplify"

    def __init__(
        self,
        cfg: AmplifyRecipe,
        out_dir: Path,
        manifest: Manifest,
        add_chain: Callable[[str, Sequence[StageSpec]], None],
    ) -> None:
        from factory.envs.pack import load_domain

        self.cfg, self.out_dir, self.manifest = cfg, out_dir, manifest
        domain = load_domain(cfg.domain)  # once, on the driver: the stages get it
        self.caps = amplify_caps(cfg)
        self.workers = amplify_workers(cfg)
        self.template = preflight(cfg, domain)
        self.llm_settings = llm_stages(cfg)
        target = cfg.amplify.target
        # With a mixture, accepted rows are candidates; the selection is written to data/.
        self.collector = Collector(
            out_dir,
            manifest,
            dataset_name=cfg.output.dataset_name,
            shard_rows=cfg.output.shard_rows,
            target=target,
            data_subdir="candidates" if cfg.mixture else "data",
            keep_labels=cfg.mixture is not None,
            # Loads the earlier runs' indexes now: a bad one stops the run before any call.
            neardup=build_neardup_index(cfg.near_duplicates),
            tools_column=cfg.domain.grammar is None,
        )
        if cfg.mixture:
            self.collector.mixture = Mixture.load(Path(cfg.mixture.path))
        cache = cache_location(cfg)
        self.collector.cache_dir = Path(cache) if cache else None
        self.seed_side = SeedSide(out_dir)

        def start_calls(kept: dict[str, str]) -> None:
            order = seed_order(list(kept), cfg.amplify.seed)
            self.collector.seeds = list(kept)
            spec: list[StageSpec] = [
                (
                    build_amplify,
                    (self.llm_settings["amplify"], amplify_settings(cfg), domain, kept, order),
                ),
                (
                    build_postprocess,
                    (postprocess_settings(cfg), domain, seed_systems(domain, kept)),
                ),
            ]
            add_chain("calls", spec)
            planner.clock["calls_started"] = _now()

        planner = AmplifyPlanner(
            seed_rows_local(cfg.seeds),
            judged="prefilter" in self.llm_settings,
            start_calls=start_calls,
            collector=self.collector,
            seeds=self.seed_side,
            target=target,
            give_up=no_progress_calls(target, cfg.llm.concurrency),
            expected_yield=cfg.amplify.expected_yield,
        )
        self.amplify_planner = planner
        super().__init__(
            name="amplify",
            chains={"seeds": seed_chain(cfg, self.llm_settings, domain)},
            planner=planner,
            sink=_Sink(self.collector, self.seed_side),
            reserve=batch_reservation(cfg, self.template, self.llm_settings["amplify"]),
        )

    def running(self, progress: bool) -> contextlib.AbstractContextManager[None]:
        """A batched backend's batches on the console (``batch_progress``)."""
        return batch_progress(self.cfg, self.out_dir, progress)

    def finish(self, ledger: Ledger, stopped_by: str | None) -> JobReport:
        """Close the writers; the job's manifest sections (the ledger adds its own)."""
        cfg, planner, collector = self.cfg, self.amplify_planner, self.collector
        if stopped_by is not None and planner.phase == "seeds":
            # a stop (a cap) left seeds unread: they count as unissued, as a judge call
            # refused in flight does; nothing was decided about them
            left = planner.unread_seeds()
            self.seed_side.unread += left
            if "prefilter" in self.llm_settings:
                ledger.spend["prefilter"].unissued += left
        seed_retries = ledger.spend["prefilter"].retries if "prefilter" in ledger.spend else {}
        self.seed_side.close(self.manifest, dict(seed_retries))
        if (
            not self.seed_side.kept
            and not self.seed_side.counts[Fate.UNISSUED]
            and not (collector.unstored or stopped_by)
        ):
            raise self.seed_side.error()
        mixture_report = (
            select_mixture(cfg.mixture, cfg.output.shard_rows, self.out_dir, collector)
            if cfg.mixture
            else None
        )
        collector.close()
        static = estimate_tokens(self.template.static)
        used = ledger.spend["amplify"].usage or Usage()
        input_tokens, share = used.input, cache_read_share(used)
        issued = planner.calls_used
        reached = collector.accepted >= cfg.amplify.target
        clock = {k: round(v - self.manifest.started, 2) for k, v in planner.clock.items()}
        sections = {
            "mixture": mixture_report,
            "calls": {"issued": issued},
            "target": {
                "requested": cfg.amplify.target,
                "reached": reached,
                "stopped_by": None if reached else stopped_by,
            },
            "prompt_cache": {
                "static_prefix_tokens_per_call": static,
                "static_prefix_share": round(static * issued / input_tokens, 4)
                if input_tokens
                else None,
                # the ledger's one calculation (by_stage.amplify.cache_read_share)
                "server_cached_share": None if share is None else round(share, 4),
            },
            "generated_with_devserver": DEVSERVER_FINGERPRINT in collector.fingerprints,
            "batches": batch_summary(self.out_dir),  # llm.backend openai_batch: ids, outcomes
            "timings": clock,
            "model": cfg.llm.model,
            "decontamination": decontam_summary(cfg, self.manifest),
        }
        return JobReport(sections)

    def error(self, stopped_by: str | None) -> str | None:
        c = self.collector
        if c.cache_error is None:
            return None
        return (
            f"cannot store LLM responses in the cache ({c.cache_error}); the run stopped "
            f"issuing calls; {len(c.unstored)} paid responses are counted (tokens, cost, "
            f"budget) and kept in {', '.join(c.unstored_in)} (the next run stores them "
            "in the cache); make the cache writable and run the same command again to resume"
        )


class _Sink:
    """Seed rows to the seed side (via the planner), call rows to the collector."""

    def __init__(self, collector: Collector, seeds: SeedSide) -> None:
        self.collector = collector
        self.seeds = seeds

    @property
    def stop_reason(self) -> str | None:
        return self.collector.stop_reason

    def arrived(self, result: ItemResult) -> None:
        self.collector.arrived(result)

    def add(self, row: Row, stream: str = "calls") -> Fate | None:
        if stream == "seeds":  # the planner files it (not a row of the run's totals)
            return None
        return self.collector.add(row)


def batch_reservation(
    cfg: AmplifyRecipe, template: PromptTemplate, settings: LLMStageSettings
) -> tuple[float, int]:
    """What one call reserves against the caps when the backend takes batches: the cost
    and tokens of the first seed's request, estimated (prompt from its text, output
    ``max_completion_tokens`` or as long as the prompt). Online backends reserve nothing."""
    if not settings.batched or not (cfg.amplify.max_cost_usd or cfg.amplify.max_tokens):
        return (0.0, 0)
    from factory.core.formats import parse_record
    from factory.engine.stages.llm_stage import render, reservation

    first = next(seed_rows_local(cfg.seeds), None)
    if first is None or not first.get("record"):
        return (0.0, 0)
    try:
        traj = parse_record(json.loads(first["record"]), source="estimate")
    except Exception:
        return (0.0, 0)
    prompt = template.render(traj, variation=0)
    request = render("amplify", settings.model, settings.sampling, prompt.messages, seed="x")
    return reservation(request, settings.price, settings.max_output_tokens)


def select_mixture(
    mx: MixtureConfig, shard_rows: int, out_dir: Path, collector: Collector
) -> dict[str, Any]:
    """With a recipe mixture: choose from the accepted candidates and copy them to data/.

    The manifest's ``diversity`` then describes the selection (what ``data/`` holds and
    a trainer reads), counted while the rows are copied; the candidates' count is kept
    beside it.
    """
    import pyarrow.parquet as pq

    mixture = Mixture.load(Path(mx.path))
    selection = select(
        collector.accepted_labels,
        mixture,
        seed=mx.seed,
        exclude_task_ids=mx.exclude_task_ids,
        exclude_user_ids=mx.exclude_user_ids,
    )
    chosen = set(selection.ids)
    collector.data.flush()  # the last candidates may still be buffered
    data = ShardWriter(out_dir, shard_rows=shard_rows)
    selected = DiversityStats()
    for path in sorted((out_dir / "candidates").glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
            rows = [r for r in batch.to_pylist() if r["id"] in chosen]
            data.extend(rows)
            for row in rows:  # seed and labels as filed (the row's meta holds the same)
                seed_id, labels = collector.kept_meta[row["id"]]
                selected.add(row, seed_id=seed_id, labels=labels)
    data.close()
    collector.candidate_rows = collector.diversity.rows
    collector.diversity = selected
    collector.manifest.add_files(data)
    if selection.shortfall and not mx.allow_shortfall:
        raise SeedError("shortfall", f"mixture quotas not met: {selection.shortfall}")
    return {**selection.summary(), "written": data.rows_written, "report": selection.report()}


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
def batch_progress(
    cfg: Recipe, out_dir: Path | Callable[[], Path], enabled: bool
) -> Iterator[None]:
    """With a batched backend, print its batches' line on the console when it changes
    (checked every 5 s): rows arrive only as whole batches end, hours apart with a real
    Batch API, so the row bar alone would look stuck. ``out_dir``: the folder whose
    batches to show, or what says it each time (a mixed recipe's running part)."""
    from factory.llm.backends import get_backend

    if not enabled or cfg.llm is None or not get_backend(cfg.llm.backend).batched:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        last = None
        while not stop.wait(5.0):
            line = batch_line(batch_summary(out_dir() if callable(out_dir) else out_dir))
            if line is not None and line != last:
                last = line
                print(line, file=console(), flush=True)

    thread = threading.Thread(target=watch, name="batch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _now() -> float:
    return time.time()
