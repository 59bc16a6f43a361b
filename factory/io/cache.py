"""Content-addressed cache of LLM responses: no completed request is paid for twice.

Keys are request ids (``stage_llm.request_id``: same inputs, same id on every
rerun). The store is a folder of segment files, local or behind any
``pyarrow.fs`` filesystem (``s3://``, ``gs://``, an fsspec filesystem ...),
shared by every worker on every node. It is append-only and needs no lock
because each writer writes only its own files:

* append stores (a local folder; any filesystem with ``append=True``): one log
  ``<writer>.jsonl`` per writer, one ``write`` + flush per ``put``;
* object stores (S3 and every other non-local filesystem by default, since they
  cannot append): the writer buffers lines and writes immutable objects
  ``<writer>-<seq:08d>.jsonl`` every ``segment_entries`` entries or
  ``segment_interval_s`` seconds (a background thread) and at ``flush``/``close``.

One line per entry, itself a JSON object, checksummed over its raw bytes::

    {"c":"<crc32 of the bytes after the comma, 8 hex>","k":"<request id>","v":{...record...}}

A reader accepts a line only if its checksum matches, so a torn last line,
appended garbage or a flipped byte is skipped (counted in ``stats.torn``),
never raised and never returned. An unterminated last line is left pending (its
writer may be mid-write) unless its checksum already matches. The first line
read for an id wins; racing writers store identical content anyway.

Durability (what a crash loses; lost requests are simply issued again):

* append stores: after ``put`` returns, the entry is in the OS (survives
  ``kill -9``/OOM of the writer). It is fsynced at the first ``put`` or flusher
  tick at least ``fsync_interval_s`` after the previous fsync, and at
  ``close``; an OS crash or power loss can lose the last ``fsync_interval_s``
  seconds (``fsync_interval_s=0``: fsync inside every ``put``).
* object stores: an entry is durable once its segment object is written;
  a crash loses the unflushed buffer, fewer than ``segment_entries`` entries
  and no older than ``segment_interval_s`` seconds (plus one flusher tick).

Memory: the index holds id -> (segment, offset, length), ~230 bytes per entry
(100k entries ~ 23 MB) whatever the record size; ``get`` reads the one line
(local ``pread``). On other filesystems whole segments are cached in an LRU
bounded by ``segment_cache_bytes`` (default 64 MiB); the write buffer holds at
most ``segment_entries`` lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.errors import ConfigError, short
from factory.io.segments import _SUFFIX, Location, _Appender, _ArrowStore, _open_store

if TYPE_CHECKING:  # the OpenAI SDK is imported only by code that calls an LLM
    from factory.llm.types import Completion

__all__ = [
    "CACHE_ID_FILE",
    "CacheStats",
    "ResponseCache",
    "cache_entries",
    "cache_identity",
    "completion_from_record",
    "completion_to_record",
    "decode_line",
    "encode_line",
]

_LINE = re.compile(rb'\{"c":"([0-9a-f]{8})",')
_PREFIX_LEN = 16  # len('{"c":"xxxxxxxx",')
_COST = re.compile(rb'"cost_usd":(-?[0-9][0-9.eE+-]*)')
_SCAN_CHUNK = 8 << 20
_DECODER = json.JSONDecoder()


@dataclass
class CacheStats:
    """Counters since construction. ``torn``: complete lines skipped as invalid;
    ``pending_bytes``: unterminated tails not (yet) accepted."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    duplicates: int = 0
    torn: int = 0
    refreshes: int = 0
    segments_written: int = 0
    pending_bytes: int = 0


def encode_line(request_id: str, record: Mapping[str, Any]) -> bytes:
    """One checksummed line (``\\n`` included). Raises TypeError/ValueError if not JSON."""
    for ascii_only in (False, True):  # lone surrogates cannot be UTF-8: escape them
        try:
            payload = (
                '"k":'
                + json.dumps(request_id, ensure_ascii=ascii_only)
                + ',"v":'
                + json.dumps(
                    record,
                    ensure_ascii=ascii_only,
                    separators=(",", ":"),
                    sort_keys=True,
                    allow_nan=False,
                )
                + "}"
            ).encode()
            break
        except UnicodeEncodeError:
            continue
    return b'{"c":"%08x",' % zlib.crc32(payload) + payload + b"\n"


def _verified_key(line: bytes) -> str | None:
    """The id of a line whose checksum matches, else None (torn, garbage, corrupted)."""
    m = _LINE.match(line)
    if m is None:
        return None
    payload = line[_PREFIX_LEN:]
    if zlib.crc32(payload) != int(m.group(1), 16) or not payload.startswith(b'"k":'):
        return None
    try:
        key, _ = _DECODER.raw_decode(payload.decode(), 4)
    except (UnicodeDecodeError, ValueError):
        return None
    return key if isinstance(key, str) else None


def decode_line(line: bytes, request_id: str) -> dict[str, Any] | None:
    """The record of a verified line for ``request_id``, else None."""
    if _verified_key(line) != request_id:
        return None
    try:
        value = json.loads(line)["v"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class _Segment:
    name: str
    scanned: int = 0  # bytes consumed: through the last accepted line
    size: int = 0


def _default_writer_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class ResponseCache:
    """Append-only response cache shared by processes and nodes (see module docstring).

    Args:
        location: a local folder, a ``pyarrow.fs`` URI (``s3://bucket/prefix``),
            or a ``(pyarrow.fs.FileSystem, path)`` pair.
        writer_id: names this writer's files; must be unique among live
            writers. Default: host-pid-random.
        append: ``None`` appends on local filesystems and writes immutable
            segments elsewhere; ``True``/``False`` forces one or the other.
        refresh_interval_s: a miss re-lists the store at most this often.
        fsync_interval_s: append stores: fsync at most this often (0: every put).
        segment_entries / segment_interval_s: object stores: write a segment
            when the buffer has this many entries or its oldest is this old.
        segment_cache_bytes: object stores: LRU bound on cached segment bytes.
        clock: monotonic seconds; injectable for tests.

    Raises:
        ConfigError: the location cannot be opened or a setting is out of range.
    """

    def __init__(
        self,
        location: Location,
        *,
        writer_id: str | None = None,
        append: bool | None = None,
        refresh_interval_s: float = 1.0,
        fsync_interval_s: float = 1.0,
        segment_entries: int = 64,
        segment_interval_s: float = 5.0,
        segment_cache_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for key, value, low in (
            ("refresh_interval_s", refresh_interval_s, 0),
            ("fsync_interval_s", fsync_interval_s, 0),
            ("segment_interval_s", segment_interval_s, 0),
            ("segment_entries", segment_entries, 1),
            ("segment_cache_bytes", segment_cache_bytes, 0),
        ):
            if value < low:
                raise ConfigError(f"must be at least {low}, got {value}", key_path=f"cache.{key}")
        if writer_id is not None and not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", writer_id):
            raise ConfigError(
                f"writer id {short(writer_id, 80)} may use only letters, digits, '_', '.', '-'",
                key_path="cache.writer_id",
            )
        self._args: dict[str, Any] = dict(
            append=append, refresh_interval_s=refresh_interval_s,
            fsync_interval_s=fsync_interval_s, segment_entries=segment_entries,
            segment_interval_s=segment_interval_s, segment_cache_bytes=segment_cache_bytes,
            clock=clock,
        )  # fmt: skip
        self._location = location
        self._store = _open_store(location, append, segment_cache_bytes)
        self._explicit_id = writer_id
        self._writer_id = writer_id or _default_writer_id()
        self._refresh_interval, self._fsync_interval = refresh_interval_s, fsync_interval_s
        self._segment_entries, self._segment_interval = segment_entries, segment_interval_s
        self._clock = clock
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        self._by_name: dict[str, int] = {}
        self._index: dict[str, tuple[int, int, int]] = {}
        self._pending: dict[str, bytes] = {}  # buffered, not yet in a segment object
        self._buffer: list[tuple[str, bytes]] = []
        self._buffer_since = 0.0
        self._next_seq = 0
        self._appender: _Appender | None = None
        self._log: _Segment | None = None
        self._last_sync = 0.0
        self._dirty = False
        self._last_refresh: float | None = None
        self._pid = os.getpid()
        self._writing = False
        self._closed = False
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self.stats = CacheStats()

    # -- reading ---------------------------------------------------------------------------

    def get(self, request_id: str) -> dict[str, Any] | None:
        """The cached record for ``request_id``, or None (refreshing first if due)."""
        with self._lock:
            if request_id not in self._index and request_id not in self._pending:
                self._refresh_if_due()
            record = self._lookup(request_id)
            if record is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
            return record

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            if not isinstance(request_id, str):
                return False
            if request_id not in self._index and request_id not in self._pending:
                self._refresh_if_due()
            return request_id in self._index or request_id in self._pending

    def __len__(self) -> int:
        """Distinct ids known, after a refresh if one is due."""
        with self._lock:
            self._refresh_if_due()
            return len(self._index) + sum(1 for k in self._pending if k not in self._index)

    def count(self, prefix: str = "") -> int:
        """Distinct ids starting with ``prefix`` (a stage's requests: ``"amplify-"``)."""
        with self._lock:
            self._refresh_if_due()
            ids = set(self._index) | set(self._pending)
            return sum(1 for i in ids if i.startswith(prefix))

    def spend(self, prefix: str = "") -> tuple[int, float]:
        """``(answers, usd)``: distinct ids starting with ``prefix`` and what their answers
        cost when they were paid (their records' ``cost_usd``, 0 where a record has none).

        Why: a resumed run gets these answers from the cache at no cost, and its plan says
        what was already paid and what is left to pay (``factory.preflight``, issue 39).
        The cost is read from each line's head without decoding the answer: a
        ``Completion`` record is written with sorted keys (``encode_line``), so its
        ``cost_usd`` comes before its text, and a JSON string holds no bare quote, so no
        text can pass for it.
        """
        with self._lock:
            self._refresh_if_due()
            answers, usd = 0, 0.0
            lines = [line for key, line in self._pending.items() if key.startswith(prefix)]
            for key, (i, offset, length) in self._index.items():
                if key.startswith(prefix) and key not in self._pending:
                    seg = self._segments[i]
                    lines.append(self._store.read(seg.name, offset, length, seg.size))
            for line in lines:
                answers += 1
                found = _COST.search(line)
                with contextlib.suppress(ValueError):
                    usd += float(found.group(1)) if found else 0.0
            return answers, usd

    def refresh(self) -> None:
        """Index the entries other writers added since the last look."""
        with self._lock:
            self._last_refresh = self._clock()
            self.stats.refreshes += 1
            for name, size in sorted(self._store.list().items()):
                seg = self._segment(name)
                seg.size = max(seg.size, size)
                if seg.size > seg.scanned:
                    self._scan(seg)
            self.stats.pending_bytes = sum(s.size - s.scanned for s in self._segments)

    def _refresh_if_due(self) -> None:
        if self._last_refresh is None or (
            self._clock() - self._last_refresh >= self._refresh_interval
        ):
            self.refresh()

    def _lookup(self, request_id: str) -> dict[str, Any] | None:
        line = self._pending.get(request_id)
        if line is not None:
            return decode_line(line.rstrip(b"\n"), request_id)
        loc = self._index.get(request_id)
        if loc is None:
            return None
        seg = self._segments[loc[0]]
        record = decode_line(self._store.read(seg.name, loc[1], loc[2], seg.size), request_id)
        if record is None:  # the file changed under us (truncated, rewritten): forget it
            del self._index[request_id]
            self.stats.torn += 1
        return record

    def _segment(self, name: str) -> _Segment:
        i = self._by_name.get(name)
        if i is None:
            i = self._by_name[name] = len(self._segments)
            self._segments.append(_Segment(name))
        return self._segments[i]

    def _scan(self, seg: _Segment) -> None:
        i, pos, buf = self._by_name[seg.name], seg.scanned, b""
        base = pos  # file offset of buf[0]
        while pos < seg.size:
            end = min(seg.size, pos + _SCAN_CHUNK)
            buf += self._store_range(seg, pos, end)
            pos = end
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                self._accept(i, buf[start:nl], base + start)
                start = nl + 1
            base, buf = base + start, buf[start:]
            seg.scanned = base
        if buf and self._accept(i, buf, base, tail=True):  # a complete line missing only "\n"
            seg.scanned = base + len(buf)

    def _store_range(self, seg: _Segment, start: int, end: int) -> bytes:
        if isinstance(self._store, _ArrowStore):
            return self._store.read_range(seg.name, start, end, seg.size)
        return self._store.read(seg.name, start, end - start, seg.size)

    def _accept(self, seg_index: int, line: bytes, offset: int, tail: bool = False) -> bool:
        if not line:
            return True
        key = _verified_key(line)
        if key is None:
            if not tail:
                self.stats.torn += 1
            return False
        self._index.setdefault(key, (seg_index, offset, len(line)))
        return True

    # -- writing ---------------------------------------------------------------------------

    def put(self, request_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` for ``request_id``; a no-op if the id is already known.

        Raises:
            TypeError / ValueError: ``record`` is not JSON (NaN included).
            RuntimeError: the cache is closed, or was forked with an explicit writer id.
            OSError: the store refused the write.
        """
        if not isinstance(request_id, str) or not isinstance(record, Mapping):
            raise TypeError("put(request_id: str, record: dict)")
        line = encode_line(request_id, record)
        with self._lock:
            if self._closed:
                raise RuntimeError("put() on a closed ResponseCache")
            self._check_fork()
            if request_id in self._index or request_id in self._pending:
                self.stats.duplicates += 1
                return
            self._start_writer()
            if self._store.appendable:
                self._append(request_id, line)
            else:
                self._pending[request_id] = line
                if not self._buffer:
                    self._buffer_since = self._clock()
                self._buffer.append((request_id, line))
                if len(self._buffer) >= self._segment_entries or self._buffer_due():
                    self._write_segment()
            self.stats.puts += 1

    def _append(self, request_id: str, line: bytes) -> None:
        assert self._appender is not None and self._log is not None
        offset = self._appender.size
        try:
            self._appender.write(line)
        except OSError:
            # Part of the line may be in the log (a full disk takes what fits): the next
            # put reopens it (``_start_writer``: its true size, a newline after a torn
            # tail). Appending behind the torn bytes glued the next entry to them, and a
            # put that had returned was unreadable (issue 33: answers paid again).
            self._drop_appender()
            raise
        self._appender.size += len(line)
        seg = self._log
        if seg.scanned == offset:
            seg.scanned = seg.size = self._appender.size
        self._index.setdefault(request_id, (self._by_name[seg.name], offset, len(line) - 1))
        self._dirty = True
        if self._clock() - self._last_sync >= self._fsync_interval:
            self._sync()

    def _sync(self) -> None:
        if self._appender is not None and self._dirty:
            self._appender.sync()
            self._dirty = False
        self._last_sync = self._clock()

    def _buffer_due(self) -> bool:
        return bool(self._buffer) and self._clock() - self._buffer_since >= self._segment_interval

    def _write_segment(self) -> None:
        if not self._buffer:
            return
        name = f"{self._writer_id}-{self._next_seq:08d}{_SUFFIX}"
        data = b"".join(line for _, line in self._buffer)
        self._store.write_object(name, data)
        self._next_seq += 1
        seg = self._segment(name)
        seg.size = seg.scanned = len(data)
        i, offset = self._by_name[name], 0
        for key, line in self._buffer:
            self._index.setdefault(key, (i, offset, len(line) - 1))
            self._pending.pop(key, None)
            offset += len(line)
        self._buffer.clear()
        self.stats.segments_written += 1

    def _check_fork(self) -> None:
        if os.getpid() == self._pid:
            return
        if self._explicit_id is not None:
            raise RuntimeError(
                "a ResponseCache with an explicit writer_id was inherited by a forked process; "
                "create one cache per process"
            )
        # The parent owns its files and buffer; the child starts its own.
        self._pid, self._writer_id = os.getpid(), _default_writer_id()
        self._appender, self._log, self._writing, self._flusher = None, None, False, None
        self._buffer.clear()
        self._pending.clear()
        self._next_seq, self._stop = 0, threading.Event()

    def _drop_appender(self) -> None:
        """Close the log after a failed write; the next put opens it again."""
        if self._appender is not None:
            with contextlib.suppress(OSError):
                self._appender.close()
        self._appender, self._writing = None, False

    def _start_writer(self) -> None:
        if self._writing:
            return
        if self._store.appendable:
            name = self._writer_id + _SUFFIX
            self._appender = self._store.append(name)
            self._log = self._segment(name)
            if self._appender.size and not self._tail_is_newline(name, self._appender.size):
                try:  # a crash or a full disk tore our last line: end it, never glue
                    self._appender.write(b"\n")
                except OSError:
                    self._drop_appender()
                    raise
                self._appender.size += 1
            self._log.size = self._appender.size
            self._scan(self._log)
            self._last_sync = self._clock()
            interval = self._fsync_interval
        else:
            taken = re.compile(re.escape(self._writer_id) + r"-(\d{8})" + re.escape(_SUFFIX))
            seqs = [int(m.group(1)) for n in self._store.list() if (m := taken.fullmatch(n))]
            self._next_seq = max(seqs, default=-1) + 1
            interval = self._segment_interval
        self._writing = True
        if interval > 0 and self._flusher is None:
            tick = min(max(interval / 4, 0.05), 1.0)
            self._flusher = threading.Thread(
                target=self._flush_loop, args=(tick,), name="response-cache-flush", daemon=True
            )
            self._flusher.start()

    def _tail_is_newline(self, name: str, size: int) -> bool:
        return self._store.read(name, size - 1, 1, size) == b"\n"

    def _flush_loop(self, tick: float) -> None:
        while not self._stop.wait(tick):
            with self._lock:
                if self._closed or os.getpid() != self._pid:
                    return
                with contextlib.suppress(OSError):  # the next put or close reports it
                    if self._buffer_due():
                        self._write_segment()
                    if self._dirty and self._clock() - self._last_sync >= self._fsync_interval:
                        self._sync()

    def flush(self) -> None:
        """Make every put so far durable: write the buffer as a segment, fsync the log."""
        with self._lock:
            if os.getpid() != self._pid:
                return
            self._write_segment()
            self._sync()

    def close(self) -> None:
        """Flush, stop the flusher, release files. ``get`` keeps working; ``put`` raises."""
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._closed = True
            self._stop.set()
            if self._appender is not None and os.getpid() == self._pid:
                self._appender.close()
            self._appender = None
            self._store.close()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy sent to another process (Ray) is a fresh reader/writer with its own id.
        return (_restore, (self._location, self._args))

    @property
    def writer_id(self) -> str:
        return self._writer_id

    @property
    def location(self) -> str:
        """Where the cache lives (folder or URI), for messages."""
        loc = self._location
        return f"{loc[1]} on {type(loc[0]).__name__}" if isinstance(loc, tuple) else str(loc)


def _restore(location: Location, args: dict[str, Any]) -> ResponseCache:
    return ResponseCache(location, **args)


def completion_to_record(c: Completion) -> dict[str, Any]:
    """The cache record of a completion: every ``Completion`` field, its ``usage`` as the
    five neutral counts (``Usage.as_dict``), its tool calls as mappings. Not the provider's
    rate-limit budget: it said how full the provider was then, which a replay must not
    pace by."""
    record = asdict(c)
    del record["rate_limits"]
    return record


# The counts of a neutral usage record; a record without any is an older one.
_NEUTRAL_USAGE = frozenset(("input", "cached_input", "cache_write", "output", "reasoning"))


def completion_from_record(record: Mapping[str, Any]) -> Completion:
    """Rebuild a ``Completion`` from ``completion_to_record`` output.

    A record written before the neutral edge (factory up to a771dbb) holds the server's
    OpenAI ``usage`` block instead of the neutral counts: it is read through the OpenAI
    backends' own mapping, so a cache filled then is replayed, never paid again.

    Raises:
        ValueError: a required field is missing (a record from another format).
    """
    from factory.llm.types import Completion, ToolCall, Usage

    names = {f.name for f in fields(Completion)}
    missing = sorted(
        names - set(record) - {"finish_reason", "retries", "tool_calls", "rate_limits"}
    )
    if missing:
        raise ValueError(f"cache record lacks {missing}")
    values = {k: v for k, v in record.items() if k in names}
    raw = values["usage"] or {}
    if _NEUTRAL_USAGE.intersection(raw):
        values["usage"] = Usage.from_dict(raw)
    else:  # an OpenAI usage block (an older record)
        from factory.llm.backends.openai_wire import usage_from_openai

        values["usage"] = usage_from_openai(raw)
    values["tool_calls"] = tuple(ToolCall(**call) for call in values.get("tool_calls") or ())
    values.pop("rate_limits", None)
    return Completion(**values)


CACHE_ID_FILE = ".cache-id"


def cache_identity(location: str) -> str:
    """A response cache's identity: a random id kept in the folder (created on first use),
    or the URI itself for an object store. Why: a resume must use the cache its folder was
    started with; another one (a new ``cache.path``, a deleted folder) has none of the
    answers already paid for, and the run would buy them again (issue 22 measured 410 of
    471 calls paid twice)."""
    if "://" in location:
        return location
    folder = Path(location)
    path = folder / CACHE_ID_FILE
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        folder.mkdir(parents=True, exist_ok=True)
        ident = uuid.uuid4().hex
        tmp = folder / f"{CACHE_ID_FILE}.{ident}"
        tmp.write_text(ident + "\n", encoding="utf-8")
        try:
            os.link(tmp, path)  # first writer wins; a racing one reads the winner's id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return path.read_text(encoding="utf-8").strip()


def cache_entries(location: str) -> int:
    """How many answers a local cache folder holds (lines of its segments); 0 otherwise."""
    folder = Path(location)
    if "://" in location or not folder.is_dir():
        return 0
    total = 0
    for seg in folder.glob("*.jsonl"):
        with open(seg, "rb") as fh:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return total
