"""The simulator-data job: sampler -> executor -> step samples -> mixture -> alpaca shards.

Sampling is a stage like any other (``EpisodeStage``, built once per worker with
its world): the driver loop issues episode numbers, each worker turns one into
its checked step samples, and the driver files them in episode order into
``OUT/candidates/``, keeping only ``(id, labels)`` per sample. Episodes stop as
soon as every quota of the mixture has enough candidates (counted after each
episode: ``QuotaFill``), or at ``envsim.max_episodes``. Then the mixture is
selected from the labels alone (deterministic, coverage first, never borrowing
across groups) and the chosen candidates are streamed into LLaMA-Factory alpaca
shards under ``OUT/data/``.

Held-out split (``envsim.heldout``): ``by: task | user`` keeps a seeded share
of the task (user) ids out of the training selection and selects the held-out
rows only from them; ``by: env`` samples the held-out rows on a world of its own
(``heldout.world_seed``). Either way the two selections share no row, task,
user (``task``/``user``) or world (``env``). Held-out rows follow the same
mixture scaled by ``heldout.scale`` and are written to ``OUT/heldout/`` in the
layout of ``OUT/data/``.

Accounting: steps sampled = selected (data/) + not selected (candidates/ only,
the held-out rows among them) + rejected (a step whose invariants failed; rejects/).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from factory.core.diversity import StepDiversity
from factory.core.mixture import Mixture
from factory.core.selection import Selection, held_out, select
from factory.engine.filing import Filing
from factory.engine.ledger import Caps, Ledger
from factory.engine.loop import Bar, Declaration, JobReport, Workers
from factory.engine.rows import Fate, Row, Status, StepRow
from factory.engine.stages.base import Stage
from factory.engine.work import Item, ItemResult
from factory.errors import ConfigError, SeedError
from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info
from factory.recipe import EnvSimConfig, EnvsimRecipe

__all__ = [
    "ALPACA_SCHEMA",
    "CANDIDATE_SCHEMA",
    "EnvsimJob",
    "EpisodeStage",
    "QuotaFill",
    "alpaca_row",
    "episode_rows",
]

CANDIDATE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("message", pa.string()),
        ("labels", pa.string()),
        ("sample", pa.string()),
    ]
)
ALPACA_SCHEMA = pa.schema(
    [
        ("system", pa.string()),  # the simulator's instructions (issue 25)
        ("instruction", pa.string()),
        ("input", pa.string()),
        ("output", pa.string()),
        ("id", pa.string()),
        ("meta", pa.string()),
    ]
)


class EpisodeStage(Stage):
    """Episode number (``call_index``) -> its checked step samples (CPU; no LLM).

    Builds the world once per worker. A step whose invariants fail is a reject row
    (its reason kept); the others are candidates.
    """

    name = "envsim"
    requires = ("call_index",)

    def __init__(self, es: EnvSimConfig, domain: str, world_seed: int | None = None):
        from factory.envsim.sampler import EpisodeSampler

        self.seed = es.seed
        self.domain = domain
        self.sampler = EpisodeSampler(
            self.domain,
            es.world_seed if world_seed is None else world_seed,
            world_sizes=es.world_sizes,
            invalid_share=es.invalid_share,
            violation_share=es.violation_share,
            validate_arguments=es.validate_arguments,
        )

    def process(self, row: dict[str, Any]) -> list[StepRow]:  # type: ignore[override]
        return episode_rows(self.sampler, int(row["call_index"]), self.seed, self.domain)


def episode_rows(sampler: Any, index: int, seed: int, domain: str) -> list[StepRow]:
    """The candidate rows of episode ``index`` (pure given the sampler's world)."""
    from factory.envsim.steps import check_step, decompose
    from factory.errors import FactoryError

    rows: list[StepRow] = []
    traj = sampler.episode(index, seed=seed)
    for sample in decompose(traj, sampler.fresh_env(), env_id=sampler.env_id):
        row: StepRow = {
            "id": sample.id,
            "status": Status.OK,
            "reason": None,
            "message": None,
            # the tool rides along for selection (tool balance), not in the sample
            "labels": json.dumps({**sample.labels, "tool": sample.tool}),
            "sample": None,
        }
        try:
            check_step(sample, domain=domain)
        except FactoryError as exc:
            row["status"], row["reason"] = Status.REJECTED, exc.reason
            row["message"] = str(exc)[:500]
        row["sample"] = json.dumps(sample.to_dict(), ensure_ascii=False)
        rows.append(row)
    return rows


def build_episode_stage(
    es: EnvSimConfig, domain: str, world_seed: int | None = None
) -> EpisodeStage:
    """Inside an actor: the episode stage (the ``envsim`` section and the domain's name,
    not the recipe)."""
    return EpisodeStage(es, domain, world_seed)


class QuotaFill:
    """How much of a mixture the candidates of one side could fill, counted as they come.

    Each candidate counts for the first quota it matches; with ``max_per_tool`` a
    tool's candidates beyond the cap do not count (the selection would pass them
    over); ``balanced`` says whether every tool has ``min_per_tool`` candidates.
    """

    def __init__(self, mixture: Mixture, tools: list[str]) -> None:
        self.mixture = mixture
        self.tools = tools
        self.available: Counter[str] = Counter()
        self.per_tool: Counter[Any] = Counter()

    def add(self, labels: dict[str, Any]) -> None:
        tool = labels.get("tool")
        cap = self.mixture.max_per_tool
        if cap is not None and isinstance(tool, str) and self.per_tool[tool] >= cap:
            return
        self.per_tool[tool] += 1
        for q in self.mixture.quotas:
            if q.matches(labels):
                self.available[q.name] += 1
                break

    @property
    def rows(self) -> int:
        return sum(min(self.available[q.name], q.count) for q in self.mixture.quotas)

    @property
    def balanced(self) -> bool:
        need = self.mixture.min_per_tool
        return not need or all(self.per_tool[t] >= need for t in self.tools)

    @property
    def met(self) -> bool:
        return self.rows >= self.mixture.total and self.balanced


def alpaca_row(cfg: EnvsimRecipe, sample: dict[str, Any], tools: dict) -> dict[str, str]:
    """One selected step sample as the alpaca row ``data/`` holds (layout of ``envsim.layout``).

    The domain's simulator facts for the tool (the current time, the rule for new
    ids) are in the instruction, so every value of the output is derivable from
    the row's instruction and input.
    """
    from factory.envs.registry import get_plugin
    from factory.envsim.envsimbench import to_sft_row
    from factory.envsim.simulator import to_alpaca
    from factory.envsim.steps import tool_source

    facts_of = get_plugin(cfg.domain.name).simulator_facts
    facts = facts_of(sample["tool"]) if facts_of is not None else None
    if cfg.envsim.layout == "envsimbench":  # the environment code is always shown there
        env_code = tool_source(cfg.domain.name, sample["tool"]) or ""
        # EnvSimBench's rows as they are: its instruction holds the whole prompt
        row = {"system": "", **to_sft_row(sample, env_code=env_code, facts=facts)}
    else:
        code = tool_source(cfg.domain.name, sample["tool"]) if cfg.envsim.with_code else None
        row = to_alpaca(sample, tool_spec=tools[sample["tool"]], code=code, facts=facts)
    meta = {
        "labels": sample["labels"],
        "env_id": sample["env_id"],
        "step": sample["step"],
        "tool": sample["tool"],  # tool coverage in the run report
    }
    return {**row, "id": sample["id"], "meta": json.dumps(meta)}


_PROVENANCE = ("task_id", "user_id", "env_id")


def _alpaca_rows(
    cfg: EnvsimRecipe, selection: Selection, out_dir: Path, tools: dict, stats: StepDiversity
) -> Any:
    """Stream the chosen candidates (in selection order) as alpaca rows, counting each
    in ``stats`` (the manifest's ``diversity``).

    Two episodes can make the same step (same id: the id hashes the call and the
    state, not the episode); the copy written is the one whose provenance the
    selection chose, so a row's task and user are those the split decided on.
    """
    chosen = {e["id"]: (i, e["labels"]) for i, e in enumerate(selection.selected)}
    picked: list[tuple[int, dict[str, Any]]] = []
    for path in sorted((out_dir / "candidates").glob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(columns=["id", "sample"], batch_size=2048):
            for sid, text in zip(
                batch.column("id").to_pylist(), batch.column("sample").to_pylist(), strict=True
            ):
                if sid not in chosen:
                    continue
                rank, labels = chosen[sid]
                sample = json.loads(text)
                if all(sample["labels"].get(k) == labels.get(k) for k in _PROVENANCE):
                    del chosen[sid]
                    picked.append((rank, sample))
    picked.sort(key=lambda p: p[0])
    for _, sample in picked:
        row = alpaca_row(cfg, sample, tools)
        stats.add(
            sample, chars=sum(len(row[k]) for k in ("system", "instruction", "input", "output"))
        )
        yield row


class EnvsimPlanner:
    """Episodes world by world (the training world, then a held-out one when the split is
    ``by: env``) until each side's mixture can be filled, or ``max_episodes``."""

    def __init__(
        self,
        worlds: list[tuple[str, list[tuple[QuotaFill, bool]]]],
        *,
        max_episodes: int,
        sink: EnvsimSink,
    ) -> None:
        self.worlds = worlds  # (chain name, [(fill, held-out side)])
        self.max_episodes = max_episodes
        self.sink = sink
        self.world = 0
        self.issued = 0  # on the current world
        self.used = 0
        self.episodes = 0  # over all worlds
        self.total_rows = sum(f.mixture.total for _, fills in worlds for f, _ in fills)
        self.done_rows = 0

    @property
    def finished(self) -> bool:
        return self.world >= len(self.worlds)

    @property
    def stopped_by(self) -> str | None:
        return None

    def _fills(self) -> list[tuple[QuotaFill, bool]]:
        return self.worlds[self.world][1]

    def issue(self, room: int, llm_room: int) -> list[Item]:
        if self.finished:
            return []
        chain = self.worlds[self.world][0]
        n = min(room, self.max_episodes - self.issued)
        items = [
            Item(chain, k, chain, {"call_index": k}) for k in range(self.issued, self.issued + n)
        ]
        self.issued += len(items)
        return items

    def wanted(self, result: ItemResult) -> bool:
        """Only the current world's episodes up to the one that met its quotas count:
        the candidates are then the same whatever ran ahead (a reproducible mixture)."""
        return not self.finished and result.stream == self.worlds[self.world][0]

    def observe(self, result: ItemResult) -> None:
        self.used += 1
        self.episodes += 1
        fills = self._fills()
        if all(fill.met for fill, _ in fills) or self.used >= self.max_episodes:
            self.done_rows += sum(f.mixture.total for f, _ in fills)
            self.world += 1
            self.issued = self.used = 0
            if not self.finished:
                self.sink.world_held = self.worlds[self.world][0] == HELDOUT_CHAIN

    def bars(self) -> list[Bar]:
        now = self.done_rows
        if not self.finished:
            now += sum(fill.rows for fill, _ in self._fills())
        return [
            Bar(
                "candidates for the mixture",
                now,
                self.total_rows,
                {"episodes": self.episodes, "steps": self.sink.total},
            )
        ]


TRAIN_CHAIN, HELDOUT_CHAIN = "episodes", "heldout-world"


class EnvsimSink:
    """Step rows in episode order: candidates to ``candidates/``, rejects to ``rejects/``;
    keeps ``(id, labels, side)`` for the selection and feeds the quota counters."""

    def __init__(
        self,
        cfg: EnvsimRecipe,
        out_dir: Path,
        manifest: Manifest,
        fills: dict[bool, QuotaFill],
    ) -> None:
        self.manifest = manifest
        self.heldout = cfg.envsim.heldout
        self.by_id = self.heldout is not None and self.heldout.by != "env"
        self.candidates = ShardWriter(
            out_dir, subdir="candidates", schema=CANDIDATE_SCHEMA, shard_rows=cfg.output.shard_rows
        )
        # a step row that is not ok (failed included) is a reject of the envsim stage
        self.filing: Filing[StepRow] = Filing(RejectWriter(out_dir))
        self.keys: list[dict[str, Any]] = []  # payloads stay on disk
        self.fills = fills
        # Step ids each side has counted: two episodes can make the same step (the id
        # hashes the call and the state), and the selection takes each id once.
        self.seen: dict[bool, set[str]] = {False: set(), True: set()}
        self.world_held = False  # the current world is the held-out one (split by env)

    @property
    def counts(self) -> Counter[Fate]:
        return self.filing.counts

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def stop_reason(self) -> str | None:
        return None

    def arrived(self, result: ItemResult) -> None:
        return None

    def add(self, row: Row, stream: str = "") -> Fate:
        step: StepRow = {  # CANDIDATE_SCHEMA's columns, in its order
            "id": row["id"],
            "status": row["status"],
            "reason": row.get("reason"),
            "message": row.get("message"),
            "labels": row.get("labels"),
            "sample": row.get("sample"),
        }
        return self.filing.file(step, self._keep)

    def _keep(self, row: StepRow) -> Fate:
        """A candidate: to ``candidates/``, its labels to the selection and the quotas."""
        self.candidates.add(dict(row))
        sid = row["id"] or ""  # a kept step has its id (``episode_rows``)
        labels = json.loads(row["labels"] or "{}")
        ho = self.heldout
        side = self.world_held or bool(
            self.by_id
            and ho is not None
            and held_out(labels, by=ho.by, share=ho.share, seed=ho.seed)
        )
        self.keys.append({"id": sid, "labels": labels, "heldout": side})
        fill = self.fills.get(side)
        held_twice = side and sid in self.seen[False]  # the selection drops it too
        if fill is not None and sid not in self.seen[side] and not held_twice:
            self.seen[side].add(sid)
            fill.add(labels)
        return Fate.ACCEPTED


class EnvsimJob(Declaration):
    """The simulator-data job of ``cfg`` writing into ``out_dir`` (module docstring;
    ``loop.Job``: no LLM, no caps, a few CPU items per worker)."""

    pipeline = "envsim"
    caps = Caps()
    workers = Workers()

    def __init__(self, cfg: EnvsimRecipe, out_dir: Path, manifest: Manifest) -> None:
        from factory.envs.pack import load_domain
        from factory.envs.registry import get_plugin

        for part in ("environment", "sampler", "slicing"):  # fail here, not in a worker
            get_plugin(cfg.domain.name, needs=part)
        self.cfg, self.out_dir, self.manifest = cfg, out_dir, manifest
        es = cfg.envsim
        self.mixture = Mixture.load(Path(cfg.mixture.path))
        self.tools = {t["name"]: t for t in load_domain(cfg.domain).public_tools()}
        ho = es.heldout
        self.held_mix = (
            self.mixture.scaled(ho.scale, f"{self.mixture.name}-heldout")
            if ho is not None
            else None
        )
        by_id = ho is not None and ho.by != "env"
        self.heldout_world: int | None = None
        if ho is not None and ho.by == "env":
            self.heldout_world = es.world_seed + 1 if ho.world_seed is None else ho.world_seed
            if self.heldout_world == es.world_seed:
                raise ConfigError(
                    "the held-out world must differ from envsim.world_seed",
                    key_path="envsim.heldout.world_seed",
                )
        names = sorted(self.tools)
        fills = {False: QuotaFill(self.mixture, names)}
        if self.held_mix is not None:
            fills[True] = QuotaFill(self.held_mix, names)
        train = [(fills[False], False)] + ([(fills[True], True)] if by_id else [])
        worlds: list[tuple[str, list[tuple[QuotaFill, bool]]]] = [(TRAIN_CHAIN, train)]
        chains: dict[str, list[Any]] = {
            TRAIN_CHAIN: [(build_episode_stage, (es, cfg.domain.name, None))]
        }
        if self.heldout_world is not None:
            worlds.append((HELDOUT_CHAIN, [(fills[True], True)]))
            chains[HELDOUT_CHAIN] = [
                (build_episode_stage, (es, cfg.domain.name, self.heldout_world))
            ]
        self.steps = EnvsimSink(cfg, out_dir, manifest, fills)
        self.envsim_planner = EnvsimPlanner(worlds, max_episodes=es.max_episodes, sink=self.steps)
        super().__init__(name="envsim", chains=chains, planner=self.envsim_planner, sink=self.steps)

    def running(self, progress: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def error(self, stopped_by: str | None) -> str | None:
        return None

    def finish(self, ledger: Ledger, stopped_by: str | None) -> JobReport:
        """Select the mixture (and the held-out one), write the alpaca shards; the job's
        manifest sections, its totals (steps = selected + not + rejected) and stages, and
        the selection's report."""
        cfg, out_dir, manifest, sink = self.cfg, self.out_dir, self.manifest, self.steps
        mx, ho = cfg.mixture, cfg.envsim.heldout
        sink.candidates.close()
        (rejects,) = sink.filing.close()
        keys = sink.keys
        exclusions: dict[str, Any] = {
            "exclude_task_ids": mx.exclude_task_ids,
            "exclude_user_ids": mx.exclude_user_ids,
            "tools": sorted(self.tools),  # tool balance (min_per_tool) covers every tool
        }
        selection: Selection = select(
            (k for k in keys if not k["heldout"]), self.mixture, seed=mx.seed, **exclusions
        )
        held_selection: Selection | None = None
        if self.held_mix is not None and ho is not None:
            # a step identical to a training-side step (another episode made it) is not held out
            train_ids = {k["id"] for k in keys if not k["heldout"]}
            held_selection = select(
                (k for k in keys if k["heldout"] and k["id"] not in train_ids),
                self.held_mix,
                seed=ho.seed,
                **exclusions,
            )
        # the tasks (episodes) each side could draw from: the yield's denominator
        tasks = {
            side: sorted(
                {
                    str(k["labels"].get("task_id"))
                    for k in keys
                    if k["heldout"] is side and k["labels"].get("task_id")
                }
            )
            for side in (False, True)
        }
        sink.keys = []
        diversity = StepDiversity()
        data = ShardWriter(out_dir, schema=ALPACA_SCHEMA, shard_rows=cfg.output.shard_rows)
        data.extend(_alpaca_rows(cfg, selection, out_dir, self.tools, diversity))
        data.close()
        writers: list[Any] = [data, sink.candidates, rejects]
        splits: dict[str, str] = {}
        extras: dict[str, Any] = {}
        if held_selection is not None and ho is not None:
            held = ShardWriter(
                out_dir, subdir="heldout", schema=ALPACA_SCHEMA, shard_rows=cfg.output.shard_rows
            )
            held_diversity = StepDiversity()
            held.extend(_alpaca_rows(cfg, held_selection, out_dir, self.tools, held_diversity))
            held.close()
            writers.append(held)
            splits[f"{cfg.output.dataset_name}_heldout"] = "heldout"
            extras["heldout"] = {
                "by": ho.by,
                "rows": held.rows_written,
                "world_seed": self.heldout_world,
                "mixture": held_selection.summary(),
                "diversity": held_diversity.summary(tasks[True]),
            }
        write_dataset_info(out_dir, cfg.output.dataset_name, formatting="alpaca", splits=splits)
        for writer in writers:
            manifest.add_files(writer)
        groups = Counter(
            s.get("labels", {}).get("group") for s in selection.selected if isinstance(s, dict)
        )
        selected = data.rows_written
        rejected = sink.counts[Fate.REJECTED]
        surplus = sink.total - rejected - selected
        totals = {
            "total": sink.total,
            "accepted": selected,
            "surplus": surplus,
            "rejected": rejected,
            "failed": 0,
        }
        stages = {"envsim": {"accepted": selected, "rejected": rejected, "surplus": surplus}}
        if selection.shortfall and not mx.allow_shortfall:
            raise SeedError(
                "shortfall",
                f"mixture quotas not met: {selection.shortfall} "
                f"(after {self.envsim_planner.episodes} episodes; raise envsim.max_episodes)",
            )
        sections = {
            **extras,
            "episodes": self.envsim_planner.episodes,
            "mixture": {**selection.summary(), "groups": dict(groups)},
            "diversity": diversity.summary(tasks[False]),
        }
        return JobReport(sections, totals=totals, stages=stages, report=selection.report())
