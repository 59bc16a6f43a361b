"""The mixed amplification job: several domains, one dataset, a quota per domain.

Why parts and not one run over every seed: a domain is more than its seeds. The
seed checks, the judge prompt, the amplification prompt (its static block is the
domain's tools and policy), post-processing and validation all read one domain
pack, and the prompt caches want one static prefix per call stream. So a recipe
with ``parts`` declares the amplify job of each part (``AmplifyJob``, its seed
checks, judge, calls to its quota) in ``OUT/parts/LABEL/`` with the recipe's
``llm``, ``prefilter`` and ``amplify`` settings, the part's domain and seeds, and
``amplify.target`` = the part's quota, and ``MixJob`` runs them one after the other
as ONE job of the one driver loop (``factory.engine.loop.drive``): one worker pool,
one run ledger under the run-wide caps. A part's items go out under its own streams
and chains (``seeds/LABEL``, ``calls/LABEL``) and its results come back to its own
planner and sink; a per-part ledger beside the run's counts what the part spent and
decided, so each part's folder holds its own manifest and ``run.json`` as a run of
its own would (a part finished by an earlier run is reused, not run again). Then the
accepted rows of every part are copied, in part order, into ``OUT/data/`` with the
part's label in ``meta.domain``, and one ``dataset_info.json`` and ``manifest.json``
describe the mixed dataset (``manifest.parts`` holds each part's totals and why it
stopped).

Nothing here knows a domain: a part is a ``domain`` section like any recipe's.
Every part shares the recipe's response cache (``OUT/cache`` unless ``cache.path``
names one), so ``--fresh`` keeps what every part paid for. Caps are run-wide: the
run's ledger enforces them over every part (less what parts finished by an earlier
run spent), a part's manifest shows what the parts before it left, and a cap reached
leaves the parts after it unrun (recorded as not run), all through the one cap
calculation (``factory.engine.ledger.cap_reached``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from factory.engine.jobs.amplify import AmplifyJob, amplify_caps, amplify_workers, batch_progress
from factory.engine.ledger import CAPS, Ledger, cap_reached
from factory.engine.loop import Bar, JobReport
from factory.engine.result import new_manifest, write_manifest
from factory.engine.rows import Fate, Row
from factory.engine.settings import stage_prices
from factory.engine.stages.base import StageSpec
from factory.engine.work import Item, ItemResult
from factory.io.writer import Manifest, ShardWriter, write_dataset_info
from factory.llm.backends.openai_wire import tokens_record, tokens_usage
from factory.recipe import AmplifyRecipe, MixRecipe, PartConfig

__all__ = [
    "MixJob",
    "MixPlanner",
    "check_part_seeds",
    "label_rows",
    "part_label",
    "part_recipe",
]

#: Declares a chain the workers run from now on (``ActorPool.add_chain``).
AddChain = Callable[[str, Sequence[StageSpec]], None]

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


def _calls_of(manifest: dict[str, Any]) -> int:
    """The requests a finished part sent, every LLM stage's (what its ledger counted
    against the caps); ``calls.issued`` (amplify calls only) for a manifest without
    ``by_stage``."""
    by_stage = manifest.get("by_stage")
    if isinstance(by_stage, dict):
        return sum(int(s.get("calls", 0)) for s in by_stage.values())
    return int((manifest.get("calls") or {}).get("issued", 0))


class _Part:
    """One part while it runs: its amplify job declared into its own folder, its own
    manifest and its own ledger (fed by the mix job beside the run's: the part's
    manifest says what the part spent and decided, as a run of its own would)."""

    def __init__(self, label: str, sub: AmplifyRecipe, part_dir: Path, add_chain: AddChain) -> None:
        self.label, self.sub, self.dir = label, sub, part_dir
        self.manifest = new_manifest(sub)

        def add_part_chain(name: str, specs: Sequence[StageSpec]) -> None:
            add_chain(f"{name}/{label}", specs)

        self.job = AmplifyJob(sub, part_dir, self.manifest, add_part_chain)
        self.ledger = Ledger(self.job.caps, started=self.manifest.started, prices=stage_prices(sub))
        self.out = 0  # items issued and not released yet

    def chains(self) -> dict[str, Sequence[StageSpec]]:
        return {f"{name}/{self.label}": specs for name, specs in self.job.chains.items()}

    def outward(self, item: Item) -> Item:
        """The part's item under the run's names (streams and chains carry the label)."""
        return dataclasses.replace(
            item, stream=f"{item.stream}/{self.label}", chain=f"{item.chain}/{self.label}"
        )

    def inward(self, result: ItemResult) -> ItemResult:
        """A result under the part's own names (what its planner and sink expect)."""
        return dataclasses.replace(result, stream=result.stream.split("/", 1)[0])

    def finish(
        self, stopped_by: str | None, run_stop: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """Close the part: its writers, its manifest, its run.json (as ``run_job`` and
        ``run`` do for a run of its own); returns (its manifest with ``error``, why it
        stopped)."""
        from factory.io.runstate import finish_run

        if run_stop is not None and run_stop in CAPS:
            self.ledger.stopped_by = self.ledger.stopped_by or run_stop
        report = self.job.finish(self.ledger, stopped_by)
        totals = write_manifest(
            self.dir, self.manifest, self.ledger, pipeline=self.job.pipeline, report=report
        )
        error = self.job.error(stopped_by)
        if error is None:
            finish_run(self.sub, self.dir, stopped_by=stopped_by)
        return {**self.manifest.to_dict(**totals), "error": error}, stopped_by


class MixPlanner:
    """The parts one after the other: the current part's planner issues (its items under
    the part's names); once it is finished and everything it issued came back, the part
    is closed and the next one starts (``loop.drive`` stops the workers' unsent items
    meanwhile and resumes them, as for a job that is done). A part finished by an
    earlier run is reused as it is; a cap reached leaves the parts after it unrun."""

    def __init__(self, job: MixJob) -> None:
        self.job = job
        self.stopped_first: str | None = None  # the first part's reason to stop short
        self.done = False

    @property
    def part(self) -> _Part | None:
        return self.job.current

    # -- the Planner protocol -------------------------------------------------------------
    @property
    def finished(self) -> bool:
        self._next_if_settled()  # a part that ended with nothing out gives way at once
        part = self.part
        return self.done or (part is not None and part.job.planner.finished)

    @property
    def stopped_by(self) -> str | None:
        return self.stopped_first

    def issue(self, room: int, llm_room: int) -> list[Item]:
        part = self.part
        if part is None:
            return []
        items = [part.outward(i) for i in part.job.planner.issue(room, llm_room)]
        part.out += len(items)
        if not items:
            self._next_if_settled()
        return items

    def wanted(self, result: ItemResult) -> bool:
        part = self.part
        assert part is not None  # results come back only while their part runs
        part.out -= 1
        return part.job.planner.wanted(part.inward(result))

    def observe(self, result: ItemResult) -> None:
        part = self.part
        assert part is not None
        part.job.planner.observe(part.inward(result))
        self._next_if_settled()

    def bars(self) -> list[Bar]:
        part = self.part
        if part is None:
            return []
        return [
            Bar(f"{part.label}: {b.name}", b.n, b.total, b.postfix, b.done)
            for b in part.job.planner.bars()
        ]

    # -- parts ----------------------------------------------------------------------------
    def _next_if_settled(self) -> None:
        """The current part is finished and nothing of it is out: close it, start the next."""
        part = self.part
        while part is not None and part.job.planner.finished and part.out == 0:
            stop = part.job.planner.stopped_by
            self.job.close_part(part, stop, None)
            self.stopped_first = self.stopped_first or stop
            if self.job.error_text is not None:
                self.done = True
                return
            cap = self.job.start_from(self.job.started_index + 1)
            if cap is not None:
                self.stopped_first = self.stopped_first or cap
            part = self.part
            if part is None:
                self.done = True


class _MixSink:
    """Each result's rows to its part's sink, counted in its part's ledger as well."""

    def __init__(self, job: MixJob) -> None:
        self.job = job

    @property
    def stop_reason(self) -> str | None:
        part = self.job.current
        return None if part is None else part.job.sink.stop_reason

    def arrived(self, result: ItemResult) -> None:
        part = self.job.current
        if part is None:  # winding down after the last part closed: nothing is out
            return
        inner = part.inward(result)
        part.ledger.arrived(inner)
        part.job.sink.arrived(inner)

    def add(self, row: Row, stream: str) -> Fate | None:
        part = self.job.current
        assert part is not None
        fate = part.job.sink.add(row, stream.split("/", 1)[0])
        if fate is not None and fate != Fate.UNISSUED:
            part.ledger.decided(row, fate)
        return fate


class MixJob:
    """A recipe with ``parts`` as one job of the one driver loop (see the module
    docstring): one pool, one run ledger under the run-wide caps, the parts' amplify
    jobs declared one after the other into their own folders."""

    name = "mix"
    pipeline = "amplify"

    def __init__(
        self, cfg: MixRecipe, out_dir: Path, manifest: Manifest, add_chain: AddChain
    ) -> None:
        self.cfg, self.out_dir, self.manifest = cfg, out_dir, manifest
        self._add_chain = add_chain
        manifest.extra["domain"] = {
            "name": cfg.domain.name,
            "parts": [part_label(p) for p in cfg.parts],
        }
        self.records: dict[str, dict[str, Any]] = {}  # label -> the manifest's parts entry
        self.part_manifests: dict[str, dict[str, Any]] = {}  # label -> a closed part's manifest
        self.carried = Ledger()  # parts an earlier run finished: what they spent
        self.closed: list[Ledger] = []  # the ledgers of the parts this run closed
        self.current: _Part | None = None
        self.started_index = 0
        self.error_text: str | None = None
        self._live = False  # the workers exist: a part's chains are added to them
        # The caps of this run's ledger: the run-wide caps less what the parts an earlier
        # run finished spent (they are reused, not run again, and count all the same).
        self.run_caps = amplify_caps(cfg)
        cap = self.start_from(0)
        self.caps = self.run_caps.left(
            self.carried.cost_usd, self.carried.run_tokens, self.carried.calls
        )
        self.workers = amplify_workers(cfg.part(0))
        self.chains: dict[str, Sequence[StageSpec]] = (
            {} if self.current is None else self.current.chains()
        )
        self.planner = MixPlanner(self)
        self.planner.stopped_first = cap
        self.planner.done = self.current is None
        self.sink = _MixSink(self)
        self._live = True

    @property
    def reserve(self) -> tuple[float, int]:
        return (0.0, 0) if self.current is None else self.current.job.reserve

    def spent(self) -> tuple[float, int, int]:
        """(cost, tokens, calls) of every part so far: reused, closed and running."""
        ledgers = [self.carried, *self.closed]
        if self.current is not None:
            ledgers.append(self.current.ledger)
        cost = sum(x.cost_usd for x in ledgers)
        return cost, sum(x.run_tokens for x in ledgers), sum(x.calls for x in ledgers)

    def start_from(self, index: int) -> str | None:
        """Start the first part from ``index`` that is not finished already (reusing those
        that are), or none; returns the cap that leaves the rest unrun, if one does."""
        from factory.io.runstate import prepare_output

        self.current = None
        for i in range(index, len(self.cfg.parts)):
            self.started_index = i
            part = self.cfg.parts[i]
            label = part_label(part)
            cost, tokens, calls = self.spent()
            cap = cap_reached(self.run_caps, cost, tokens, calls)
            if cap is not None:  # this part and those after it are not run (``finish``)
                return cap
            sub = part_recipe(
                self.cfg, i, self.out_dir, {"cost_usd": cost, "tokens": tokens, "calls": calls}
            )
            part_dir = Path(sub.output.dir)
            # the mixed run's own folder checked the shared cache already
            mode = prepare_output(sub, part_dir, fresh=False, retry_failed=False, other_cache=True)
            if mode == "done":
                done = json.loads((part_dir / "manifest.json").read_text(encoding="utf-8"))
                spent = done.get("tokens") or {}
                self.carried.carry(
                    label,
                    usage=tokens_usage(spent) if spent else None,
                    cost_usd=float(done.get("cost_usd") or 0.0),
                    calls=_calls_of(done),
                )
                self._record(label, part, part_dir, done, None)
                continue
            self.current = _Part(label, sub, part_dir, self._add_chain)
            if self._live:  # a later part: its chains join the workers'
                for name, specs in self.current.chains().items():
                    self._add_chain(name, specs)
            return None
        self.started_index = len(self.cfg.parts)
        return None

    def close_part(self, part: _Part, stopped_by: str | None, run_stop: str | None) -> None:
        manifest, stop = part.finish(stopped_by, run_stop)
        self.closed.append(part.ledger)
        self.current = None
        self._record(part.label, self.cfg.parts[self.started_index], part.dir, manifest, stop)
        self.error_text = self.error_text or manifest.get("error")

    def _record(
        self,
        label: str,
        part: PartConfig,
        part_dir: Path,
        manifest: dict[str, Any],
        stopped_by: str | None,
    ) -> None:
        self.part_manifests[label] = manifest
        self.records[label] = {
            "quota": part.quota,
            "run": True,
            "dir": part_dir.relative_to(self.out_dir).as_posix(),
            "rows": 0,  # counted when the rows are copied (``finish``)
            "totals": manifest.get("totals") or {},
            "stopped_by": stopped_by,
            "cost_usd": manifest.get("cost_usd"),
            "generated_with_devserver": manifest.get("generated_with_devserver"),
        }

    # -- the Job contract -----------------------------------------------------------------
    def running(self, progress: bool) -> contextlib.AbstractContextManager[None]:
        """A batched backend's batches on the console, read from the running part's folder."""

        def folder() -> Path:
            part = self.current
            return self.out_dir if part is None else part.dir

        return batch_progress(self.cfg, folder, progress)

    def finish(self, ledger: Ledger, stopped_by: str | None) -> JobReport:
        """Close the part still open (a stop ended it), copy every part's rows, labelled,
        into ``OUT/data/`` in part order; the run's sections, totals summed over the
        parts (those an earlier run finished included)."""
        part, first = self.current, self.planner.stopped_first
        if part is not None:  # a stop ended the loop while it ran: its reason, not an
            # earlier part's (``drive`` returns the planner's when the loop gave none)
            own = stopped_by if stopped_by not in (None, first) else part.job.planner.stopped_by
            self.close_part(part, own, ledger.stopped_by)
        cfg = self.cfg
        unrun = cap_reached(self.run_caps, *self.spent())
        data = ShardWriter(self.out_dir, shard_rows=cfg.output.shard_rows)
        totals = dict.fromkeys(TOTAL_KEYS, 0)
        stages: dict[str, dict[str, int]] = {}
        parts: dict[str, Any] = {}
        for p in cfg.parts:
            label = part_label(p)
            record = self.records.get(label)
            if record is None:  # after a cap or a failed part
                record = {"quota": p.quota, "run": False, "stopped_by": unrun}
            parts[label] = record
            if not record["run"]:
                continue
            before = data.rows_written
            data.extend(label_rows(_part_rows(self.out_dir / record["dir"]), label))
            data.flush()
            record["rows"] = data.rows_written - before
            part_manifest = self.part_manifests[label]
            for key in TOTAL_KEYS:
                totals[key] += int(record["totals"].get(key, 0))
            for stage, outcomes in (part_manifest.get("stages") or {}).items():
                into = stages.setdefault(stage, {})
                for outcome, n in outcomes.items():
                    into[outcome] = into.get(outcome, 0) + n
            if label in self.carried.spend:  # reused: its reasons are not in this run's ledger
                for stage, codes in (part_manifest.get("reasons") or {}).items():
                    for code, n in codes.items():
                        self.manifest.reason(stage, code, n)
        data.close()
        self.manifest.add_files(data)
        # A tools column unless every part is a text-action domain (no tool list to render).
        write_dataset_info(
            self.out_dir,
            cfg.output.dataset_name,
            tools=any(p.domain.grammar is None for p in cfg.parts),
        )
        run_stop = first or stopped_by
        cost, tokens, spent_calls = self.spent()
        calls = sum(
            int((m.get("calls") or {}).get("issued", 0)) for m in self.part_manifests.values()
        )
        used = [x.usage for x in (self.carried, *self.closed) if x.usage is not None]
        requested = sum(p.quota for p in cfg.parts)
        budget = ledger.budget()
        if budget is not None:  # the run-wide caps, and every part's spend against them
            budget.update(
                max_cost_usd=self.run_caps.max_cost_usd,
                max_tokens=self.run_caps.max_tokens,
                max_calls=self.run_caps.max_calls,
                cost_usd=round(cost, 6),
                tokens=tokens,
                calls=spent_calls,
            )
        sections = {
            "parts": parts,
            "cost_usd": round(cost, 6),
            "tokens": tokens_record(sum(used[1:], used[0])) if used else {},
            "calls": {"issued": calls},
            "budget": budget,
            "target": {
                "requested": requested,
                "reached": totals["accepted"] >= requested,
                "stopped_by": run_stop,
            },
            "generated_with_devserver": any(
                r.get("generated_with_devserver") for r in parts.values()
            ),
        }
        return JobReport(sections, totals=totals, stages=stages)

    def error(self, stopped_by: str | None) -> str | None:
        if self.error_text is not None:
            return self.error_text
        part = self.current
        return None if part is None else part.job.error(stopped_by)
