"""A paid response is never dropped: a cache that refuses writes stops the run cleanly.

The portable fault is a cache path under a regular file (every write fails with
ENOTDIR, for root too, unlike a read-only folder); where the test runs as root, a
real 64 KiB tmpfs fills up mid-run (ENOSPC) for the cache, and for the shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.errors import EXIT_INCOMPLETE, EXIT_OK, EXIT_WRITE
from factory.io.cache import ResponseCache, decode_line
from factory.run import main
from tests.conftest import ROOT
from tests.helpers import amplify_stage, dev_overrides, recipe

# What this work adds is imported where used, so that against the original code each
# test fails on its own assertion, not on an import.
UNSTORED_DIR = "unstored"

PRICE = (
    "prices={factory-dev: {input_per_mtok: 2.0, cached_input_per_mtok: 2.0, output_per_mtok: 8.0}}"
)


def _broken_cache(tmp_path: Path) -> Path:
    """A cache location no process can create: its parent is a regular file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's parent folder should be\n")
    return blocker / "cache"


def _completed(log: Path) -> list[str]:
    entries = map(json.loads, log.read_text().splitlines())
    return [e["request_id"] for e in entries if e["completed"]]  # the factory's request ids


def _unstored_lines(out: Path) -> list[bytes]:
    return [
        line
        for f in sorted((out / UNSTORED_DIR).glob("*.jsonl"))
        for line in f.read_bytes().splitlines()
    ]


def test_a_refused_cache_write_keeps_the_answer_counts_it_and_stops_new_calls(
    devserver, tmp_path: Path
) -> None:
    """The LLM stage alone (no Ray): the answer rides on its row, the budget sees its
    cost, and the actor starts no call after the failure."""
    from factory.core.trajectory import Trajectory

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=41, latency_ms=20, request_log=str(log))
    cache_path = _broken_cache(tmp_path)
    cfg = recipe(
        "airline.yaml",
        tmp_path / "o",
        *dev_overrides(server.url, target=12),
        PRICE,
        f"cache.path={cache_path}",
        "llm.concurrency=2",
        "llm.per_actor_concurrency=2",
        "ray.actors=1",
    )
    from factory.core.formats import parse_record

    lines = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[:3]
    seeds: dict[str, str] = {}
    for i, line in enumerate(lines):
        traj: Trajectory = parse_record(json.loads(line), source=f"s:{i}")
        seeds[traj.id] = traj.to_json()
    stage = amplify_stage(cfg, seeds)

    async def calls() -> list[dict[str, Any]]:
        try:
            return await stage.arun_rows(
                [{"status": "ok", "call_index": i, "id": None} for i in range(12)]
            )
        finally:
            await stage.backend.aclose()  # on the loop that opened its sessions

    rows = asyncio.run(calls())
    assert stage.cache is not None
    stage.cache.close()

    kept = [r for r in rows if r.get("unstored")]
    unissued = [r for r in rows if r["status"] == "unissued"]
    assert kept and unissued and len(kept) + len(unissued) == 12
    assert len(kept) <= 2  # at most the calls in flight when the first write failed
    assert {r["reason"] for r in unissued} == {"cache_write"}
    assert all(str(cache_path.parent) in r["message"] for r in unissued)
    assert len(_completed(log)) == len(kept)  # every paid answer is on a row
    for r in kept:
        info = json.loads(r["unstored"])
        assert info["record"]["text"] == r["completion"] and r["cost_usd"] > 0
        assert "ENOTDIR" in info["error"] and str(cache_path.parent) in info["error"]
    assert all(r["cost_usd"] > 0 and r["paid_usd"] == r["cost_usd"] for r in kept)
    assert sum(r.get("calls") or 0 for r in rows) == len(kept)  # what the run's ledger counts


def test_unstored_answers_are_kept_in_cache_format_and_stored_by_the_next_run(
    tmp_path: Path,
) -> None:
    from factory.io.runstate import restore_unstored, save_unstored

    cfg = recipe("airline.yaml", tmp_path / "o")
    out = tmp_path / "o"
    entries = [(f"amplify-{i}", {"text": f"answer {i}", "cost_usd": 0.01}) for i in range(3)]
    assert save_unstored(out, entries[:2]).startswith(str(out / UNSTORED_DIR))
    save_unstored(out, entries[2:])
    lines = _unstored_lines(out)
    assert [decode_line(line, f"amplify-{i}") for i, line in enumerate(lines)] == [
        record for _, record in entries
    ]
    assert restore_unstored(cfg, out) == 3
    assert not list((out / UNSTORED_DIR).glob("*.jsonl"))
    with ResponseCache(out / "cache") as cache:
        assert cache.get("amplify-1") == {"text": "answer 1", "cost_usd": 0.01}


def test_unstored_answers_fall_back_to_the_caches_folder_never_tmp_and_a_broken_cache_waits(
    tmp_path: Path,
) -> None:
    """When ``OUT/unstored/`` cannot be written, the answers go to the cache's own folder
    (never a temporary folder a resume would not read) and the next run stores them."""
    from factory.errors import OutputWriteError
    from factory.io.runstate import restore_unstored, save_unstored

    out = tmp_path / "o"
    out.mkdir()
    (out / UNSTORED_DIR).write_text("a file where the folder should be")
    cache = tmp_path / "cache"
    where = save_unstored(out, [("amplify-x", {"text": "paid"})], cache_dir=cache)
    assert where == str(cache / UNSTORED_DIR) + "/"
    assert not list(Path(tempfile.gettempdir()).glob("factory-unstored-*"))
    cfg = recipe("airline.yaml", out, f"cache.path={cache}")
    assert restore_unstored(cfg, out) == 1  # the resume reads them back from there
    with ResponseCache(cache) as stored:
        assert stored.get("amplify-x") == {"text": "paid"}
    (out / UNSTORED_DIR).unlink()
    save_unstored(out, [("amplify-y", {"text": "paid"})])
    broken = recipe("airline.yaml", out, f"cache.path={_broken_cache(tmp_path)}")
    with pytest.raises(OutputWriteError) as info:
        restore_unstored(broken, out)
    assert "not-a-folder" in str(info.value) and info.value.exit_code == EXIT_WRITE
    assert len(_unstored_lines(out)) == 1  # still kept for the next try


def test_exit_codes_tell_done_from_capped_short_and_failed_writes(tmp_path: Path) -> None:
    from factory.engine.runner import RunResult

    assert RunResult(tmp_path, {}, {}).exit_code == EXIT_OK
    assert RunResult(tmp_path, {}, {}, stopped_by="max_cost_usd").exit_code == 4
    assert RunResult(tmp_path, {}, {}, stopped_by="no_progress").exit_code == EXIT_INCOMPLETE
    failed = RunResult(tmp_path, {}, {}, stopped_by="cache_write", error="cannot store ...")
    assert failed.exit_code == EXIT_WRITE


# -- end to end (Ray, development server, the CLI) ------------------------------------------


def _cli(server_url: str, out: Path, *overrides: str) -> list[str]:
    sets = [*dev_overrides(server_url, target=20), PRICE, *overrides]
    return [
        str(ROOT / "pipelines/airline.yaml"),
        "-o",
        str(out),
        "--no-progress",
        *[x for o in sets for x in ("--set", o)],
    ]


@pytest.mark.ray
@pytest.mark.parametrize("judge", [False, True], ids=["amplify", "judge"])
def test_a_cache_that_refuses_writes_stops_the_run_with_exit_7_and_loses_no_paid_answer(
    ray_session, devserver, tmp_path: Path, capsys: pytest.CaptureFixture[str], judge: bool
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(seed=42, latency_ms=20, request_log=str(log))
    out = tmp_path / "o"
    broken = _broken_cache(tmp_path)
    common = (
        f"prefilter.enabled={str(judge).lower()}",
        "amplify.max_cost_usd=50",  # a budget actor watches the spend
        "llm.concurrency=4",
        "llm.per_actor_concurrency=2",
    )
    code = main(_cli(server.url, out, *common, f"cache.path={broken}"))
    err = capsys.readouterr().err
    assert code == EXIT_WRITE, err[-2000:]
    assert "internal error" not in err
    assert "cannot store LLM responses in the cache" in err
    assert str(broken.parent) in err and "Not a directory" in err

    paid = _completed(log)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["unstored"]["responses"] == len(paid) > 0
    assert len(_unstored_lines(out)) == len(paid)  # every paid answer kept, in cache format
    assert len(paid) <= 4  # the calls in flight when the writes failed: no new call after
    assert manifest["tokens"]["completion_tokens"] > 0 and manifest["cost_usd"] > 0
    assert manifest["cost_usd_paid_this_run"] == pytest.approx(manifest["cost_usd"])
    # The run-wide budget counted them (its snapshot at the end of the run).
    assert manifest["budget"]["cost_usd"] == pytest.approx(manifest["cost_usd"])
    assert manifest["budget"]["calls"] == len(paid)
    assert manifest["target"] == {"requested": 20, "reached": False, "stopped_by": "cache_write"}
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "stopped" and state["stopped_by"] == "cache_write"

    # The cache works again (another place): the kept answers are stored first, so none
    # of them is requested again, and the run finishes.
    code = main(_cli(server.url, out, *common, f"cache.path={tmp_path / 'cache'}"))
    assert code == EXIT_OK, capsys.readouterr().err[-2000:]
    # every kept answer went into the cache (only the room reserved for them remains)
    assert not list((out / UNSTORED_DIR).glob("*.jsonl"))
    again = _completed(log)
    assert len(again) == len(set(again))  # no completed request was issued twice


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "64k") -> Iterator[Path]:
    """A real filesystem that fills up (root only; skips elsewhere)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.ray
def test_a_cache_on_a_full_disk_exits_7_naming_the_path_and_enospc(
    ray_session, devserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "requests.jsonl"
    server = devserver(seed=43, latency_ms=20, request_log=str(log))
    out = tmp_path / "o"
    with tiny_tmpfs(tmp_path / "full") as full:
        code = main(
            _cli(
                server.url,
                out,
                "prefilter.enabled=false",
                "amplify.target=60",
                f"cache.path={full / 'cache'}",
            )
        )
        err = capsys.readouterr().err
        assert code == EXIT_WRITE, err[-2000:]
        assert str(full) in err and "No space left on device" in err
        with ResponseCache(full / "cache") as cache:
            stored = len(cache)
        kept = len(_unstored_lines(out))
    assert stored > 0 and kept > 0  # the disk filled up mid-run
    assert stored + kept == len(_completed(log))  # every paid answer is somewhere


@pytest.mark.ray
def test_a_full_output_disk_exits_7_naming_the_shard_and_keeps_every_paid_answer(
    ray_session, devserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output folder and its cache on one volume that fills up mid-run (issue 33's
    fault run: 2 answers that arrived while the run stopped were in neither the cache
    nor ``OUT/unstored/``, and the resume paid them again). Every answer the server
    completed is readable in the cache, kept in ``unstored/``, or (last resort) printed
    on the terminal; the error is one line naming the file, and the kept answers are
    counted under it."""
    log = tmp_path / "requests.jsonl"
    server = devserver(seed=44, latency_ms=20, request_log=str(log))
    with tiny_tmpfs(tmp_path / "full", size="160k") as full:
        out = full / "o"
        code = main(
            _cli(
                server.url,
                out,
                "prefilter.enabled=false",
                "amplify.target=200",
                "output.shard_rows=20",
                "llm.concurrency=8",
                "llm.per_actor_concurrency=4",
            )
        )
        err = capsys.readouterr().err
        with ResponseCache(out / "cache") as cache:
            stored = {rid for rid in _completed(log) if cache.get(rid) is not None}
        kept = {json.loads(line)["k"] for line in _unstored_lines(out)}
    printed = {
        json.loads(line)["k"] for line in err.splitlines() if line.startswith('{"c":')
    }  # the last resort: the terminal, in the cache's line format
    assert code == EXIT_WRITE, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(out) in errors[0], err[-2000:]  # a shard, the cache ...
    assert "No space left on device" in err and "internal error" not in err
    paid = set(_completed(log))
    assert paid and paid - stored - kept - printed == set()  # every paid answer is somewhere
    if kept or printed:
        assert f"{len(kept | printed)} paid responses are counted" in err, err[-2000:]
