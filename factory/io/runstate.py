"""Resumable runs: what an output folder holds, and whether a run may continue it.

``OUT/run.json`` records the recipe a folder was produced with and the run's
status (running, stopped, done). Starting a run on a folder:

* the folder's lock (``OUT/.lock``, an OS lock held for the run's life) is taken
  first: a second run on a folder in use is refused before it touches anything,
  naming the holder; the kernel releases the lock of a run that dies, so a
  crashed run never holds its folder;
* empty folder: a new run;
* same recipe (up to the settings below that never change a request or a row):
  the run is resumed. Every output file is rebuilt from the response cache,
  which holds every completed LLM response, so no completed call is paid for
  twice; calls are a pure function of their number and are used in number order,
  so the rebuilt dataset equals what an uninterrupted run writes;
* a different recipe: refused, naming the keys that changed (mixing two
  recipes in one output would make the dataset meaningless); ``--fresh``
  starts over instead, keeping the response cache unless ``--drop-cache``;
* a run that finished: nothing to do, unless ``--retry-failed`` asks to retry
  the calls that failed (they are never cached, so they are issued again) or
  ``amplify.target`` changed (the run continues: cached calls are replayed and
  only the missing rows are paid for).

Paid responses the cache could not store (disk full) wait in ``OUT/unstored/``
(where room is reserved for them when a run starts) in the cache's own line
format; the next run stores them in the cache before anything else, so they are
never requested again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow.parquet as pq

from factory.errors import ConfigError, FactoryError, OutputDamaged, OutputLocked, OutputWriteError
from factory.io.writer import atomic_write_text, writing
from factory.recipe import Recipe

__all__ = [
    "BATCHES_DIR",
    "LOCK_FILE",
    "PROMPTS_FILE",
    "RESERVE_FILE",
    "RESUMABLE",
    "UNSTORED_DIR",
    "BatchJournal",
    "OutputLock",
    "batch_summary",
    "changed_keys",
    "changed_prompts",
    "find_damage",
    "finish_run",
    "hold_output",
    "note_prompt_changes",
    "prepare_output",
    "read_manifest",
    "release_room",
    "reserve_room",
    "restore_unstored",
    "save_unstored",
    "verify_output",
]

log = logging.getLogger(__name__)

STATE_FILE = "run.json"
#: Per LLM stage, the fingerprint of the prompts of the folder's last run (kept by --fresh,
#: like the cache whose answers it describes).
PROMPTS_FILE = "prompts.json"
LOCK_FILE = ".lock"
CACHE_DIR = "cache"  # the default cache location inside the output folder
UNSTORED_DIR = "unstored"
CARD_SETTINGS = "card.json"  # the card's license, given once (factory.io.report.card)
BATCHES_DIR = "batches"  # the batch journal: kept across resumes, like the cache
GENERATED = (
    "data",
    "surplus",
    "rejects",
    "failed",
    "candidates",
    "manifest.json",
    "dataset_info.json",
    "report.html",  # the run report and the dataset card: written again when a run ends
    "README.md",
    "llamafactory",  # the SFT config (factory.io.report.training), written with the report
    ".tmp",
)
# Settings that change neither a request nor a row: a resumed run may change them
# (raise a cap, use other servers, tune concurrency).
RESUMABLE = (
    "output.dir",
    "output.lease_ttl_s",
    "amplify.max_cost_usd",
    "amplify.max_tokens",
    "amplify.max_calls",
    "amplify.confirm_above_usd",
    "output.tokenizer",
    "output.template",
    "amplify.target",
    "llm.endpoints",
    "llm.serve",
    "llm.backend",
    "llm.backend_options",
    "llm.transport",
    "llm.concurrency",
    "llm.per_actor_concurrency",
    "llm.timeout_s",
    "llm.stall_s",
    "llm.retry",
    "llm.deadline",
    "ray",
    "cache",
    "envsim.max_episodes",
    "envsim.episodes_per_round",
)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _parts_by_index(recipe: dict[str, Any]) -> dict[str, Any]:
    """A mixed recipe's parts as ``parts.N.*`` keys, quotas left out: a part's quota is
    resumable like ``amplify.target`` (raising it asks that part for more rows)."""
    parts = recipe.get("parts")
    if not isinstance(parts, list):
        return recipe
    indexed = {str(i): {k: v for k, v in p.items() if k != "quota"} for i, p in enumerate(parts)}
    return {**recipe, "parts": indexed}


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Key paths whose values differ, other than the resumable ones."""
    a, b = _flatten(_parts_by_index(old)), _flatten(_parts_by_index(new))
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return [k for k in keys if not any(k == r or k.startswith(r + ".") for r in RESUMABLE)]


# -- one run per folder ------------------------------------------------------------------


class OutputLock:
    """An exclusive ``flock`` on ``OUT/.lock``, held while a run uses the folder.

    Why ``flock``: the kernel drops it when the holding process dies however it
    dies (``kill -9``, OOM killer, node reboot), so there is no stale lock to
    clean up by hand, and a second process (a retried ``ray job submit``) learns
    at once that the folder is taken. The file also names the holder (pid, host,
    start time) for the refusal message. The descriptor is close-on-exec, so a
    process the run starts does not keep the folder locked after the run died.
    """

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or refuse.

        Raises:
            OutputLocked: another live process holds it (message names the holder).
            OutputWriteError: the folder or the lock file cannot be created.
        """
        with writing(self.path):
            self.out_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise OutputLocked(
                f"{self.out_dir} is in use by another run ({holder}); one folder takes one "
                "run at a time: wait for that run to end (or stop it), or choose another "
                "--output. A run that dies releases the folder by itself."
            ) from None
        except OSError as exc:  # e.g. ENOLCK on a filesystem without locks
            os.close(fd)
            raise OutputWriteError(
                self.path, exc, hint="the output folder must be on a filesystem with flock"
            ) from exc
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with contextlib.suppress(OSError):  # naming the holder is a courtesy; the lock holds
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # before unlocking: the next holder writes its own name
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "holder not recorded yet"
    return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}"


@contextlib.contextmanager
def hold_output(out_dir: Path) -> Iterator[OutputLock]:
    """Hold ``out_dir``'s lock for the block (see ``OutputLock``)."""
    with OutputLock(out_dir) as lock:
        yield lock


# -- preparing and finishing a run -------------------------------------------------------


def prepare_output(
    cfg: Recipe,
    out_dir: Path,
    *,
    fresh: bool,
    retry_failed: bool,
    drop_cache: bool = False,
    other_cache: bool = False,
) -> str:
    """Get ``out_dir`` ready; returns ``new``, ``resume``, ``done`` (nothing to do) or
    ``rebuild`` (a finished folder found damaged: written again from the cache).

    Call with the folder's lock held (``hold_output``): this deletes what the
    previous run of the folder generated.

    Raises:
        ConfigError: the folder holds a run of a different recipe (keys listed).
        ConfigError: a resume whose response cache is not the one the folder was
            started with (key path ``cache.path``), unless ``other_cache``.
        OutputWriteError: paid responses waiting in ``unstored/`` cannot be stored.
    """
    state_path = out_dir / STATE_FILE
    recipe = cfg.as_written()  # paths as the file wrote them: a moved checkout resumes
    mode = "new"
    if not (fresh and drop_cache):
        restore_unstored(cfg, out_dir)  # paid for: into the cache before anything else
    if fresh:
        if out_dir.exists():
            log.info(_clear_for_fresh(cfg, out_dir, drop_cache=drop_cache))
    elif state_path.is_file():
        state = json.loads(state_path.read_text(encoding="utf-8"))
        old_recipe = state.get("recipe", {})
        if not other_cache:
            _check_same_cache(cfg, out_dir, state.get("cache"))
        changed = changed_keys(old_recipe, recipe)
        if changed:
            raise ConfigError(
                f"{out_dir} holds a run of a different recipe (changed: {', '.join(changed)}); "
                "use --fresh to start over (the response cache is kept) or another --output",
                key_path=changed[0],
            )
        if (
            state.get("status") == "done"
            and not retry_failed
            and not _target_changed(old_recipe, recipe)
        ):
            damage = _damage(out_dir)
            if damage is None:
                return "done"
            if not _rebuildable(cfg):
                raise OutputDamaged(
                    damage.path,
                    damage.problem,
                    hint="the folder's response cache is off, so rebuilding it would pay "
                    "for its calls again: restore the file, or run with --fresh",
                )
            log.warning("%s; rebuilding the folder from the response cache", damage)
            mode = "rebuild"
        else:
            mode = "resume"
    for name in GENERATED:  # rebuilt from the cache; the cache itself is kept
        target = out_dir / name
        with writing(target):
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.llm is not None and cfg.cache.enabled:
        reserve_room(out_dir)
    _write(out_dir, recipe, "running", cache=_cache_record(cfg, out_dir))
    return mode


def _cache_record(cfg: Recipe, out_dir: Path) -> dict[str, str | None] | None:
    """What run.json keeps of the response cache: where it is and its identity."""
    if cfg.llm is None or not cfg.cache.enabled:
        return None
    from factory.io.cache import cache_identity

    location = cfg.cache.path or str(out_dir / CACHE_DIR)
    try:
        return {"path": location, "id": cache_identity(location)}
    except OSError as exc:  # the cache refuses writes: the run stops at its first answer
        log.warning("response cache %s has no identity yet: %s", location, exc)
        return {"path": location, "id": None}


def _check_same_cache(cfg: Recipe, out_dir: Path, before: Any) -> None:
    """Refuse a resume that would use another response cache than the folder's own."""
    if not isinstance(before, dict) or cfg.llm is None or not cfg.cache.enabled:
        return
    from factory.io.cache import cache_entries, cache_identity

    location = cfg.cache.path or str(out_dir / CACHE_DIR)
    old_path = str(before.get("path") or "")
    if before.get("id") is None:  # the first cache could not even be created: it holds nothing
        return
    else:
        try:
            there = "://" in location or Path(location).exists()  # a URI is its identity
            if there and cache_identity(location) == before["id"]:
                return
        except OSError:
            pass
    held = cache_entries(old_path)
    raise ConfigError(
        f"{out_dir} was started with the response cache {old_path} (id {before.get('id')}); "
        f"this run would use {location}, which is another cache"
        + (f": the {held} answers stored in the first would be paid for again" if held else "")
        + ". Point cache.path at the first cache, or pass --other-cache to resume with this "
        "one anyway (or --fresh to start over)",
        key_path="cache.path",
    )


def _damage(out_dir: Path) -> OutputDamaged | None:
    """What is wrong with a finished folder (a file missing, damaged, unlisted), or None."""
    try:
        verify_output(out_dir, checksums=True)
    except OutputDamaged as exc:
        return exc
    return None


def _rebuildable(cfg: Recipe) -> bool:
    """Whether a run can write its folder again without paying: no LLM, or a cache."""
    return not cfg.calls_llm or cfg.cache.enabled


def note_prompt_changes(cfg: Recipe, out_dir: Path, fingerprints: Mapping[str, str]) -> list[str]:
    """What changed in the prompts since the folder's last run, said before any call is
    paid; records ``fingerprints`` (``factory.engine.prompts.prompt_fingerprints``) as
    the folder's latest.

    Why: an edited policy or template gives every request of its stage a new id, so the
    cached answers of that stage are not reused and its calls are paid again. That is
    right (the answers were to other prompts) but must not be silent.

    Returns:
        One line per stage whose prompts changed, with how many cached answers of that
        stage no longer apply.
    """
    path = out_dir / PROMPTS_FILE
    changed = changed_prompts(out_dir, fingerprints)
    lines = []
    if changed:
        counts = _cached_by_stage(cfg, out_dir, changed)
        for stage in changed:
            lines.append(
                f"the {stage} prompts changed since this folder's last run (template, "
                f"policy, tools, model or sampling): its {counts.get(stage, 0)} cached "
                f"{stage} answers no longer apply, and its calls are made and paid again"
            )
    if fingerprints:
        atomic_write_text(path, json.dumps(dict(fingerprints), indent=2) + "\n", out_dir)
    return lines


def changed_prompts(out_dir: Path, fingerprints: Mapping[str, str]) -> list[str]:
    """The stages whose prompt ``fingerprints`` differ from the folder's last run's (read
    only: ``note_prompt_changes`` records them); their cached answers no longer apply."""
    path = out_dir / PROMPTS_FILE
    try:
        before = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        before = {}
    known = before if isinstance(before, dict) else {}
    return [s for s, f in fingerprints.items() if known.get(s) not in (None, f)]


def _cached_by_stage(cfg: Recipe, out_dir: Path, stages: list[str]) -> dict[str, int]:
    if not cfg.cache.enabled:
        return {}
    location = cfg.cache.path or str(out_dir / CACHE_DIR)
    if not cfg.cache.path and not (out_dir / CACHE_DIR).is_dir():
        return {}
    from factory.io.cache import ResponseCache

    try:
        with ResponseCache(location, refresh_interval_s=0.0) as cache:
            return {stage: cache.count(f"{stage}-") for stage in stages}
    except (OSError, FactoryError):
        return {}


def _target_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A finished run whose target changed continues (raising it asks for more rows)."""
    before, now = old.get("amplify") or {}, new.get("amplify") or {}
    return bool(before.get("target") != now.get("target"))


def _clear_for_fresh(cfg: Recipe, out_dir: Path, *, drop_cache: bool) -> str:
    """Delete what ``--fresh`` starts over from; say what was kept and what dropped.

    The response cache holds answers the user paid for; a request of the new run
    that equals a cached one costs nothing, so it is kept unless asked.
    """
    # The license given for the card (factory report/push --license) is the user's choice
    # about publishing the dataset, not an output of the recipe: kept too.
    keep = {LOCK_FILE, CARD_SETTINGS} | (
        set() if drop_cache else {CACHE_DIR, UNSTORED_DIR, PROMPTS_FILE}
    )
    for child in out_dir.iterdir():
        if child.name in keep:
            continue
        with writing(child):
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    local = out_dir / CACHE_DIR
    if cfg.cache.path:
        where = f"the response cache at {cfg.cache.path} is outside the folder and was kept"
        return f"--fresh: cleared {out_dir}; {where}"
    if drop_cache:
        return f"--fresh --drop-cache: cleared {out_dir}, its response cache included"
    if not local.is_dir():
        return f"--fresh: cleared {out_dir} (it held no response cache)"
    size = sum(p.stat().st_size for p in local.glob("*.jsonl"))
    return (
        f"--fresh: cleared {out_dir} but kept its response cache {local} ({size / 1e6:.1f} MB): "
        "responses already paid for are reused; add --drop-cache to delete it too"
    )


def _read_state(out_dir: Path) -> dict[str, Any]:
    path = out_dir / STATE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _write(out_dir: Path, recipe: dict[str, Any], status: str, **extra: Any) -> None:
    body = {
        "status": status,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": recipe,
        **extra,
    }
    atomic_write_text(out_dir / STATE_FILE, json.dumps(body, indent=2) + "\n", out_dir)


def finish_run(cfg: Recipe, out_dir: Path, *, stopped_by: str | None) -> None:
    """Record that the run ended: ``done``, or ``stopped`` (by a cap, by a failure, or
    short of the target) and resumable.

    The folder is checked against its manifest first (``verify_output``): run.json
    never says ``done`` over files that are not there. The room reserved for unstored
    answers is given back (``release_room``): no call is in flight any more.
    """
    manifest = verify_output(out_dir)
    _write(
        out_dir,
        cfg.as_written(),
        "stopped" if stopped_by else "done",
        stopped_by=stopped_by,
        totals=manifest.get("totals"),
        cache=_read_state(out_dir).get("cache"),
    )
    release_room(out_dir)


# -- the manifest against the disk ---------------------------------------------------------

# Folders whose every file the manifest must list (a loader reads data/ whole).
LISTED_DIRS = ("data", "surplus", "candidates", "rejects", "failed")


def _rows_in(path: Path) -> int:
    if path.suffix == ".parquet":
        return int(pq.ParquetFile(path).metadata.num_rows)
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def verify_output(out_dir: Path, *, checksums: bool = False) -> dict[str, Any]:
    """Check that every file the manifest lists is on disk with its row count and that
    the listed folders hold no other file; returns the manifest.

    Why: a manifest is a promise to whoever trains on the folder. If anything else
    wrote into or deleted from the folder (or a write was lost), the run must not
    end as ``done``.

    Checksums (``manifest.checksums``, SHA-256 per file) are compared too when
    ``checksums`` is set: a shard with flipped bytes keeps its row count.

    Raises:
        OutputWriteError: a listed file is missing, damaged (another checksum,
            unreadable) or has other rows, or an unlisted file sits among the shards.
    """
    manifest = read_manifest(out_dir)
    for problem in find_damage(out_dir, manifest, checksums=checksums):
        raise problem
    return manifest


def read_manifest(out_dir: Path) -> dict[str, Any]:
    """``OUT/manifest.json``.

    Raises:
        OutputDamaged: it is missing or not JSON.
    """
    path = out_dir / "manifest.json"
    if not path.is_file():
        raise OutputDamaged(path, "missing at the end of the run")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise OutputDamaged(path, f"not a readable manifest ({exc})") from exc
    return manifest


def find_damage(
    out_dir: Path, manifest: Mapping[str, Any], *, checksums: bool = False
) -> Iterator[OutputDamaged]:
    """Each file that is not what ``manifest`` says (missing, another checksum when
    ``checksums``, unreadable, other rows), then each unlisted file among the shards:
    the run stops at the first (``verify_output``), ``factory inspect`` names them all
    and shows the rest."""
    from factory.io.writer import file_sha256

    listed: dict[str, int] = manifest.get("files") or {}
    sums: dict[str, str] = manifest.get("checksums") or {}
    for rel, rows in listed.items():
        file = out_dir / rel
        if not file.is_file():
            yield OutputDamaged(file, "listed in the manifest but not on disk")
            continue
        if checksums and rel in sums and file_sha256(file) != sums[rel]:
            yield OutputDamaged(file, "damaged: its SHA-256 is not the manifest's")
            continue
        try:
            found = _rows_in(file)
        except Exception as exc:  # a torn Parquet footer, or any reader error
            yield OutputDamaged(file, f"unreadable ({type(exc).__name__}: {exc})")
            continue
        if found != rows:
            yield OutputDamaged(file, f"holds {found} rows, the manifest says {rows}")
    for sub in LISTED_DIRS:
        folder = out_dir / sub
        if not folder.is_dir():
            continue
        for file in sorted(folder.rglob("*")):
            rel = file.relative_to(out_dir).as_posix()
            if file.is_file() and rel not in listed:
                yield OutputDamaged(file, "on disk but not written by this run")


# -- paid responses the cache could not store -----------------------------------------------


RESERVE_FILE = ".reserve"  # in OUT/unstored/: room kept for paid answers on a full disk
RESERVE_BYTES = 16 << 20  # ~500 answers; at most the requests in flight ever need it


def reserve_room(out_dir: Path, size: int = RESERVE_BYTES) -> bool:
    """Set aside disk space under ``OUT/unstored/`` for paid answers the cache may refuse.

    Why: when the output folder's volume fills up, the cache refuses answers already
    paid for, and the folder they should be kept in is on the same full volume (issue
    22: 48 paid answers went to ``/tmp`` and the resume paid them again). With room
    reserved (allocated, not sparse), ``save_unstored`` gives the reserve back and
    writes the answers in its place. At most a quarter of the free space is taken.
    Returns whether room was reserved (a filesystem without ``fallocate`` has none).
    """
    folder = out_dir / UNSTORED_DIR
    path = folder / RESERVE_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if path.is_file() and path.stat().st_size > 0:
            return True
        free = shutil.disk_usage(folder).free
        size = min(size, free // 4)
        if size <= 0:
            return False
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        return True
    except OSError as exc:
        log.info("no room reserved for unstored answers in %s: %s", folder, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return False


def release_room(out_dir: Path) -> None:
    """Give back the room ``reserve_room`` set aside, once the run has ended.

    Why: the reserve is 16 MB of every finished folder (16 of a 500-row folder's 19 MB,
    issue 39), kept for answers that can only arrive while calls are in flight. The next
    run reserves it again before its first call (``prepare_output``). Answers saved in
    ``unstored/`` stay (the next run stores them in the cache); the folder goes when empty.
    """
    folder = out_dir / UNSTORED_DIR
    with contextlib.suppress(FileNotFoundError):
        (folder / RESERVE_FILE).unlink()
    with contextlib.suppress(OSError):  # not empty: paid answers wait there
        folder.rmdir()


RESERVE_SLACK = 16 << 10  # given back beyond the answers' bytes: blocks, the temp file


def _write_unstored(folder: Path, name: str, data: bytes, out_dir: Path) -> None:
    """Write one file of paid answers; on a full disk, give back as much of the reserved
    room (``reserve_room``) as it takes, never all of it at once.

    Why not the whole reserve: answers keep arriving while a run on a full disk stops
    (the requests in flight finish); when the first of them took all the room, the next
    found none and went to the console, under a run's redirected standard error: into
    ``OUT/logs/run.log`` on the same full disk (issue 33: 2 paid answers lost).
    """
    reserve = folder / RESERVE_FILE
    need = len(data) + RESERVE_SLACK
    while True:
        try:
            atomic_write_text(folder / name, data.decode(), out_dir)
            return
        except OutputWriteError:
            if not reserve.is_file():
                raise
        size = reserve.stat().st_size
        if size > need:
            os.truncate(reserve, size - need)  # the room set aside for exactly this
            need *= 2  # another writer on the volume took it first: give back more
        else:
            reserve.unlink()


def save_unstored(
    out_dir: Path,
    entries: list[tuple[str, dict[str, Any]]],
    cache_dir: Path | None = None,
    console: IO[str] | None = None,
) -> str:
    """Keep paid responses the cache refused, in the cache's line format; returns where.

    Tried in order: ``OUT/unstored/`` (its reserved room used if the disk is full:
    ``reserve_room``), the cache's own folder (``CACHE/unstored/``, when the cache lives
    elsewhere), and as a last resort ``console`` (default stderr; a run passes the
    terminal, since its stderr goes to ``OUT/logs/run.log``, on the disk that is full):
    never a temporary folder a resume would not read. The next run stores them in the
    cache before anything else.
    """
    from factory.io.cache import encode_line

    if not entries:
        return ""
    data = b"".join(encode_line(rid, record) for rid, record in entries)
    # Nanoseconds first: files sort in the order they were written (two saves within
    # one second kept their order only by chance with a seconds stamp).
    name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    errors = []
    places = [out_dir]
    if (
        cache_dir is not None
        and "://" not in str(cache_dir)  # a cache on a store: its folder is not a local one
        and Path(cache_dir).resolve() != (out_dir / CACHE_DIR).resolve()
    ):
        places.append(Path(cache_dir))
    for base in places:
        folder = base / UNSTORED_DIR
        try:
            _write_unstored(folder, name, data, base)
            return str(folder) + "/"
        except (OutputWriteError, OSError) as exc:
            errors.append(str(exc))
    out = console or sys.stderr
    out.write(
        "factory: paid responses that could not be written anywhere follow, in the cache's "
        f"line format ({'; '.join(errors)}); save them into {out_dir / UNSTORED_DIR}/ as a "
        ".jsonl file and the next run stores them in the cache\n"
    )
    out.write(data.decode())
    out.flush()
    return "stderr (no folder could be written: " + "; ".join(errors) + ")"


def restore_unstored(cfg: Recipe, out_dir: Path) -> int:
    """Store the responses waiting in ``OUT/unstored/`` in the response cache, then
    delete them; returns how many were stored.

    Raises:
        OutputWriteError: the cache still refuses writes (no call may be issued until
            it accepts them, or the answers would be lost again).
    """
    if not cfg.cache.enabled:
        return 0
    location = cfg.cache.path or str(out_dir / CACHE_DIR)
    folders = [out_dir / UNSTORED_DIR]
    if "://" not in location:  # a local cache elsewhere keeps what the output could not
        folders.append(Path(location) / UNSTORED_DIR)
    files = sorted(f for d in dict.fromkeys(folders) if d.is_dir() for f in d.glob("*.jsonl"))
    if not files:
        return 0
    folder = folders[0]
    from factory.io.cache import ResponseCache, decode_line

    stored = 0
    try:
        with ResponseCache(location) as cache:
            for file in files:
                for line in file.read_bytes().splitlines():
                    try:
                        key = json.loads(line).get("k")
                    except ValueError:
                        continue
                    record = decode_line(line, key) if isinstance(key, str) else None
                    if record is not None:
                        cache.put(key, record)
                        stored += 1
    except OSError as exc:
        raise OutputWriteError(
            location,
            exc,
            hint=f"paid responses wait in {folder}/ and are stored in the cache by the next "
            "run; make the cache writable (free space) and run the same command again",
        ) from exc
    for file in files:
        file.unlink()
    log.info("stored %d paid responses from %s in the response cache %s", stored, folder, location)
    return stored


# -- submitted batches (llm.backend: openai_batch) ------------------------------------------


class BatchJournal:
    """The batches a run submitted: one JSON file per batch in ``OUT/batches/``.

    Why in the output folder: the batch backend runs in Ray actors that a killed driver
    takes with it, while its batches live on at the provider, paid for. The journal is
    how the next run's actors find them again (``factory.llm.backends.openai_batch``)
    instead of submitting their requests a second time. One file per batch, written
    atomically, so actors never write the same file and a crash leaves the old state
    or the new one. The folder is not ``GENERATED``: a resume keeps it.
    """

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.dir = self.out_dir / BATCHES_DIR

    def load(self) -> list[dict[str, Any]]:
        """Every batch recorded so far (an unreadable file is skipped with a warning)."""
        entries = []
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                entries.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as exc:
                log.warning("batch journal %s unreadable (%s); skipped", path, exc)
        return entries

    def save(self, entry: Mapping[str, Any]) -> None:
        """Write one batch's entry (its ``key`` names the file).

        Raises:
            OutputWriteError: the file cannot be written.
        """
        path = self.dir / f"{entry['key']}.json"
        atomic_write_text(path, json.dumps(dict(entry), sort_keys=True), self.out_dir)


def batch_summary(out_dir: Path) -> dict[str, Any] | None:
    """What the manifest records of a run's batches: counts by status, requests done and
    each batch's id, status and request counts; None when the run submitted none."""
    entries = BatchJournal(out_dir).load()
    if not entries:
        return None
    by_status: dict[str, int] = {}
    done = failed = total = 0
    listed = []
    for e in sorted(entries, key=lambda e: e.get("submitted_at") or 0):
        status = str(e.get("status"))
        by_status[status] = by_status.get(status, 0) + 1
        counts = e.get("request_counts") or {}
        done += int(counts.get("completed") or 0)
        failed += int(counts.get("failed") or 0)
        total += len(e.get("request_ids") or ())
        listed.append(
            {
                "id": e.get("batch_id"),
                "status": status,
                "requests": len(e.get("request_ids") or ()),
                "request_counts": counts,
            }
        )
    return {
        "count": len(entries),
        "by_status": dict(sorted(by_status.items())),
        "requests_submitted": total,
        "requests_completed": done,
        "requests_failed": failed,
        "batches": listed,
    }
