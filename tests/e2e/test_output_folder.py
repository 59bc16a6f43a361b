"""One run per output folder, a manifest that matches the disk, extending and --fresh runs.

The lock is tested with real processes: a holder process, a second CLI invocation that
must be refused before it touches anything, and a holder killed with SIGKILL whose lock
the kernel must release. Every wait polls a condition with a generous deadline; nothing
asserts a wall time, so a busy CI machine only makes the tests slower.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from factory.bench.nodes import cache_entries
from factory.errors import EXIT_LOCKED
from factory.io.runstate import prepare_output
from tests.conftest import ROOT
from tests.helpers import cli_args, dev_overrides, recipe

# The lock and the checks of this work are imported where used, so that against the
# original code each test fails on its own assertion, not on an import.

DEADLINE_S = 300.0  # generous: only a machine far busier than CI's comes near it

HOLDER = """
import sys
from pathlib import Path
try:
    from factory.io.runstate import OutputLock
except ImportError:  # the original code has no lock: hold one by hand, the test then shows
    import fcntl, os  # that the second run ignores it
    fd = os.open(Path(sys.argv[1]) / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
else:
    OutputLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until the test closes stdin or kills us
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("PYTEST_CURRENT_TEST", None)  # the CLI then behaves as for a user
    return env


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file but the lock: content hash and mtime (a touch counts as a change)."""
    return {
        p.relative_to(folder).as_posix(): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _wait(condition: Any, what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start_holder(out: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"  # blocks until the lock is held
    return holder


def _lock_is_free(out: Path) -> bool:
    from factory.errors import OutputLocked
    from factory.io.runstate import OutputLock

    try:
        with OutputLock(out):
            return True
    except OutputLocked:
        return False


def test_a_second_run_is_refused_before_touching_anything_and_a_dead_holder_frees_the_folder(
    tmp_path: Path,
) -> None:
    from factory.recipe import load_recipe

    cfg = load_recipe(ROOT / "pipelines/airline-seeds.yaml")
    out = tmp_path / "o"
    prepare_output(cfg, out, fresh=False, retry_failed=False)  # a run of this very recipe
    (out / "data").mkdir()
    (out / "data" / "part-00000.parquet").write_bytes(b"the first run's shard")
    (out / "cache").mkdir()
    (out / "cache" / "w.jsonl").write_text("{}\n")
    before = _snapshot(out)

    holder = _start_holder(out)
    try:
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "factory.run",
                str(ROOT / "pipelines/airline-seeds.yaml"),
                "-o",
                str(out),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=DEADLINE_S,
        )
        assert second.returncode == EXIT_LOCKED, second.stderr[-2000:]
        assert str(out) in second.stderr and f"pid {holder.pid}" in second.stderr
        assert "in use by another run" in second.stderr and second.stderr.count("\n") == 1
        assert _snapshot(out) == before  # nothing deleted, nothing rewritten
        assert not _lock_is_free(out)  # in this process too: flock is per open file
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs in the holder
        holder.communicate()  # reaps it and closes the pipes
    _wait(lambda: _lock_is_free(out), "the kernel to release a dead holder's lock")
    from factory.io.runstate import OutputLock

    with OutputLock(out):  # a new holder records itself over the dead one's name
        assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()


def test_the_lock_names_its_holder_and_refuses_a_second_holder(tmp_path: Path) -> None:
    from factory.errors import OutputLocked
    from factory.io.runstate import OutputLock

    with OutputLock(tmp_path / "x") as lock:
        info = json.loads(lock.path.read_text())
        assert info["pid"] == os.getpid() and info["host"] and info["started"].endswith("Z")
        with pytest.raises(OutputLocked) as refused:
            OutputLock(tmp_path / "x").acquire()
        assert f"pid {os.getpid()}" in str(refused.value)
        assert refused.value.exit_code == EXIT_LOCKED
    assert _lock_is_free(tmp_path / "x")


def test_verify_output_refuses_a_manifest_that_claims_what_is_not_on_disk(
    tmp_path: Path,
) -> None:
    from factory.errors import OutputWriteError
    from factory.io.runstate import verify_output
    from factory.io.writer import Manifest, ShardWriter

    w = ShardWriter(tmp_path, shard_rows=2)
    w.extend(
        {"conversations": [], "system": "", "tools": "[]", "id": str(i), "meta": "{}"}
        for i in range(3)
    )
    w.close()
    m = Manifest("r", "h")
    m.files.update(w.files)
    m.write(tmp_path, total=3, accepted=3)
    assert verify_output(tmp_path)["files"] == {
        "data/part-00000.parquet": 2,
        "data/part-00001.parquet": 1,
    }
    (tmp_path / "data" / "part-00009.parquet").write_bytes(b"someone else's")
    with pytest.raises(OutputWriteError, match=r"part-00009\.parquet: on disk but not written"):
        verify_output(tmp_path)
    (tmp_path / "data" / "part-00009.parquet").unlink()
    (tmp_path / "data" / "part-00001.parquet").unlink()
    with pytest.raises(OutputWriteError, match=r"part-00001\.parquet: listed in the manifest"):
        verify_output(tmp_path)


# -- end to end (Ray, development server) -------------------------------------------------


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        return pl.read_parquet(path).to_dicts()
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def assert_manifest_matches_disk(out: Path) -> dict[str, Any]:
    """Read every shard and reject file; the manifest and run.json claim exactly that."""
    manifest = json.loads((out / "manifest.json").read_text())
    state = json.loads((out / "run.json").read_text())
    on_disk = {
        p.relative_to(out).as_posix(): len(_rows(p))
        for sub in ("data", "surplus", "rejects", "failed", "candidates")
        for p in sorted((out / sub).rglob("*"))
        if p.is_file()
    }
    assert manifest["files"] == on_disk
    totals = manifest["totals"]

    def rows_under(prefix: str, exclude: str = "\0") -> int:
        return sum(n for f, n in on_disk.items() if f.startswith(prefix) and exclude not in f)

    assert rows_under("data/") == totals["accepted"]
    assert rows_under("surplus/") == totals["surplus"]
    assert rows_under("rejects/", exclude="/seeds/") == totals["rejected"]
    assert rows_under("failed/", exclude="/seeds/") == totals["failed"]
    data_ids = [r["id"] for f in on_disk if f.startswith("data/") for r in _rows(out / f)]
    assert len(data_ids) == len(set(data_ids)) == totals["accepted"]
    assert state["status"] == "done" and state["totals"] == totals
    return manifest


def _completed(log: Path) -> list[str]:
    entries = map(json.loads, log.read_text().splitlines())
    return [e["request_id"] for e in entries if e["completed"]]  # the factory's request ids


def _completed_twice(log: Path) -> list[str]:
    seen: dict[str, int] = {}
    for h in _completed(log):
        seen[h] = seen.get(h, 0) + 1
    return [h for h, n in seen.items() if n > 1]


@contextlib.contextmanager
def paused(server: Any) -> Iterator[None]:
    """Hold every generation slot of an in-process devserver: requests queue (as on a
    saturated server) until the block ends, so a run stays mid-flight for as long as
    the test needs, however slow the machine."""
    state, loop = server._server.state, server._loop
    n = server.config.max_concurrency

    async def take() -> None:
        for _ in range(n):
            await state.slots.acquire()

    asyncio.run_coroutine_threadsafe(take(), loop).result(timeout=DEADLINE_S)
    try:
        yield
    finally:

        def release() -> None:
            for _ in range(n):
                state.slots.release()

        loop.call_soon_threadsafe(release)


@pytest.mark.ray
def test_a_retried_submission_is_refused_and_the_first_run_ends_with_what_it_claims(
    ray_session, devserver, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(seed=31, latency_ms=50, max_concurrency=8, request_log=str(log))
    out = tmp_path / "o"
    args = cli_args(
        out,
        *dev_overrides(server.url, target=40),
        "prefilter.enabled=false",
        "output.shard_rows=5",
        "llm.concurrency=4",
        "llm.per_actor_concurrency=2",
        "llm.timeout_s=600",  # requests wait out the pause below
    )
    first_log = tmp_path / "first.log"  # a file, not a pipe: Ray's chatter cannot block it
    with paused(server):  # the first run's calls queue at the server until the block ends
        with first_log.open("w") as err:
            first = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            _wait(
                lambda: server.stats()["waiting"] > 0 or first.poll() is not None,
                "the first run to send its calls",
            )
            assert first.poll() is None, first_log.read_text()[-2000:]
            before = _snapshot(out)  # the first run is mid-round: it writes nothing now
            second = subprocess.run(
                args, capture_output=True, text=True, env=_env(), timeout=DEADLINE_S
            )
            assert second.returncode == EXIT_LOCKED, second.stderr[-2000:]
            assert str(out) in second.stderr and f"pid {first.pid}" in second.stderr
            assert _snapshot(out) == before  # the refused run deleted and rewrote nothing
            assert first.poll() is None
        except BaseException:
            first.kill()
            first.wait()
            raise
    first.wait(timeout=DEADLINE_S)
    assert first.returncode == 0, first_log.read_text()[-2000:]
    manifest = assert_manifest_matches_disk(out)
    assert manifest["totals"]["accepted"] == 40 and len(manifest["files"]) >= 8
    assert _completed_twice(log) == []  # the refused run paid for nothing


@pytest.mark.ray
def test_raising_the_target_of_a_finished_run_continues_it_paying_only_for_new_rows(
    ray_session, devserver, tmp_path: Path
) -> None:
    from factory.engine.runner import run

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=32, request_log=str(log), defects={"malformed_json": 0.3})
    out = tmp_path / "o"
    first = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=20)), out, progress=False
    )
    assert first.totals["accepted"] == 20 and first.exit_code == 0
    assert first.manifest["calls"]["issued"] > 20  # malformed answers: more calls than rows
    paid_first = cache_entries(out)

    more = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=45)), out, progress=False
    )
    assert more.extra["mode"] == "resume" and more.exit_code == 0
    assert more.totals["accepted"] == 45
    assert more.manifest["responses_from_cache"] == paid_first  # every paid answer reused
    assert _completed_twice(log) == []  # and none requested again
    assert_manifest_matches_disk(out)

    again = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=45)), out, progress=False
    )
    assert "already complete" in again.extra["report"]


@pytest.mark.ray
def test_fresh_keeps_the_paid_cache_unless_asked_to_drop_it(
    ray_session, devserver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from factory.engine.runner import run

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=33, request_log=str(log))
    out = tmp_path / "o"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=12))
    run(cfg, out, progress=False)
    paid = cache_entries(out)
    requests = len(_completed(log))

    caplog.set_level(logging.INFO, logger="factory.io.runstate")
    again = recipe("airline.yaml", out, *dev_overrides(server.url, target=12))
    fresh = run(again, out, fresh=True, progress=False)
    assert fresh.extra["mode"] == "new"
    assert fresh.manifest["responses_from_cache"] == paid
    assert len(_completed(log)) == requests  # nothing paid again
    assert "kept its response cache" in caplog.text and "--drop-cache" in caplog.text
    assert_manifest_matches_disk(out)

    caplog.clear()
    dropped = run(
        recipe("airline.yaml", out, *dev_overrides(server.url, target=12)),
        out,
        fresh=True,
        drop_cache=True,
        progress=False,
    )
    assert "its response cache included" in caplog.text
    assert dropped.manifest["responses_from_cache"] == 0
    assert len(_completed(log)) == 2 * requests  # asked for: every call paid again
