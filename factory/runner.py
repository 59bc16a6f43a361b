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

from factory.collect import Collector
from factory.config import RecipeConfig, config_hash
from factory.console import ProgressBar, console, quiet_ray, run_clock, start_run_clock
from factory.errors import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_OK, EXIT_WRITE, OutputWriteError
from factory.writer import Manifest, atomic_write_text

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
CAPS = ("max_calls", "max_cost_usd", "max_tokens")


@dataclass
class RunResult:
    out_dir: Path
    totals: dict[str, int]
    manifest: dict[str, Any]
    # Why the run ended short of its target: a cap (``max_cost_usd`` ...), ``no_progress``
    # (a round accepted nothing) or ``cache_write`` (the cache refused a response).
    stopped_by: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a write failure that stopped the run (path and OS error)

    @property
    def exit_code(self) -> int:
        """0 only when the run did what was asked (README, "Exit codes")."""
        if self.error is not None:
            return EXIT_WRITE
        if self.stopped_by in CAPS:
            return EXIT_BUDGET
        return EXIT_INCOMPLETE if self.stopped_by else EXIT_OK

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
        retries = self.manifest.get("retries") or {}
        if retries:  # summarised here; one line per retry only at DEBUG
            by_count = sorted(retries.items(), key=lambda kv: -kv[1])
            lines.append("retries: " + ", ".join(f"{code} x{n}" for code, n in by_count))
        if self.extra.get("report"):
            lines.append(self.extra["report"])
        since = self.manifest.get("wall_time_from")
        lines.append(f"wall time: {self.wall_s:.1f}s" + (f" (since {since})" if since else ""))
        if self.stopped_by in CAPS:
            lines.append(f"stopped by cap: {self.stopped_by} (raise it and run again to continue)")
        elif self.stopped_by:
            lines.append(
                f"stopped before the target: {self.stopped_by} "
                "(run the same command again to continue)"
            )
        return "\n".join(lines)


def _progress(enabled: bool, total: int | None, desc: str) -> ProgressBar:
    return ProgressBar(total=total, desc=desc, disable=not enabled, unit="row", dynamic_ncols=True)


def new_manifest(cfg: RecipeConfig) -> Manifest:
    """The run's manifest, timed by the run's clock (``factory.console.run_clock``)."""
    started, since = run_clock()
    return Manifest(
        recipe=cfg.name, config_hash=config_hash(cfg), started=started, wall_time_from=since
    )


def run_curate(cfg: RecipeConfig, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Validate and convert seeds into a LLaMA-Factory dataset (no LLM)."""
    from factory.pipeline import curate_dataset, iter_rows
    from factory.raycompat import init_ray

    init_ray(cfg.ray.address)
    manifest = new_manifest(cfg)
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
    return RunResult(out_dir, totals, manifest_dict, wall_s=manifest_dict["wall_time_s"])


def _final_wall_time(out_dir: Path, result: RunResult) -> None:
    """Count the wall time up to now, Ray shut down, in the summary and in manifest.json
    alike: what is left after this (exit) is what a person timing the command adds."""
    started, _ = run_clock()
    wall = round(time.time() - started, 3)
    result.wall_s = result.manifest["wall_time_s"] = wall
    path = out_dir / "manifest.json"
    if path.is_file():
        manifest = json.loads(path.read_text(encoding="utf-8"))
        manifest["wall_time_s"] = wall
        atomic_write_text(path, json.dumps(manifest, indent=2, default=str) + "\n", out_dir)


def run(
    cfg: RecipeConfig,
    out_dir: Path,
    *,
    progress: bool = True,
    fresh: bool = False,
    retry_failed: bool = False,
    drop_cache: bool = False,
    started: tuple[float, str] | None = None,
) -> RunResult:
    """Run ``cfg`` writing into ``out_dir``: a new run, or the resumption of the run the
    folder holds (see ``factory.runstate``).

    ``started``: ``(epoch seconds, what it is)`` the wall time counts from; default
    this call. The CLI passes its process start, so the printed wall time, the
    manifest's and a person timing the command agree.

    Raises:
        ConfigError: a cost cap over an unpriced model, a folder of another recipe ...
        OutputLocked: another run holds ``out_dir`` (nothing was touched).
        OutputWriteError: a file could not be written (names the path).
    """
    from factory.budget import check_cost_cap_priced
    from factory.pipeline import check_seed_files
    from factory.runstate import hold_output

    if started is None:
        start_run_clock()
    else:
        start_run_clock(started[0], label=started[1])
    if cfg.pipeline != "envsim":
        check_seed_files(cfg)  # before the folder or Ray: unusable seeds stop the run here
    out_dir = Path(out_dir).resolve()
    cfg.output.dir = str(out_dir)  # actors find the output (and its cache) through the recipe
    check_cost_cap_priced(cfg)  # before the folder is touched
    with hold_output(out_dir):
        return _run_locked(cfg, out_dir, progress, fresh, retry_failed, drop_cache)


def _run_locked(
    cfg: RecipeConfig,
    out_dir: Path,
    progress: bool,
    fresh: bool,
    retry_failed: bool,
    drop_cache: bool,
) -> RunResult:
    from factory.runstate import finish_run, prepare_output

    mode = prepare_output(
        cfg, out_dir, fresh=fresh, retry_failed=retry_failed, drop_cache=drop_cache
    )
    if mode == "done":
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
        result = RunResult(out_dir, manifest.get("totals", {}), manifest)
        result.extra["report"] = "already complete (use --retry-failed to retry failed calls)"
        return result
    with quiet_ray(out_dir) as log:  # Ray's own output goes to OUT/logs/run.log
        print(f"log (Ray's messages, retries): {log}", file=console())
        if cfg.pipeline == "curate":
            result = run_curate(cfg, out_dir, progress=progress)
        elif cfg.pipeline == "envsim":
            from factory.envsim_run import run_envsim

            result = run_envsim(cfg, out_dir, progress=progress)
        else:
            from factory.amplify_run import run_amplify

            result = run_amplify(cfg, out_dir, progress=progress)
    _final_wall_time(out_dir, result)
    result.extra["mode"] = mode
    try:
        finish_run(cfg, out_dir, stopped_by=result.stopped_by)
    except OutputWriteError as exc:
        if result.error is None:
            raise
        result.error += f"; and {exc}"  # the first failure says where the answers are
    return result
