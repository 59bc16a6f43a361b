"""ResponseCache: round trips on every kind of store, concurrent writers, torn and
corrupted segments, SIGKILL mid-write, buffered object-store segments, refresh pacing."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.errors import ConfigError
from factory.io.cache import (
    ResponseCache,
    completion_from_record,
    completion_to_record,
    decode_line,
    encode_line,
)
from factory.llm.types import Completion, Usage
from tests.conftest import ROOT as REPO_ROOT

ROOT = REPO_ROOT


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def memory_fs() -> pafs.FileSystem:
    return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))


def record(i: int, size: int = 64) -> dict[str, Any]:
    return {
        "text": f"answer {i} " + "x" * size,
        "usage": {"prompt_tokens": i, "completion_tokens": 2 * i},
        "cost_usd": i / 1000,
        "model": "m",
        "fingerprint": None,
    }


def rid(i: int) -> str:
    return f"amplify-{i:032x}"


# Every kind of store: local logs, local/memory segments, memory append streams.
STORES = [
    "local", "file-uri", "subtree-local", "local-segments", "memory-segments", "memory-append"
]  # fmt: skip


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    kind = request.param
    if kind == "local":
        yield tmp_path / "cache", {}
    elif kind == "file-uri":
        yield f"file://{tmp_path}/cache", {}
    elif kind == "subtree-local":
        yield (pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), "cache"), {}
    elif kind == "local-segments":
        yield str(tmp_path / "cache"), {"append": False, "segment_entries": 3}
    else:
        fs, root = memory_fs(), f"/{uuid.uuid4().hex}/cache"
        yield (fs, root), ({"append": True} if kind == "memory-append" else {"segment_entries": 3})
        fs.delete_dir_contents(root.split("/cache")[0], missing_dir_ok=True)


@pytest.fixture
def opened() -> Iterator[Callable[..., ResponseCache]]:
    """``opened(location, **kw)``: a cache closed at teardown (no stray flusher threads)."""
    caches: list[ResponseCache] = []

    def open_(location: Any, **kw: Any) -> ResponseCache:
        caches.append(ResponseCache(location, **kw))
        return caches[-1]

    yield open_
    for c in caches:
        c.close()


def test_round_trip_and_persistence(store: tuple[Any, dict[str, Any]], opened) -> None:
    location, kw = store
    cache = opened(location, **kw)
    assert cache.get(rid(0)) is None and rid(0) not in cache and len(cache) == 0
    for i in range(7):
        cache.put(rid(i), record(i))
    assert [cache.get(rid(i)) for i in range(7)] == [record(i) for i in range(7)]
    assert rid(6) in cache and len(cache) == 7
    cache.put(rid(3), {"different": True})  # known id: not written again
    assert cache.get(rid(3)) == record(3)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.puts) == (8, 1, 7)
    assert cache.stats.duplicates == 1
    cache.close()
    with pytest.raises(RuntimeError, match="closed"):
        cache.put(rid(99), record(99))
    again = opened(location, **kw)
    assert len(again) == 7
    assert [again.get(rid(i)) for i in range(7)] == [record(i) for i in range(7)]
    assert again.stats.torn == 0


def test_kind_of_store_follows_the_filesystem(tmp_path: Path, opened) -> None:
    local = opened(tmp_path / "a")
    local.put("k", {"v": 1})
    assert os.listdir(tmp_path / "a") == [f"{local.writer_id}.jsonl"]
    fs, root = memory_fs(), f"/{uuid.uuid4().hex}"
    remote = opened((fs, root), segment_entries=2)
    for i in range(5):
        remote.put(rid(i), record(i))
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(root)))
    assert names == [f"{remote.writer_id}-{n:08d}.jsonl" for n in range(2)]
    assert remote.get(rid(4)) == record(4)  # still buffered, served from memory


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(key=st.text(min_size=1), value=st.dictionaries(st.text(), JSON, max_size=5))
def test_any_json_record_survives_the_line_format(key: str, value: dict[str, Any]) -> None:
    line = encode_line(key, value)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["v"] == value  # each line is plain JSON for other tools
    assert decode_line(line[:-1], key) == value
    assert decode_line(line[:-1], key + "x") is None
    assert decode_line(line[: len(line) // 2], key) is None


NOT_JSON = [{"x": float("nan")}, {"x": float("inf")}, {"x": object()}, ["not", "a", "dict"]]


@pytest.mark.parametrize("bad", NOT_JSON, ids=["nan", "inf", "an-object", "a-list"])
def test_put_rejects_what_is_not_a_json_object(tmp_path: Path, opened, bad: Any) -> None:
    cache = opened(tmp_path)
    with pytest.raises((TypeError, ValueError)):
        cache.put("k", bad)
    assert len(cache) == 0 and cache.stats.puts == 0


def test_racing_writers_keep_the_first_line_read(tmp_path: Path, opened) -> None:
    a, b = opened(tmp_path, writer_id="a"), opened(tmp_path, writer_id="b")
    a.put("same", {"who": "a"})
    b.put("same", {"who": "b"})  # b had not seen a's entry: both are on disk
    reader = opened(tmp_path)
    assert reader.get("same") == {"who": "a"} and len(reader) == 1


def _write_many(location: str, worker: int, n: int) -> None:
    with ResponseCache(location) as cache:
        for i in range(n):
            cache.put(rid(worker * 10_000 + i), record(i, size=200))


@pytest.mark.slow
def test_concurrent_writer_processes(tmp_path: Path, opened) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w, 500)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(os.listdir(tmp_path)) == 4  # one log per writer
    reader = opened(tmp_path)
    assert len(reader) == 2000
    for w in range(4):
        for i in range(500):
            assert reader.get(rid(w * 10_000 + i)) == record(i, size=200)
    assert reader.stats.torn == 0 and reader.stats.pending_bytes == 0


def _flip_checksum(line: bytes) -> bytes:
    return line.replace(line[6:14], b"%08x" % ((int(line[6:14], 16) + 1) % 2**32), 1)


def _flip_value(line: bytes) -> bytes:
    return line.replace(b"answer", b"answeR", 1)


TAILS: dict[str, tuple[Callable[[bytes], bytes], int, int]] = {
    # name: (tail from a valid line, torn lines counted, pending bytes left)
    "garbage-line": (lambda line: b"\x00\xffnot json at all\n", 1, 0),
    "garbage-unterminated": (lambda line: b'{"c":"0000', 0, 10),
    "truncated-line": (lambda line: line[: len(line) // 2], 0, -1),
    "truncated-terminated": (lambda line: line[: len(line) // 2] + b"\n", 1, 0),
    "wrong-checksum": (_flip_checksum, 1, 0),
    "value-changed": (_flip_value, 1, 0),
    "valid-but-unterminated": (lambda line: line[:-1], 0, 0),
}


@pytest.mark.parametrize("tail", list(TAILS))
def test_torn_or_corrupted_tail_is_ignored(tmp_path: Path, opened, tail: str) -> None:
    make, torn, pending = TAILS[tail]
    writer = opened(tmp_path, writer_id="w")
    for i in range(3):
        writer.put(rid(i), record(i))
    writer.close()
    bad = make(encode_line(rid(3), record(3)))
    with open(tmp_path / "w.jsonl", "ab") as f:
        f.write(bad)
    reader = opened(tmp_path)
    assert [reader.get(rid(i)) for i in range(3)] == [record(i) for i in range(3)]
    expected_valid = tail == "valid-but-unterminated"
    assert reader.get(rid(3)) == (record(3) if expected_valid else None)
    assert reader.stats.torn == torn
    assert reader.stats.pending_bytes == (len(bad) if pending < 0 else pending)
    # The same writer restarting never glues its next line onto the torn one.
    restarted = opened(tmp_path, writer_id="w")
    restarted.put(rid(4), record(4))
    restarted.close()
    later = opened(tmp_path)
    assert later.get(rid(4)) == record(4)
    assert len(later) == (5 if expected_valid else 4)
    assert later.stats.pending_bytes == 0


def test_a_put_after_a_write_torn_by_a_full_disk_is_readable(
    tmp_path: Path, opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk takes part of a line, then refuses the rest (ENOSPC): that put fails.
    The next put that succeeds must not be glued onto the torn bytes (issue 33: a put
    that had returned was unreadable, its answer paid again by the resume)."""
    import errno

    import factory.io.segments as segments

    real_write = os.write
    fail = {"armed": False}

    def full_disk_write(fd: int, data: Any) -> int:
        if fail["armed"]:
            if fail.get("written"):
                fail["armed"] = False
                raise OSError(errno.ENOSPC, "No space left on device")
            fail["written"] = True
            return real_write(fd, bytes(data)[: len(data) // 2])
        return real_write(fd, data)

    monkeypatch.setattr(segments.os, "write", full_disk_write)
    writer = opened(tmp_path, writer_id="w")
    writer.put(rid(0), record(0))
    fail["armed"] = True
    with pytest.raises(OSError):
        writer.put(rid(1), record(1))
    writer.put(rid(2), record(2))  # the disk has room again
    assert writer.get(rid(2)) == record(2)
    writer.close()
    reader = opened(tmp_path)
    assert [reader.get(rid(i)) for i in range(3)] == [record(0), None, record(2)]
    assert reader.stats.torn == 1


def test_garbage_inside_an_object_segment_spares_the_other_lines(opened) -> None:
    fs, root = memory_fs(), f"/{uuid.uuid4().hex}"
    lines = [encode_line(rid(i), record(i)) for i in range(3)]
    with fs.open_output_stream(f"{root}/x-00000000.jsonl") as f:
        f.write(lines[0] + b"junk\n" + _flip_value(lines[1]) + lines[2])
    reader = opened((fs, root))
    assert [reader.get(rid(i)) for i in range(3)] == [record(0), None, record(2)]
    assert reader.stats.torn == 2


def test_a_line_changed_after_indexing_is_a_miss_not_a_wrong_value(tmp_path, opened) -> None:
    writer = opened(tmp_path, writer_id="w")
    writer.put(rid(0), record(0))
    writer.close()
    reader = opened(tmp_path)
    assert rid(0) in reader
    path = tmp_path / "w.jsonl"
    path.write_bytes(_flip_value(path.read_bytes()))
    assert reader.get(rid(0)) is None
    assert reader.stats.torn == 1 and rid(0) not in reader


KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from factory.io.cache import ResponseCache
    cache = ResponseCache(sys.argv[1], writer_id="victim")
    i = 0
    while True:
        cache.put(f"amplify-{i:032x}", {"i": i, "text": "y" * (1000 + i % 5000)})
        i += 1
    """
)


@pytest.mark.slow
def test_writer_killed_mid_loop_leaves_a_valid_prefix(tmp_path: Path, opened) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=ROOT)
    log = tmp_path / "victim.jsonl"
    deadline = time.monotonic() + 30
    while not (log.exists() and log.stat().st_size > 2_000_000):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    reader = opened(tmp_path)
    n = len(reader)
    assert n > 100
    for i in range(n):  # a prefix, each entry intact
        assert reader.get(f"amplify-{i:032x}") == {"i": i, "text": "y" * (1000 + i % 5000)}
    assert reader.get(f"amplify-{n:032x}") is None
    assert reader.stats.torn == 0


def test_object_store_buffers_segments_until_count_time_or_close(opened) -> None:
    fs, root, clock = memory_fs(), f"/{uuid.uuid4().hex}/c", Clock()
    writer = opened((fs, root), writer_id="w", segment_entries=5, clock=clock)
    reader = opened((fs, root), refresh_interval_s=0)
    for i in range(12):
        writer.put(rid(i), record(i))
    assert writer.stats.segments_written == 2 and len(writer) == 12
    assert len(reader) == 10 and reader.get(rid(11)) is None  # 2 still buffered
    clock.now += 5.0  # the buffer is now due: the next put writes it
    writer.put(rid(12), record(12))
    assert writer.stats.segments_written == 3 and len(reader) == 13
    writer.put(rid(13), record(13))
    writer.close()
    assert len(reader) == 14 and reader.get(rid(13)) == record(13)
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(root)))
    assert names == [f"w-{n:08d}.jsonl" for n in range(4)]
    # A restarted writer with the same id continues the numbering: no segment is overwritten.
    again = opened((fs, root), writer_id="w", segment_entries=5, clock=clock)
    again.put(rid(14), record(14))
    again.close()
    assert fs.get_file_info(f"{root}/w-00000004.jsonl").size > 0
    assert len(reader) == 15 and reader.get(rid(2)) == record(2)


def test_flusher_thread_writes_an_idle_buffer(opened) -> None:
    fs, root, clock = memory_fs(), f"/{uuid.uuid4().hex}", Clock()
    writer = opened((fs, root), segment_interval_s=0.2, clock=clock)
    writer.put(rid(0), record(0))
    time.sleep(0.2)
    assert writer.stats.segments_written == 0  # not due on its clock yet
    clock.now += 0.2
    deadline = time.monotonic() + 5
    while writer.stats.segments_written == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert opened((fs, root)).get(rid(0)) == record(0)


def test_a_writer_that_dies_loses_only_its_buffer(opened) -> None:
    fs, root = memory_fs(), f"/{uuid.uuid4().hex}"
    writer = opened((fs, root), segment_entries=4, clock=Clock())  # time never triggers
    for i in range(10):
        writer.put(rid(i), record(i))
    # Before close(): what a crash would leave behind.
    reader = opened((fs, root))
    assert len(reader) == 8 and reader.get(rid(8)) is None


def test_segment_cache_is_bounded(opened) -> None:
    fs, root = memory_fs(), f"/{uuid.uuid4().hex}"
    with ResponseCache((fs, root), segment_entries=10) as writer:
        for i in range(100):
            writer.put(rid(i), record(i, size=1000))
    bound = 40_000  # one segment is ~11 KB; the LRU keeps whole segments up to bound / 4
    reader = opened((fs, root), segment_cache_bytes=bound)
    assert all(reader.get(rid(i)) == record(i, size=1000) for i in range(100))
    assert reader._store._cached <= bound


def test_refresh_sees_other_writers_and_misses_are_paced(tmp_path: Path, opened) -> None:
    clock = Clock()
    reader = opened(tmp_path, clock=clock)
    writer = opened(tmp_path)
    assert reader.get("x") is None and reader.stats.refreshes == 1
    writer.put("x", {"v": 1})
    for _ in range(100):  # a hot loop of misses re-lists nothing within the interval
        assert reader.get("x") is None
    assert "x" not in reader and reader.stats.refreshes == 1
    clock.now += 1.0
    assert reader.get("x") == {"v": 1} and reader.stats.refreshes == 2
    writer.put("y", {"v": 2})
    reader.refresh()  # explicit: always looks
    assert "y" in reader and reader.stats.refreshes == 3
    assert (reader.stats.hits, reader.stats.misses) == (1, 101)


def test_pickled_cache_is_a_fresh_writer_on_the_same_store(tmp_path: Path, opened) -> None:
    cache = opened(tmp_path, writer_id="original")
    cache.put("k", {"v": 1})
    copy = pickle.loads(pickle.dumps(cache))
    try:
        assert copy.get("k") == {"v": 1} and copy.writer_id != "original"
        copy.put("k2", {"v": 2})
    finally:
        copy.close()
    assert len(os.listdir(tmp_path)) == 2


@pytest.mark.parametrize(
    ("location", "kw", "key_path"),
    [
        ("nosuchscheme://bucket/x", {}, "cache.location"),
        ("cache", {"refresh_interval_s": -1}, "cache.refresh_interval_s"),
        ("cache", {"segment_entries": 0}, "cache.segment_entries"),
        ("cache", {"writer_id": "../escape"}, "cache.writer_id"),
    ],
)
def test_bad_settings_are_config_errors(tmp_path, location: str, kw, key_path: str) -> None:
    loc = location if "://" in location else tmp_path / location
    with pytest.raises(ConfigError) as info:
        ResponseCache(loc, **kw)
    assert info.value.key_path == key_path


def test_completion_record_round_trip(tmp_path: Path, opened) -> None:
    c = Completion(
        text="hi", reasoning=None, usage=Usage(input=3), cost_usd=0.5, endpoint="e0",
        attempts=2, latency_s=1.5, model="m", system_fingerprint="fp", finish_reason="stop",
    )  # fmt: skip
    cache = opened(tmp_path)
    cache.put("k", completion_to_record(c))
    assert completion_from_record(opened(tmp_path).get("k") or {}) == c
    with pytest.raises(ValueError, match="text"):
        completion_from_record({"model": "m"})


def test_line_checksum_covers_the_raw_bytes() -> None:
    line = encode_line("k", {"a": 1})
    assert int(line[6:14], 16) == zlib.crc32(line[16:-1])
