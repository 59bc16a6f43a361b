"""Run a loaded recipe end to end and report what happened.

``run`` takes the output folder (lock, resume, verification) and starts the run's
own LLM pool when the recipe serves one (``llm.serve``), whatever the job; ``run_job``
declares the recipe's job (``factory.engine.jobs.registry``: the runner knows no job
kind), starts its workers and runs the one driver loop (``factory.engine.loop.drive``);
the manifest is written from the run's ledger and the job's report
(``loop.Job.finish``). The ``RunResult``'s totals satisfy
accepted + surplus + rejected + failed = total rows (seeds for ``curate``; calls
for ``amplify``; step samples for ``envsim``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.engine import interrupts
from factory.engine.console import (
    LOG_FILE,
    Bars,
    console,
    end_own_ray,
    quiet_ray,
    run_clock,
    start_run_clock,
)
from factory.engine.health import UNREACHABLE, EndpointWatch
from factory.engine.jobs import registry
from factory.engine.ledger import Ledger
from factory.engine.loop import Job, drive, wind_down
from factory.engine.pool import ActorPool
from factory.engine.raycompat import ray_address
from factory.engine.result import RunResult, new_manifest, write_manifest
from factory.engine.settings import stage_prices
from factory.engine.stages.base import StageSpec
from factory.engine.watchdog import Lifeline
from factory.errors import FactoryError, OutputWriteError
from factory.io.writer import atomic_write_text, prepare_conversion
from factory.recipe import Recipe

if TYPE_CHECKING:
    from factory.io.mirror import Mirror

__all__ = ["RunResult", "run", "run_job"]

log = logging.getLogger(__name__)


def run_job(cfg: Recipe, out_dir: Path, *, progress: bool = True) -> RunResult:
    """Run the job ``cfg`` declares (``registry.declare``) through the one driver loop
    and write its manifest from the run's ledger and the job's report."""
    from factory.engine.raycompat import init_ray

    manifest = new_manifest(cfg)
    pool: ActorPool | None = None

    def add_chain(name: str, specs: Sequence[StageSpec]) -> None:
        assert pool is not None
        pool.add_chain(name, specs)

    job = registry.declare(cfg, out_dir, manifest, add_chain)  # recipe errors stop here
    ledger = Ledger(job.caps, started=manifest.started, prices=stage_prices(cfg))
    init_ray(cfg.ray.address)
    threading.Thread(target=prepare_conversion, name="factory-arrow", daemon=True).start()
    bars = Bars(enabled=progress)
    watch = EndpointWatch(cfg.llm.stall_s) if cfg.llm is not None else None
    try:
        with Lifeline(lifeline_host()) as lifeline, job.running(progress):
            pool = ActorPool(
                job.chains,
                actors=cfg.ray.actors,
                num_cpus=cfg.ray.num_cpus,
                capacity=job.workers.capacity,
                lifeline=lifeline.address,
                placement=cfg.ray.placement,
                slots_per_worker=job.workers.slots,
            )
            try:
                stopped_by = drive(
                    job,
                    pool,
                    ledger,
                    progress=bars,
                    health=watch,
                )
            except BaseException as exc:
                bars.close()
                _let_in_flight_finish(cfg, pool, job, exc)
                raise
            finally:
                pool.close()
    finally:
        bars.close()
    try:
        report = job.finish(ledger, stopped_by)
        totals = write_manifest(out_dir, manifest, ledger, pipeline=job.pipeline, report=report)
    except FactoryError as exc:  # the last shards or the manifest: a full disk, typically
        _add_unstored_note(job, exc)
        raise
    manifest_dict = manifest.to_dict(**totals)
    result = RunResult(
        out_dir, totals, manifest_dict, stopped_by=stopped_by, wall_s=manifest_dict["wall_time_s"]
    )
    result.error = job.error(stopped_by)
    if report.report:
        result.extra["report"] = report.report
    if stopped_by == UNREACHABLE and watch is not None:
        result.extra["stop_message"] = watch.message
    return result


def _let_in_flight_finish(cfg: Recipe, pool: ActorPool, job: Job, exc: BaseException) -> None:
    """The loop ended at once (``exc``: an interrupt, a failed write): the requests on the
    wire get ``llm.stop_grace_s`` to finish and be stored (``loop.wind_down``) before the
    pool is closed. A second Ctrl-C meanwhile ends the process at once (``interrupts``).

    Paid answers the cache refused, those that arrived while the run stopped included,
    are kept (``OUT/unstored/``) and named under the error the run ends with (or on the
    console after an interrupt): the job's own account of them (``job.error``)."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    grace = cfg.llm.stop_grace_s if cfg.llm is not None else 0.0
    n = pool.in_flight
    if interrupted and n and grace > 0:
        print(
            f"stopping: no new request; those in flight get up to {grace:g} s to finish "
            "and be stored (llm.stop_grace_s; Ctrl-C again stops at once, and the resume "
            "pays those again)",
            file=console(),
            flush=True,
        )
    came = wind_down(pool, job.sink, "interrupted" if interrupted else "error", grace)
    log.info(
        "stopped after %s: %d of %d items in flight came back in the grace",
        type(exc).__name__,
        len(came),
        n,
    )
    if isinstance(exc, FactoryError):
        _add_unstored_note(job, exc)
    elif (note := job.error(None)) is not None:
        print(f"note: {note}", file=console(), flush=True)


def _add_unstored_note(job: Job, exc: FactoryError) -> None:
    """Name the paid answers the cache refused, and where they are kept (the job's own
    account of them: ``job.error``), under the error a run ends with."""
    note = job.error(None)
    if note is not None and note not in exc.details:
        exc.details = (*exc.details, note)


def lifeline_host() -> str:
    """Where workers reach the driver: loopback for a local Ray, the node's address else."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is not None and getattr(node, "head", False) and ray_address(None) == "local":
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address())


def _final_wall_time(out_dir: Path, result: RunResult) -> None:
    """Count the wall time up to now, the data and manifest complete, in the summary and
    in manifest.json alike. What follows (Ray's shutdown beside the report, about 2 s,
    then the exit) is what a person timing the command adds."""
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
    cfg: Recipe,
    out_dir: Path | str,
    *,
    progress: bool = True,
    fresh: bool = False,
    retry_failed: bool = False,
    drop_cache: bool = False,
    other_cache: bool = False,
    started: tuple[float, str] | None = None,
) -> RunResult:
    """Run ``cfg`` writing into ``out_dir``: a new run, or the resumption of the run the
    folder holds (see ``factory.io.runstate``). ``out_dir`` may be ``s3://bucket/prefix``:
    the run then holds the prefix's lease and works in a local copy mirrored to it
    (``factory.io.mirror``), with the response cache on the store (``<prefix>/cache``
    unless ``cache.path`` names another).

    ``started``: ``(epoch seconds, what it is)`` the wall time counts from; default
    this call. The CLI passes its process start, so the printed wall time, the
    manifest's and a person timing the command agree.

    Raises:
        ConfigError: a cost cap over an unpriced model, a folder of another recipe ...
        OutputLocked: another run holds ``out_dir`` (nothing was touched).
        OutputWriteError: a file could not be written (names the path).
    """
    from factory.io.mirror import hold_remote, mirror_dir
    from factory.io.objectstore import output_location
    from factory.io.runstate import hold_output

    if started is None:
        start_run_clock()
    else:
        start_run_clock(started[0], label=started[1])
    target = output_location(str(out_dir))
    local = mirror_dir(target) if isinstance(target, str) else target
    if isinstance(target, str) and cfg.cache.enabled and not cfg.cache.path:
        cfg.cache.path = f"{target}/cache"  # on the store: a new head pays nothing twice
    registry.check_inputs(cfg, local)  # before the folder or Ray: seeds, an unpriced cap
    cfg.output.dir = str(local)  # actors find the output (and its cache) through the recipe
    if not isinstance(target, str):
        with hold_output(local):
            return _run_locked(cfg, local, progress, fresh, retry_failed, drop_cache, other_cache)
    ttl = cfg.output.lease_ttl_s
    with hold_remote(target, ttl_s=ttl, say=lambda line: print(line, file=console())) as mirror:
        if fresh and drop_cache and cfg.cache.path == f"{target}/cache":
            dropped = mirror.store.delete_under("cache")
            print(f"--drop-cache: deleted {target}/cache ({dropped} objects)", file=console())
        result = _run_locked(
            cfg, local, progress, fresh, retry_failed, drop_cache, other_cache, mirror=mirror
        )
    # What the run says names the output, not this head's working copy of it.
    result.out_dir = target
    for key in ("report", "stop_message"):
        if isinstance(result.extra.get(key), str):
            result.extra[key] = result.extra[key].replace(str(local), target)
    if result.error:
        result.error = result.error.replace(str(local), target)
    return result


def _run_locked(
    cfg: Recipe,
    out_dir: Path,
    progress: bool,
    fresh: bool,
    retry_failed: bool,
    drop_cache: bool,
    other_cache: bool = False,
    *,
    mirror: Mirror | None = None,
) -> RunResult:
    from factory.io.runstate import finish_run, prepare_output

    # A remote output's uploads wait while the folder is prepared (its files are deleted
    # in an order only the end makes consistent), then the store follows at once.
    with mirror.paused() if mirror is not None else contextlib.nullcontext():
        mode = prepare_output(
            cfg,
            out_dir,
            fresh=fresh,
            retry_failed=retry_failed,
            drop_cache=drop_cache,
            other_cache=other_cache,
        )
    if mirror is not None:
        mirror.sync()
    if mode == "rebuild":
        print(
            f"{out_dir} was damaged (the warning above names the file); writing it again "
            "from the response cache: no call is paid twice",
            file=console(),
        )
    if mode == "done":
        return _already_complete(out_dir)
    with quiet_ray(out_dir) as log:  # Ray's own output goes to OUT/logs/run.log
        kept = f" (kept at {mirror.uri}/{LOG_FILE.as_posix()} at the end)" if mirror else ""
        print(f"log (Ray's messages, retries): {log}{kept}", file=console())
        _say_prompt_changes(cfg, out_dir)
        from factory.engine.serve import serving

        # llm.serve: the run's own vLLM pool, always stopped, around every kind of job (a
        # mixed recipe's parts included: each part's recipe is copied from ``cfg`` inside
        # the block, with the pool's endpoints)
        with serving(cfg) as served:
            result = run_job(cfg, out_dir, progress=progress)
        if served is not None:
            result.manifest["serve"] = served.report()
        _final_wall_time(out_dir, result)
        result.extra["mode"] = mode
        interrupts.mark_complete(str(out_dir))  # once run.json says done, the run is done
        try:
            finish_run(cfg, out_dir, stopped_by=result.stopped_by)
        except OutputWriteError as exc:
            if result.error is None:
                raise
            result.error += f"; and {exc}"  # the first failure says where the answers are
        try:
            _write_documents(out_dir, result)
        except KeyboardInterrupt as exc:
            if interrupts.completed() is None:
                raise
            name = interrupts.received() or interrupts.signal_name(exc)
            result.extra["report"] = (
                f"{name} after the run was complete: {out_dir} holds the finished dataset; "
                f"the run report was not written (`factory report {out_dir}` writes it)"
            )
    return result


def _already_complete(out_dir: Path) -> RunResult:
    """A finished folder, checked against its checksums, that this command leaves alone:
    its totals, and this process's own wall time (it only checked the folder)."""
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    started, label = run_clock()
    took = manifest.get("wall_time_s")
    manifest = {**manifest, "wall_time_from": label}
    result = RunResult(out_dir, manifest.get("totals", {}), manifest)
    result.wall_s = time.time() - started
    earlier = f"; the run that wrote it took {float(took):.1f}s" if took is not None else ""
    result.extra["report"] = (
        f"already complete: nothing was run{earlier} (use --retry-failed to retry failed calls)"
    )
    return result


def _write_documents(out_dir: Path, result: RunResult) -> None:
    """The run report and the dataset card (``factory.io.report``), once the folder was
    checked against its manifest, written while the run's Ray shuts down
    (``end_own_ray``): the plots take ~1.8 s of CPU, Ray's shutdown ~1.4 s mostly spent
    waiting for its processes to exit, so a run ends ~1.4 s sooner than one after the
    other. Derived documents: a failure here is a warning, never a failed run
    (``factory report OUT`` writes them again)."""
    from factory.io.report import write_documents

    if not (out_dir / "manifest.json").is_file():
        return
    written: dict[str, Any] = {}

    def write() -> None:
        try:
            written["paths"] = write_documents(out_dir)
        except Exception as exc:  # a bug in a plot must not fail a run that produced its data
            written["error"] = exc

    thread = threading.Thread(target=write, name="factory-documents")
    thread.start()
    try:
        end_own_ray()
    finally:
        thread.join()
    paths: list[str] = written.get("paths", [])
    exc = written.get("error")
    if exc is not None:
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


def _say_prompt_changes(cfg: Recipe, out_dir: Path) -> None:
    """Before any call: which stages' prompts changed since the folder's last run, and how
    many cached answers that leaves unused (``factory.io.runstate.note_prompt_changes``)."""
    from factory.engine.prompts import prompt_fingerprints
    from factory.io.runstate import note_prompt_changes

    for line in note_prompt_changes(cfg, out_dir, prompt_fingerprints(cfg)):
        print(f"note: {line}", file=console())
        logging.getLogger("factory").warning(line)
