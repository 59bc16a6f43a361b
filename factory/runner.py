"""Run a loaded recipe end to end and report what happened.

One function per pipeline kind; each builds its Ray Data pipeline
(``factory.pipeline``), streams the final rows to a ``Collector`` and returns a
``RunResult`` whose totals satisfy accepted + surplus + rejected + failed =
total rows (seeds for ``curate``; calls for ``amplify``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from factory.collect import Collector
from factory.config import RecipeConfig, config_hash
from factory.errors import EXIT_BUDGET, EXIT_OK
from factory.writer import Manifest

__all__ = ["RunResult", "run"]

STAGE_ORDER = (
    "read",
    "parse",
    "seed_check",
    "validate",
    "prefilter",
    "amplify",
    "postprocess",
    "export",
    "dedup",
)


@dataclass
class RunResult:
    out_dir: Path
    totals: dict[str, int]
    manifest: dict[str, Any]
    stopped_by: str | None = None  # the cap that stopped issuing calls, if any
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_BUDGET if self.stopped_by else EXIT_OK

    def summary(self) -> str:
        t = self.totals
        lines = [
            f"output: {self.out_dir}",
            f"rows: {t.get('total', 0)} total = {t.get('accepted', 0)} accepted"
            f" + {t.get('surplus', 0)} surplus + {t.get('rejected', 0)} rejected"
            f" + {t.get('failed', 0)} failed",
        ]
        decided = self.manifest.get("stages", {})
        if decided:
            lines.append(f"{'deciding stage':<16}{'accepted':>10}{'rejected':>10}{'failed':>8}")
            order = {s: i for i, s in enumerate(STAGE_ORDER)}
            for stage in sorted(decided, key=lambda s: order.get(s, 99)):
                c = decided[stage]
                lines.append(
                    f"{stage:<16}{c.get('accepted', 0):>10}{c.get('rejected', 0):>10}"
                    f"{c.get('failed', 0):>8}"
                )
        reasons = self.manifest.get("reasons", {})
        for stage, codes in reasons.items():
            for code, n in sorted(codes.items(), key=lambda kv: -kv[1]):
                lines.append(f"  {stage}: {code} x{n}")
        tokens = self.manifest.get("tokens") or {}
        if tokens:
            lines.append(
                f"tokens: prompt {tokens.get('prompt_tokens', 0):,} (cached "
                f"{tokens.get('cached_tokens', 0):,}), completion "
                f"{tokens.get('completion_tokens', 0):,}; cost "
                f"{self.manifest.get('cost_usd', 0):.4f} USD"
            )
        if self.extra.get("report"):
            lines.append(self.extra["report"])
        lines.append(f"wall time: {self.wall_s:.1f}s")
        if self.stopped_by:
            lines.append(f"stopped by cap: {self.stopped_by} (raise it and run again to continue)")
        return "\n".join(lines)


def _progress(enabled: bool, total: int | None, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, disable=not enabled, unit="row", dynamic_ncols=True)


def run_curate(cfg: RecipeConfig, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Validate and convert seeds into a LLaMA-Factory dataset (no LLM)."""
    from factory.pipeline import curate_dataset, iter_rows
    from factory.raycompat import init_ray

    started = time.time()
    init_ray(cfg.ray.address)
    manifest = Manifest(recipe=cfg.name, config_hash=config_hash(cfg))
    collector = Collector(
        out_dir, manifest, dataset_name=cfg.output.dataset_name, shard_rows=cfg.output.shard_rows
    )
    with _progress(progress, None, "seeds") as bar:
        for row in iter_rows(curate_dataset(cfg)):
            collector.add(row)
            bar.update(1)
            bar.set_postfix(accepted=collector.accepted, refresh=False)
    totals = collector.close(pipeline="curate")
    manifest_dict = manifest.to_dict(**totals)
    return RunResult(out_dir, totals, manifest_dict, wall_s=time.time() - started)


def run(
    cfg: RecipeConfig,
    out_dir: Path,
    *,
    progress: bool = True,
    fresh: bool = False,
    retry_failed: bool = False,
) -> RunResult:
    """Run ``cfg`` writing into ``out_dir``: a new run, or the resumption of the run the
    folder holds (see ``factory.runstate``)."""
    from factory.runstate import finish_run, prepare_output

    out_dir = Path(out_dir).resolve()
    cfg.output.dir = str(out_dir)  # actors find the output (and its cache) through the recipe
    mode = prepare_output(cfg, out_dir, fresh=fresh, retry_failed=retry_failed)
    if mode == "done":
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
        result = RunResult(out_dir, manifest.get("totals", {}), manifest)
        result.extra["report"] = "already complete (use --retry-failed to retry failed calls)"
        return result
    if cfg.pipeline == "curate":
        result = run_curate(cfg, out_dir, progress=progress)
    elif cfg.pipeline == "envsim":
        from factory.envsim_run import run_envsim

        result = run_envsim(cfg, out_dir, progress=progress)
    else:
        from factory.amplify_run import run_amplify

        result = run_amplify(cfg, out_dir, progress=progress)
    result.extra["mode"] = mode
    finish_run(cfg, out_dir, stopped_by=result.stopped_by)
    return result
