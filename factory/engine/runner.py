"""Run a loaded recipe end to end and report what happened.

One function per pipeline kind; each builds its Ray Data pipeline
(``factory.engine.pipeline``), streams the final rows to a ``Collector`` and returns a
``RunResult`` whose totals satisfy accepted + surplus + rejected + failed =
total rows (seeds for ``curate``; calls for ``amplify``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from factory.config import RecipeConfig
from factory.engine.collect import Collector
from factory.engine.console import console, quiet_ray, run_clock, start_run_clock
from factory.engine.quality import build_decontaminator, build_neardup_index, decontam_summary
from factory.engine.result import RunResult, _progress, new_manifest
from factory.errors import OutputWriteError
from factory.io.writer import atomic_write_text

__all__ = ["RunResult", "run"]


def run_curate(cfg: RecipeConfig, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Validate and convert seeds into a LLaMA-Factory dataset (no LLM)."""
    from factory.engine.pipeline import curate_dataset, iter_rows
    from factory.engine.raycompat import init_ray

    init_ray(cfg.ray.address)
    manifest = new_manifest(cfg)
    collector = Collector(
        out_dir,
        manifest,
        dataset_name=cfg.output.dataset_name,
        shard_rows=cfg.output.shard_rows,
        neardup=build_neardup_index(cfg),
    )
    build_decontaminator(cfg)  # a missing benchmark file fails here, not in a worker
    with _progress(progress, None, "seeds") as bar:
        for row in iter_rows(curate_dataset(cfg)):
            collector.add(row)
            bar.update(1)
            bar.set_postfix(accepted=collector.accepted, refresh=False)
    totals = collector.close(pipeline="curate", decontamination=decontam_summary(cfg, manifest))
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
        if "serve" in result.manifest:  # the pool's replicas, stopped after the shards
            manifest["serve"] = result.manifest["serve"]
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
    folder holds (see ``factory.io.runstate``).

    ``started``: ``(epoch seconds, what it is)`` the wall time counts from; default
    this call. The CLI passes its process start, so the printed wall time, the
    manifest's and a person timing the command agree.

    Raises:
        ConfigError: a cost cap over an unpriced model, a folder of another recipe ...
        OutputLocked: another run holds ``out_dir`` (nothing was touched).
        OutputWriteError: a file could not be written (names the path).
    """
    from factory.engine.budget import check_cost_cap_priced
    from factory.engine.pipeline import check_seed_files
    from factory.io.runstate import hold_output

    if started is None:
        start_run_clock()
    else:
        start_run_clock(started[0], label=started[1])
    if cfg.parts is not None:  # a mixed recipe: every part's seeds
        from factory.engine.jobs.mix import part_recipe

        for i in range(len(cfg.parts)):
            check_seed_files(part_recipe(cfg, i, Path(out_dir).resolve()))
    elif cfg.pipeline != "envsim":
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
    from factory.io.runstate import finish_run, prepare_output

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
        _say_prompt_changes(cfg, out_dir)
        if cfg.pipeline == "curate":
            result = run_curate(cfg, out_dir, progress=progress)
        elif cfg.parts is not None:
            from factory.engine.jobs.mix import run_mix

            result = run_mix(cfg, out_dir, progress=progress)
        elif cfg.pipeline == "envsim":
            from factory.engine.jobs.envsim import run_envsim

            result = run_envsim(cfg, out_dir, progress=progress)
        else:
            from factory.engine.jobs.amplify import run_amplify
            from factory.engine.serve import serving

            with serving(cfg) as pool:  # llm.serve: the run's own vLLM pool, always stopped
                result = run_amplify(cfg, out_dir, progress=progress)
            if pool is not None:
                result.manifest["serve"] = pool.report()
    _final_wall_time(out_dir, result)
    result.extra["mode"] = mode
    try:
        finish_run(cfg, out_dir, stopped_by=result.stopped_by)
    except OutputWriteError as exc:
        if result.error is None:
            raise
        result.error += f"; and {exc}"  # the first failure says where the answers are
    _write_documents(out_dir, result)
    return result


def _write_documents(out_dir: Path, result: RunResult) -> None:
    """The run report and the dataset card (``factory.io.report``), once the folder was
    checked against its manifest. Derived documents: a failure here is a warning, never
    a failed run (``factory report OUT`` writes them again)."""
    import logging

    from factory.io.report import write_documents

    if not (out_dir / "manifest.json").is_file():
        return
    try:
        paths = write_documents(out_dir)
    except Exception as exc:  # a bug in a plot must not fail a run that produced its data
        logging.getLogger(__name__).warning(
            "run report not written: %s: %s", type(exc).__name__, exc
        )
        why = f"{type(exc).__name__}: {exc}"
        print(f"run report not written ({why}); retry: factory report {out_dir}", file=console())
        return
    note = "report: " + ", ".join(paths)
    result.extra["report"] = (
        f"{result.extra['report']}\n{note}" if result.extra.get("report") else note
    )


def _say_prompt_changes(cfg: RecipeConfig, out_dir: Path) -> None:
    """Before any call: which stages' prompts changed since the folder's last run, and how
    many cached answers that leaves unused (``factory.io.runstate.note_prompt_changes``)."""
    from factory.engine.prompts import prompt_fingerprints
    from factory.io.runstate import note_prompt_changes

    for line in note_prompt_changes(cfg, out_dir, prompt_fingerprints(cfg)):
        print(f"note: {line}", file=console())
        logging.getLogger("factory").warning(line)
