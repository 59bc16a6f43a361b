"""The simulator-data job: sampler -> executor -> step samples -> mixture -> alpaca shards.

Phase 1 samples episodes on the executable world in rounds (Ray actors, each
building the world once) and streams every checked step sample to
``OUT/candidates/`` while the driver keeps only ``(id, labels)`` per sample.
Rounds stop as soon as every quota of the mixture has enough candidates, or at
``envsim.max_episodes``. Phase 2 selects the mixture from the labels alone
(deterministic, coverage first, never borrowing across groups) and streams the
chosen candidates into LLaMA-Factory alpaca shards under ``OUT/data/``.

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

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from factory.config import RecipeConfig
from factory.core.diversity import StepDiversity
from factory.core.mixture import Mixture
from factory.core.selection import Selection, held_out, select
from factory.engine.result import RunResult, _progress, new_manifest
from factory.errors import ConfigError, SeedError
from factory.io.writer import RejectWriter, ShardWriter, write_dataset_info

__all__ = ["ALPACA_SCHEMA", "CANDIDATE_SCHEMA", "alpaca_row", "run_envsim"]

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


class EpisodeStepsUDF:
    """Ray actor: builds the world once; turns episode numbers into checked step rows."""

    def __init__(self, cfg: RecipeConfig, start: int, world_seed: int | None = None):
        from factory.envsim.sampler import EpisodeSampler

        assert cfg.envsim is not None
        es = cfg.envsim
        self.seed, self.start = es.seed, start
        self.domain = cfg.domain.name
        self.sampler = EpisodeSampler(
            self.domain,
            es.world_seed if world_seed is None else world_seed,
            world_sizes=es.world_sizes,
            invalid_share=es.invalid_share,
            violation_share=es.violation_share,
            validate_arguments=es.validate_arguments,
        )

    def __call__(self, batch: pa.Table) -> pa.Table:
        from factory.envsim.steps import check_step, decompose
        from factory.errors import FactoryError

        rows: list[dict[str, Any]] = []
        for offset in batch.column("id").to_pylist():
            index = self.start + int(offset)
            traj = self.sampler.episode(index, seed=self.seed)
            for sample in decompose(traj, self.sampler.fresh_env(), env_id=self.sampler.env_id):
                row = {
                    "id": sample.id,
                    "status": "ok",
                    "reason": None,
                    "message": None,
                    # the tool rides along for selection (tool balance), not in the sample
                    "labels": json.dumps({**sample.labels, "tool": sample.tool}),
                    "sample": None,
                }
                try:
                    check_step(sample, domain=self.domain)
                except FactoryError as exc:
                    row.update(status="rejected", reason=exc.reason, message=str(exc)[:500])
                row["sample"] = json.dumps(sample.to_dict(), ensure_ascii=False)
                rows.append(row)
        return pa.Table.from_pylist(rows, schema=CANDIDATE_SCHEMA)


def _episode_round(cfg: RecipeConfig, start: int, n: int, world_seed: int | None = None) -> Any:
    import ray.data

    blocks = max(1, min(n // 50, 64))
    return ray.data.range(n, override_num_blocks=blocks).map_batches(
        EpisodeStepsUDF,
        fn_constructor_args=(cfg, start, world_seed),
        batch_format="pyarrow",
        batch_size=50,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=cfg.ray.actors),
        num_cpus=cfg.ray.num_cpus,
    )


def _available(mixture: Mixture, labels: list[dict[str, Any]]) -> dict[str, int]:
    """Candidates per quota, each sample counted for the first quota it matches."""
    counts: Counter[str] = Counter()
    for lab in labels:
        for q in mixture.quotas:
            if q.matches(lab):
                counts[q.name] += 1
                break
    return dict(counts)


def _met(
    mixture: Mixture, keys: list[dict[str, Any]], heldout: bool, tools: list[str]
) -> tuple[int, bool]:
    """Rows of ``mixture`` one side of the split could fill now, and whether every tool
    has ``mixture.min_per_tool`` candidates there (tool balance). With ``max_per_tool``
    a tool's candidates beyond the cap do not count: the selection would pass them over."""
    labels = [k["labels"] for k in keys if k["heldout"] is heldout]
    if mixture.max_per_tool is not None:
        seen: Counter[Any] = Counter()
        kept = []
        for lab in labels:
            tool = lab.get("tool")
            if isinstance(tool, str):
                if seen[tool] >= mixture.max_per_tool:
                    continue
                seen[tool] += 1
            kept.append(lab)
        labels = kept
    available = _available(mixture, labels)
    rows = sum(min(available.get(q.name, 0), q.count) for q in mixture.quotas)
    if not mixture.min_per_tool:
        return rows, True
    calls = Counter(lab.get("tool") for lab in labels)
    return rows, all(calls[t] >= mixture.min_per_tool for t in tools)


def alpaca_row(cfg: RecipeConfig, sample: dict[str, Any], tools: dict) -> dict[str, str]:
    """One selected step sample as the alpaca row ``data/`` holds (layout of ``envsim.layout``).

    The domain's simulator facts for the tool (the current time, the rule for new
    ids) are in the instruction, so every value of the output is derivable from
    the row's instruction and input.
    """
    from factory.envs.registry import get_plugin
    from factory.envsim.envsimbench import to_sft_row
    from factory.envsim.simulator import to_alpaca
    from factory.envsim.steps import tool_source

    assert cfg.envsim is not None
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
    cfg: RecipeConfig, selection: Selection, out_dir: Path, tools: dict, stats: StepDiversity
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


def run_envsim(cfg: RecipeConfig, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Run an ``envsim`` recipe into ``out_dir``."""
    from factory.engine.pipeline import iter_rows
    from factory.engine.raycompat import init_ray
    from factory.envs.pack import load_domain
    from factory.envs.registry import get_plugin

    assert cfg.envsim is not None and cfg.mixture is not None
    for part in ("environment", "sampler", "slicing"):  # fail here, not inside a Ray actor
        get_plugin(cfg.domain.name, needs=part)
    es, mx = cfg.envsim, cfg.mixture
    mixture = Mixture.load(cfg.resolve(mx.path))
    tools = {t["name"]: t for t in load_domain(cfg).public_tools()}
    init_ray(cfg.ray.address)
    manifest = new_manifest(cfg)
    candidates = ShardWriter(
        out_dir, subdir="candidates", schema=CANDIDATE_SCHEMA, shard_rows=cfg.output.shard_rows
    )
    rejects = RejectWriter(out_dir)
    keys: list[dict[str, Any]] = []  # (id, labels, side of the split) only: payloads on disk
    counts: Counter[str] = Counter()
    ho = es.heldout
    held_mix = mixture.scaled(ho.scale, f"{mixture.name}-heldout") if ho is not None else None
    by_id = ho is not None and ho.by != "env"
    heldout_world = None
    if ho is not None and ho.by == "env":
        heldout_world = es.world_seed + 1 if ho.world_seed is None else ho.world_seed
        if heldout_world == es.world_seed:
            raise ConfigError(
                "the held-out world must differ from envsim.world_seed",
                key_path="envsim.heldout.world_seed",
            )
    # (world seed, mixtures to meet on it as (mixture, held-out side)); the held-out world last
    worlds: list[tuple[int, list[tuple[Mixture, bool]]]] = [
        (es.world_seed, [(mixture, False)] + ([(held_mix, True)] if by_id and held_mix else []))
    ]
    if heldout_world is not None and held_mix is not None:
        worlds.append((heldout_world, [(held_mix, True)]))
    total = mixture.total + (held_mix.total if held_mix is not None else 0)
    episodes = 0
    with _progress(progress, total, "candidates for the mixture") as bar:
        done = 0
        for world_seed, wanted in worlds:
            on_world = 0
            held_world = world_seed == heldout_world
            while on_world < es.max_episodes:
                n = min(es.episodes_per_round, es.max_episodes - on_world)
                seed_arg = None if world_seed == es.world_seed else world_seed
                for row in iter_rows(_episode_round(cfg, on_world, n, seed_arg), batch_size=1024):
                    counts["total"] += 1
                    if row["status"] != "ok":
                        counts["rejected"] += 1
                        manifest.reason("envsim", row["reason"])
                        rejects.add({k: v for k, v in row.items() if v is not None})
                        continue
                    candidates.add(row)
                    labels = json.loads(row["labels"])
                    side = held_world or (
                        by_id
                        and ho is not None
                        and held_out(labels, by=ho.by, share=ho.share, seed=ho.seed)
                    )
                    keys.append({"id": row["id"], "labels": labels, "heldout": side})
                on_world += n
                met = [_met(mix, keys, side, sorted(tools)) for mix, side in wanted]
                bar.n = done + sum(rows for rows, _ in met)
                bar.refresh()
                if all(
                    rows >= mix.total and balanced
                    for (rows, balanced), (mix, _) in zip(met, wanted, strict=True)
                ):
                    break
            done += sum(mix.total for mix, _ in wanted)
            episodes += on_world
    candidates.close()
    rejects.close()
    exclusions: dict[str, Any] = {
        "exclude_task_ids": mx.exclude_task_ids,
        "exclude_user_ids": mx.exclude_user_ids,
        "tools": sorted(tools),  # tool balance (min_per_tool) covers every tool of the domain
    }
    selection: Selection = select(
        (k for k in keys if not k["heldout"]), mixture, seed=mx.seed, **exclusions
    )
    held_selection: Selection | None = None
    if held_mix is not None and ho is not None:
        # a step identical to a training-side step (another episode made it too) is not held out
        train_ids = {k["id"] for k in keys if not k["heldout"]}
        held_selection = select(
            (k for k in keys if k["heldout"] and k["id"] not in train_ids),
            held_mix,
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
    del keys
    diversity = StepDiversity()
    data = ShardWriter(out_dir, schema=ALPACA_SCHEMA, shard_rows=cfg.output.shard_rows)
    data.extend(_alpaca_rows(cfg, selection, out_dir, tools, diversity))
    data.close()
    writers: list[Any] = [data, candidates, rejects]
    splits: dict[str, str] = {}
    if held_selection is not None:
        held = ShardWriter(
            out_dir, subdir="heldout", schema=ALPACA_SCHEMA, shard_rows=cfg.output.shard_rows
        )
        held_diversity = StepDiversity()
        held.extend(_alpaca_rows(cfg, held_selection, out_dir, tools, held_diversity))
        held.close()
        writers.append(held)
        splits[f"{cfg.output.dataset_name}_heldout"] = "heldout"
        assert ho is not None
        manifest.extra["heldout"] = {
            "by": ho.by,
            "rows": held.rows_written,
            "world_seed": heldout_world,
            "mixture": held_selection.summary(),
            "diversity": held_diversity.summary(tasks[True]),
        }
    write_dataset_info(out_dir, cfg.output.dataset_name, formatting="alpaca", splits=splits)
    groups = Counter(
        s.get("labels", {}).get("group") for s in selection.selected if isinstance(s, dict)
    )
    selected = data.rows_written
    totals = {
        "total": counts["total"],
        "accepted": selected,
        "surplus": counts["total"] - counts["rejected"] - selected,
        "rejected": counts["rejected"],
        "failed": 0,
    }
    manifest.stages = {
        "envsim": {
            "accepted": selected,
            "rejected": counts["rejected"],
            "surplus": totals["surplus"],
        }
    }
    manifest.extra.update(
        pipeline="envsim",
        episodes=episodes,
        mixture={**selection.summary(), "groups": dict(groups)},
        diversity=diversity.summary(tasks[False]),
    )
    for writer in writers:
        manifest.files.update(writer.files)
    manifest.write(out_dir, **totals)
    manifest_dict = manifest.to_dict(**totals)
    result = RunResult(out_dir, totals, manifest_dict, wall_s=manifest_dict["wall_time_s"])
    result.extra["report"] = selection.report()
    if selection.shortfall and not mx.allow_shortfall:
        raise SeedError(
            "shortfall",
            f"mixture quotas not met: {selection.shortfall} "
            f"(after {episodes} episodes; raise envsim.max_episodes)",
        )
    return result
