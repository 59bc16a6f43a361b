"""A run's output folder on object storage: a local working copy mirrored to the store.

Why a mirror and not every writer on ``pyarrow.fs``: the output code (atomic shard
writes, checksums, ``run.json``, ``unstored/``, the report) is local-disk code that is
fast and tested, and an object store has neither renames nor appends. So a run whose
output is ``s3://bucket/prefix`` works in a local folder (``mirror_dir``) exactly as
it would in a local output, and this module keeps the store equal to it:

* at the start (under the output's lease, ``factory.io.lease``) the remote folder is
  pulled into a fresh local copy: its state (``run.json``, ``prompts.json``, the card's
  license, paid answers in ``unstored/``, the batch journal, the log), and the shards
  and manifest only when the remote run is ``done`` (they are then checked against
  their checksums before "already complete"; any other run rebuilds them from the
  response cache, so downloading them would be wasted);
* while the run goes, a thread uploads every file as soon as it is final (a file in
  its place is final: every output write goes through a temporary file and a rename)
  and deletes the remote copies of files the run deleted, the manifest first;
* the manifest is uploaded after every file it lists, and ``run.json`` after the
  manifest, so the store never holds a manifest that claims a missing shard, nor a
  ``done`` over a manifest not yet there;
* at the end a last pass uploads the rest (the log too) and the lease is released.

The response cache is not mirrored: it lives on the store itself (default
``<output>/cache``), written by every worker on every node, so a new head pays for
nothing twice. What a crash of the head loses is what the last pass (at most
``interval_s`` old) had not uploaded: shards, which the next run rebuilds from the
cache anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.errors import FactoryError
from factory.io.lease import LEASE_FILE, Lease
from factory.io.objectstore import S3Store, open_store

__all__ = [
    "MIRROR_ENV",
    "Mirror",
    "SyncPlan",
    "hold_remote",
    "mirror_dir",
    "plan_sync",
    "pull_names",
    "read_remote_json",
    "reading_remote",
    "syncable",
]

log = logging.getLogger(__name__)

#: Where the local copies of remote outputs live (default: the system's temp folder).
MIRROR_ENV = "FACTORY_MIRROR_DIR"
MANIFEST, STATE = "manifest.json", "run.json"
# Never mirrored: the cache lives on the store; temporary files, the local lock and
# the disk-full reserve are this host's; the lease is the lease's own business.
_LOCAL_ONLY = (".tmp/", "cache/", ".lock", "unstored/.reserve", LEASE_FILE)
_LIVE = ("logs/",)  # appended all run long: uploaded at the last pass only

Stamp = tuple[int, int]  # (size, mtime_ns): a file in place changes only by a rename


def syncable(rel: str, *, final: bool = False) -> bool:
    """Whether the local file ``rel`` (path below the folder) belongs on the store now."""
    if any(rel == p or rel.startswith(p) for p in _LOCAL_ONLY):
        return False
    return final or not any(rel.startswith(p) for p in _LIVE)


@dataclass(frozen=True)
class SyncPlan:
    """One pass: remote files to delete (in order), then local files to upload (in order)."""

    deletes: tuple[str, ...]
    uploads: tuple[str, ...]


def plan_sync(
    local: Mapping[str, Stamp],
    uploaded: Mapping[str, Stamp],
    remote: Set[str],
    *,
    final: bool = False,
) -> SyncPlan:
    """What one pass does, from the local files (``local``: path -> stamp), the stamps
    uploaded so far and the remote paths known.

    Deletes come first, the manifest before any other file (a remote manifest never
    lists a deleted shard); uploads come after, the manifest after every other file and
    ``run.json`` last (what a manifest lists is there before it, and a ``done`` state
    is there only over its manifest).
    """
    files = {rel: stamp for rel, stamp in local.items() if syncable(rel, final=final)}
    gone = sorted(rel for rel in remote if rel not in local and syncable(rel, final=True))
    deletes = [MANIFEST] if MANIFEST in gone else []
    deletes += [rel for rel in gone if rel != MANIFEST]
    changed = sorted(rel for rel, stamp in files.items() if uploaded.get(rel) != stamp)
    uploads = [rel for rel in changed if rel not in (MANIFEST, STATE)]
    uploads += [rel for rel in (MANIFEST, STATE) if rel in changed]
    return SyncPlan(tuple(deletes), tuple(uploads))


def pull_names(remote: Mapping[str, int], *, done: bool) -> list[str]:
    """What a run starting on a remote output downloads: every mirrored file, except
    the files a run generates unless the remote run is ``done`` (any other run deletes
    and rebuilds them: ``runstate.prepare_output``)."""
    from factory.io.runstate import GENERATED

    def generated(rel: str) -> bool:
        return any(rel == g or rel.startswith(g + "/") for g in GENERATED)

    return sorted(
        rel for rel in remote if syncable(rel, final=True) and (done or not generated(rel))
    )


def mirror_dir(uri: str) -> Path:
    """The local copy of ``uri``: ``$FACTORY_MIRROR_DIR/<bucket-prefix>-<hash>``."""
    base = Path(os.environ.get(MIRROR_ENV) or Path(tempfile.gettempdir()) / "factory-outputs")
    tail = "".join(c if c.isalnum() or c in "-_." else "-" for c in uri.split("://", 1)[-1])
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return base / f"{tail[-60:].strip('-')}-{digest}"


def _stamp(path: Path) -> Stamp:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _local_files(root: Path) -> dict[str, Stamp]:
    out: dict[str, Stamp] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):
                out[path.relative_to(root).as_posix()] = _stamp(path)
    return out


class Mirror:
    """The local copy of one remote output and its uploads (see module docstring).

    Args:
        store: the output's store.
        local: the local folder (emptied by ``pull``).
        lease: the output's lease; nothing is written to the store once it is lost.
        interval_s: seconds between two passes of the upload thread.
    """

    def __init__(
        self, store: S3Store, local: Path, lease: Lease | None = None, *, interval_s: float = 1.0
    ) -> None:
        self.store, self.local, self.lease = store, Path(local), lease
        self.interval_s = interval_s
        self._uploaded: dict[str, Stamp] = {}
        self._remote: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return self.store.uri

    def pull(self) -> str | None:
        """Empty the local folder and download the remote output into it; returns the
        remote run's status (``run.json``), None for a new output."""
        import json

        if self.local.exists():
            shutil.rmtree(self.local)
        self.local.mkdir(parents=True)
        remote = self.store.list()
        state = self.store.read_text(STATE) if STATE in remote else None
        try:
            status = json.loads(state).get("status") if state else None
        except ValueError:
            status = None
        for rel in pull_names(remote, done=status == "done"):
            self.store.download(rel, self.local / rel)
            self._uploaded[rel] = _stamp(self.local / rel)
        self._remote = {rel for rel in remote if syncable(rel, final=True)}
        return status

    def sync(self, *, final: bool = False) -> SyncPlan:
        """One pass (``plan_sync``): deletes, then uploads; returns what it did.

        Raises:
            OutputLocked: the lease was lost (nothing is written after that).
            ObjectStoreError: the store refused a request.
        """
        with self._lock:
            if self.lease is not None:
                self.lease.check()
            # The state and the manifest are read before the walk: every file the
            # manifest lists was in place before it was written, so the walk sees it.
            snapshots = {}
            for rel in (STATE, MANIFEST):
                path = self.local / rel
                with contextlib.suppress(FileNotFoundError):
                    stamp = _stamp(path)
                    snapshots[rel] = (stamp, path.read_bytes())
            local = _local_files(self.local)
            for rel, (stamp, _) in snapshots.items():
                local[rel] = stamp
            plan = plan_sync(local, self._uploaded, self._remote, final=final)
            for rel in plan.deletes:
                self.store.delete(rel)
                self._remote.discard(rel)
                self._uploaded.pop(rel, None)
            for rel in plan.uploads:
                stamp = local[rel]
                if rel in snapshots:
                    self.store.put(rel, snapshots[rel][1])
                else:
                    try:
                        self.store.upload(rel, self.local / rel)
                    except FileNotFoundError:  # deleted since the walk: the next pass
                        continue
                self._uploaded[rel] = stamp
                self._remote.add(rel)
            return plan

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No pass runs during the block (a folder being prepared: files deleted in an
        order that only its end makes consistent)."""
        with self._lock:
            yield

    def start(self) -> None:
        """Run a pass every ``interval_s`` in a daemon thread until ``stop``."""

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.sync()
                except (FactoryError, OSError) as exc:
                    # A transient failure costs nothing (the next pass sends the file);
                    # the last pass raises if the store still refuses.
                    log.warning("upload to %s failed, retried: %s", self.uri, exc)
                    if self.lease is not None and self.lease.lost:
                        return

        self._thread = threading.Thread(target=loop, name="factory-mirror", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


@contextlib.contextmanager
def hold_remote(uri: str, *, ttl_s: float, say: Any = None) -> Iterator[Mirror]:
    """Hold the output ``uri`` for the block: its lease taken (or ``OutputLocked``), the
    remote folder pulled into a fresh local copy, uploads running; at the end a last
    pass, the lease released, and the local copy deleted when the block succeeded.

    ``say``: a callable for the one line said when an expired lease was taken over.

    Raises:
        OutputLocked: another run holds the output, or this one lost its lease.
        ObjectStoreError: the store refused a request (bucket, credentials, network).
    """
    store = open_store(uri)
    lease = Lease(store, ttl_s=ttl_s)
    note = lease.acquire()
    if note:
        log.warning("%s", note)
        if say is not None:
            say(note)
    mirror = Mirror(store, mirror_dir(uri), lease)
    ok = False
    try:
        lease.start()
        mirror.pull()
        mirror.start()
        yield mirror
        ok = True
    finally:
        mirror.stop()
        try:
            if ok or not lease.lost:
                try:
                    mirror.sync(final=True)
                except (FactoryError, OSError):
                    if ok:
                        raise
                    log.exception("last upload to %s failed", uri)  # the block's error wins
        finally:
            lease.release()
    if ok:
        shutil.rmtree(mirror.local, ignore_errors=True)


def read_remote_json(uri: str, name: str) -> dict[str, Any]:
    """A small JSON file of a remote output (``run.json``, ``manifest.json``), or {}."""
    import json

    try:
        text = open_store(uri).read_text(name)
        value = json.loads(text) if text else {}
    except (ValueError, FactoryError):
        return {}
    return value if isinstance(value, dict) else {}


@contextlib.contextmanager
def reading_remote(uri: str, *, write_back: bool = False) -> Iterator[Path]:
    """A local copy of the remote output ``uri`` for ``factory inspect/report/push``:
    everything but the cache and the log, in a temporary folder deleted after the block.
    ``write_back``: upload the files the block wrote or changed (``factory report``),
    the manifest and run.json never among them.

    Raises:
        ObjectStoreError: the store refused a request.
    """
    store = open_store(uri)
    with tempfile.TemporaryDirectory(prefix="factory-read-") as tmp:
        mirror = Mirror(store, Path(tmp) / "out")
        mirror.local.mkdir()
        for rel in store.list():
            if syncable(rel) and not rel.startswith("unstored/"):
                store.download(rel, mirror.local / rel)
                mirror._uploaded[rel] = _stamp(mirror.local / rel)
        yield mirror.local
        if write_back:
            changed = plan_sync(_local_files(mirror.local), mirror._uploaded, set()).uploads
            for rel in changed:
                if rel not in (MANIFEST, STATE):
                    store.upload(rel, mirror.local / rel)
