"""Output writing: Parquet shards, rejects, ``dataset_info.json`` and the manifest.

Why the driver writes (not ``Dataset.write_parquet``): the factory must stop at
an exact target, count every row, and never leave a half-written shard where a
loader would read it. Each file is written under ``OUTPUT/.tmp/`` and moved into
place with ``os.replace`` (atomic on one filesystem); loaders ignore the hidden
folder. A crash therefore leaves only whole shards.

Layout::

    OUTPUT/
      data/part-00000.parquet ...     accepted rows (LLaMA-Factory columns + id, meta)
      rejects/part-00000.jsonl ...    rejected/failed rows with stage, reason, message, raw
      dataset_info.json               the LLaMA-Factory registry entry
      manifest.json                   counts per stage and reason, config hash, versions
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from factory.errors import OutputWriteError
from factory.secrets import redact_obj

__all__ = [
    "SHAREGPT_SCHEMA",
    "Manifest",
    "RejectWriter",
    "ShardWriter",
    "atomic_write_text",
    "file_sha256",
    "prepare_conversion",
    "write_dataset_info",
    "writing",
]

SHAREGPT_SCHEMA = pa.schema(
    [
        pa.field(
            "conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
        ),
        pa.field("system", pa.string()),
        pa.field("tools", pa.string()),
        pa.field("id", pa.string()),
        pa.field("meta", pa.string()),
    ]
)


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Turn an ``OSError`` (disk full, read-only mount, a file where a folder should
    be) raised while writing ``path`` into an ``OutputWriteError`` naming ``path``:
    the user must learn which file and why, not read "internal error"."""
    try:
        yield
    except OSError as exc:
        raise OutputWriteError(path, exc) from exc


def _tmp_path(out_dir: Path, name: str) -> Path:
    tmp = out_dir / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp / f"{uuid.uuid4().hex}-{name}"


def atomic_write_text(path: Path, text: str, out_dir: Path | None = None) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half.

    Raises:
        OutputWriteError: the write failed (the message names ``path`` and the OS error).
    """
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_path(out_dir or path.parent, path.name)
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):  # a failed write leaves no stray temp file
                tmp.unlink()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (the manifest records one per shard)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare_conversion() -> None:
    """Make pyarrow import what its first conversion of Python rows needs (pandas,
    0.2-0.4 s) now. The runner calls this in a thread while the actors start: done by the
    first shard batch instead, in the middle of the calls, it held the driver so long
    that the workers' queues ran dry (4 of 5 runs of the peer benchmark's S1 lost ~10 of
    64 slots for a second, 2026-11-26)."""
    pa.RecordBatch.from_pylist([], schema=SHAREGPT_SCHEMA)


class ShardWriter:
    """Buffer rows and write Parquet shards of at most ``shard_rows`` rows.

    Shards are numbered in order; ``start_index`` lets a resumed run continue
    numbering after the shards it keeps. Rows become Arrow record batches of
    ``BATCH_ROWS`` as they come (the driver mostly waits for results meanwhile), so
    the last shard of a run is not converted all at once when the run ends: 3,000
    airline rows took 0.35 s there, and pyarrow's first conversion imports pandas
    (0.4 s).
    """

    BATCH_ROWS = 256

    def __init__(
        self,
        out_dir: Path,
        *,
        subdir: str = "data",
        schema: pa.Schema = SHAREGPT_SCHEMA,
        shard_rows: int = 5000,
        start_index: int = 0,
    ):
        self.out_dir = Path(out_dir)
        self.dir = self.out_dir / subdir  # created on the first flush: no empty folders
        self.schema = schema
        self.shard_rows = shard_rows
        self.index = start_index
        self.rows_written = 0
        self.files: dict[str, int] = {}  # path relative to out_dir -> rows written
        self.checksums: dict[str, str] = {}  # path relative to out_dir -> sha256 of the file
        self._buffer: list[dict[str, Any]] = []  # rows not converted yet
        self._batches: list[pa.RecordBatch] = []  # converted rows of the next shard
        self._buffered = 0  # rows of the next shard, both kinds

    def add(self, row: dict[str, Any]) -> None:
        self._buffer.append(row)
        self._buffered += 1
        if self._buffered >= self.shard_rows:
            self.flush()
        elif len(self._buffer) >= self.BATCH_ROWS:
            self._convert()

    def _convert(self) -> None:
        if self._buffer:
            self._batches.append(pa.RecordBatch.from_pylist(self._buffer, schema=self.schema))
            self._buffer = []

    def extend(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    def flush(self) -> None:
        self._convert()
        if not self._buffered:
            return
        name = f"part-{self.index:05d}.parquet"
        table = pa.Table.from_batches(self._batches, schema=self.schema)
        with writing(self.dir / name):
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = _tmp_path(self.out_dir, name)
            try:
                pq.write_table(table, tmp, compression="zstd")
                digest = file_sha256(tmp)
                os.replace(tmp, self.dir / name)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        rel = (self.dir / name).relative_to(self.out_dir).as_posix()
        self.files[rel] = self._buffered
        self.checksums[rel] = digest
        self.rows_written += self._buffered
        self.index += 1
        self._batches, self._buffered = [], 0

    def close(self) -> None:
        self.flush()


class RejectWriter:
    """JSONL shards of rejected and failed rows, one object per line, with reasons.

    Rows pass through ``redact_obj``: a raw completion or an error message may quote
    what a server echoed back, the request's key included.
    """

    def __init__(self, out_dir: Path, *, subdir: str = "rejects", shard_rows: int = 5000):
        self.out_dir = Path(out_dir)
        self.dir = self.out_dir / subdir
        self.shard_rows = shard_rows
        self.index = 0
        self.rows_written = 0
        self.files: dict[str, int] = {}  # path relative to out_dir -> rows written
        self.checksums: dict[str, str] = {}  # path relative to out_dir -> sha256 of the file
        self._buffer: list[str] = []

    def add(self, row: dict[str, Any]) -> None:
        self._buffer.append(json.dumps(redact_obj(row), ensure_ascii=False, default=str))
        if len(self._buffer) >= self.shard_rows:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        name = f"part-{self.index:05d}.jsonl"
        text = "\n".join(self._buffer) + "\n"
        atomic_write_text(self.dir / name, text, self.out_dir)
        rel = (self.dir / name).relative_to(self.out_dir).as_posix()
        self.files[rel] = len(self._buffer)
        self.checksums[rel] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.rows_written += len(self._buffer)
        self.index += 1
        self._buffer = []

    def close(self) -> None:
        self.flush()


def write_dataset_info(
    out_dir: Path,
    dataset_name: str,
    *,
    formatting: str = "sharegpt",
    splits: Mapping[str, str] | None = None,
    tools: bool = True,
) -> Path:
    """Write the LLaMA-Factory registry entry pointing at ``data/``.

    LLaMA-Factory resolves ``file_name`` against its ``dataset_dir``: pass the
    output folder as ``dataset_dir`` and the name here as ``dataset``. ``splits``
    adds entries of the same layout for other folders (name -> folder, e.g. a
    held-out split an ``eval_dataset`` names). ``tools=False`` leaves the ``tools``
    column out of the entry (text-action rows: the actions are in the agent's text and
    the grammar in the system prompt, so no tool list is rendered).
    """
    if formatting == "sharegpt":
        entry: dict[str, Any] = {
            "file_name": "data",
            "formatting": "sharegpt",
            "columns": {
                "messages": "conversations",
                "system": "system",
                **({"tools": "tools"} if tools else {}),
            },
            "tags": {
                "role_tag": "from",
                "content_tag": "value",
                "user_tag": "human",
                "assistant_tag": "gpt",
                "observation_tag": "observation",
                "function_tag": "function_call",
            },
        }
    elif formatting == "alpaca":
        entry = {
            "file_name": "data",
            "formatting": "alpaca",
            "columns": {
                "prompt": "instruction",
                "query": "input",
                "response": "output",
                "system": "system",
            },
        }
    else:
        raise ValueError(f"unknown formatting {formatting!r}")
    entries = {dataset_name: entry}
    for name, folder in (splits or {}).items():
        entries[name] = {**entry, "file_name": folder}
    path = Path(out_dir) / "dataset_info.json"
    atomic_write_text(path, json.dumps(entries, indent=2) + "\n", Path(out_dir))
    return path


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("factory", "ray", "pyarrow", "openai", "datasets", "jsonschema", "json-repair"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


@dataclass
class Manifest:
    """Counts per stage and per reason, plus what produced the output.

    ``stages`` maps the stage that decided a row's fate to outcome counts
    (accepted / surplus / rejected / failed); ``reasons`` maps a stage to a
    Counter of reason codes. The top-level
    ``totals`` satisfy accepted + rejected + failed = input rows (checked by
    ``check_accounting``).
    """

    recipe: str
    config_hash: str
    stages: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> outcome counts
    reasons: dict[str, Counter[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    # Every file the run wrote (path relative to the output folder -> rows), so the
    # manifest lists exactly what is on disk (``runstate.verify_output`` checks it), and
    # each file's SHA-256 (a damaged shard is found before a run says "already complete").
    files: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    # What ``started`` is ("process start" for the CLI): the printed summary, the
    # manifest and a person timing the command then read one wall time.
    wall_time_from: str = "manifest created"
    finished: float | None = None  # set by write(): later to_dict() calls agree with the file

    def add_files(self, writer: Any) -> None:
        """List what a ``ShardWriter`` / ``RejectWriter`` wrote: rows and checksums."""
        self.files.update(writer.files)
        self.checksums.update(getattr(writer, "checksums", {}))

    def reason(self, stage: str, code: str, n: int = 1) -> None:
        self.reasons.setdefault(stage, Counter())[code] += n

    def to_dict(self, **totals: int) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "config_hash": self.config_hash,
            "versions": _versions(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_time_s": round((self.finished or time.time()) - self.started, 3),
            "wall_time_from": self.wall_time_from,
            "totals": totals,
            "stages": self.stages,
            "reasons": {s: dict(sorted(c.items())) for s, c in self.reasons.items()},
            "files": dict(sorted(self.files.items())),
            "checksums": dict(sorted(self.checksums.items())),
            **self.extra,
        }

    def write(self, out_dir: Path, **totals: int) -> Path:
        path = Path(out_dir) / "manifest.json"
        self.finished = time.time()  # to_dict() from now on reports what the file says
        body = json.dumps(redact_obj(self.to_dict(**totals)), indent=2, default=str)
        atomic_write_text(path, body + "\n", Path(out_dir))
        return path
