"""Streaming seed readers: files -> raw records -> Trajectory or SeedReject.

Why streaming: seed sets (APIGen-MT, Hermes, exported agent logs) run to GBs,
and a worker should hold one line or one Parquet batch at a time. JSON Lines
is read line by line (an over-long line is skipped without being held),
Parquet batch by batch; a ``.json`` file is one document and is loaded whole,
so large sets belong in JSONL or Parquet.

Failures are data: an undecodable line, bad JSON or a corrupt file becomes a
``RawRecord`` with ``error`` set, the rest of the file continues, and
:func:`read_seeds` turns every error into a :class:`SeedReject` carrying a
reason code. Only a seed *spec* that matches no file raises (``ConfigError``),
since that is a recipe mistake, not a bad row.

``records_from_bytes`` serves the Ray adapter (``ray.data.read_binary_files``
gives whole files as bytes); ``iter_records`` and ``iter_hf_records`` serve
local runs and Hugging Face datasets. Indexes are 0-based: the line number
for JSONL, the item or row position otherwise.
"""

from __future__ import annotations

import glob
import io
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from factory.core.formats import LIST_KEYS, MAX_RECORD_BYTES, MAX_RECORD_DEPTH, parse_record
from factory.core.trajectory import Trajectory
from factory.errors import ConfigError, SeedError, SeedFormatError, short
from factory.io.objectstore import is_uri

__all__ = [
    "PARQUET_BATCH_ROWS",
    "RAW_LIMIT",
    "SUPPORTED_EXTENSIONS",
    "RawRecord",
    "SeedReject",
    "binary_reason",
    "convert_record",
    "iter_hf_records",
    "iter_records",
    "preview",
    "read_seeds",
    "records_from_bytes",
    "resolve_paths",
    "unusable_reason",
]

RAW_LIMIT = 4096  # characters of a bad record kept in the rejects file
PARQUET_BATCH_ROWS = 256
JSONL_EXTENSIONS = (".jsonl", ".ndjson")
SUPPORTED_EXTENSIONS = (*JSONL_EXTENSIONS, ".json", ".parquet")
_GLOB_CHARS = set("*?[")
_WRAPPER_KEYS = ("data", "records")
# JSON may escape half a UTF-16 pair ("\ud800"); json.loads accepts it, but the string
# cannot be encoded as UTF-8, so Arrow (every column downstream) would crash on it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# A text file is judged by its first bytes: a file of random bytes (or a compressed
# one) is refused after 64 KiB instead of becoming hundreds of thousands of reject
# rows, each holding a line of garbage (minutes and GiBs per worker).
SNIFF_BYTES = 64 * 1024
SNIFF_RECORDS = 20  # records a seed file's first usable one is looked for in
JSON_PARSE_LIMIT = 32 * 1024 * 1024  # a larger .json is only sniffed before the run
# A file's first bytes -> what it is. bzip2's and Parquet's magic numbers are ASCII ("BZh",
# "PAR1"), so a text line may begin with them: those two count only with the bytes that
# follow them in such a file (bzip2's block or end-of-stream marker after the block size;
# a binary byte after Parquet's), never on the prefix alone (a damaged seed file whose
# first line began "BZh" lost its intact lines, found by the fuzz test, 2026-11-26).
_MAGIC = {
    re.compile(rb"\x1f\x8b"): "gzip-compressed data (decompress it first)",
    re.compile(rb"PK\x03\x04"): "a zip archive (unpack it first)",
    re.compile(rb"\(\xb5/\xfd"): "zstd-compressed data (decompress it first)",
    re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)"): "bzip2-compressed data (decompress it first)",
    re.compile(rb"\xfd7zXZ\x00"): "xz-compressed data (decompress it first)",
    re.compile(rb"PAR1[\x00-\x08\x0e-\x1f\x7f-\xff]"): "a Parquet file (name it .parquet)",
}


@dataclass
class RawRecord:
    """One decoded record, or the error that stopped it from being decoded."""

    source: str
    index: int
    record: Any | None
    raw: str
    error: SeedError | None = None


@dataclass
class SeedReject:
    """A seed that did not become a trajectory, with its reason code and a raw excerpt."""

    source: str
    index: int
    reason: str
    message: str
    raw: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def preview(value: Any, limit: int = RAW_LIMIT) -> str:
    """A JSON excerpt of ``value`` of at most ``limit`` characters, for reject rows."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[:limit]).decode("utf-8", "replace")
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, TypeError, RecursionError):
            value = f"<unprintable {type(value).__name__}>"
    return value[:limit]


def _error(source: str, index: int, reason: str, message: str, raw: Any) -> RawRecord:
    return RawRecord(source, index, None, preview(raw), SeedFormatError(reason, message))


def _lone_surrogate(record: Any) -> str | None:
    """The first unpaired surrogate in any key or string of ``record`` (iterative walk)."""
    todo = [record]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                return found.group()
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return None


def _decoded(source: str, index: int, record: Any, raw: str, *, escaped: bool) -> RawRecord:
    """A RawRecord for a parsed ``record``; refused when it is not Unicode text.

    ``escaped`` says whether the source text holds a surrogate escape at all (a
    cheap screen, so clean records are never walked).
    """
    char = _lone_surrogate(record) if escaped else None
    if char is None:
        return RawRecord(source, index, record, raw)
    message = f"invalid Unicode: lone surrogate {char!r} (half a UTF-16 pair)"
    safe_raw = raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return _error(source, index, "unreadable_bytes", message, safe_raw)


# --- per-container decoding --------------------------------------------------------------


def _line_record(source: str, index: int, line: bytes, max_bytes: int) -> RawRecord | None:
    if not line.strip():
        return None
    if len(line) > max_bytes:
        return _error(source, index, "too_large", f"line longer than {max_bytes} bytes", line)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _error(source, index, "unreadable_bytes", f"invalid UTF-8: {exc.reason}", line)
    text = text.lstrip("\ufeff").rstrip("\r\n")
    try:
        record = json.loads(text)
    except RecursionError:
        return _error(source, index, "too_large", "JSON nested too deeply", text)
    except ValueError as exc:
        return _error(source, index, "invalid_json", short(str(exc), 120), text)
    escaped = bool(_SURROGATE_ESCAPE.search(text))
    return _decoded(source, index, record, text[:RAW_LIMIT], escaped=escaped)


def _iter_lines(stream: IO[bytes], limit: int) -> Iterator[tuple[int, bytes, bool]]:
    """``(index, line, too_long)``; an over-long line is skipped, only its head is kept."""
    index = 0
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        too_long = len(line) > limit and not line.endswith(b"\n")
        if too_long:
            while True:  # drain the rest of the line without holding it
                chunk = stream.readline(1 << 20)
                if not chunk or chunk.endswith(b"\n"):
                    break
            line = line[:RAW_LIMIT]
        yield index, line, too_long
        index += 1


def binary_reason(head: bytes) -> str | None:
    """Why ``head``, the first bytes of a file meant to be text, is not text; None if it is.

    Text may hold a few broken bytes (each such line becomes a reject of its own);
    more than 10% of characters that are not text (undecodable bytes, control
    characters) mean the file is not text at all.
    """
    for magic, kind in _MAGIC.items():
        if magic.match(head):
            return f"not text but {kind}"
    sample = head[:-3] if len(head) >= SNIFF_BYTES else head  # a character may be cut here
    text = sample.decode("utf-8", "replace")
    bad = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v"))
    if bad > 16 and bad > len(text) // 10:
        return f"not text: {bad} of its first {len(text)} characters are binary"
    return None


def _jsonl_records(source: str, stream: IO[bytes], max_bytes: int) -> Iterator[RawRecord]:
    head = stream.read(SNIFF_BYTES)
    why = binary_reason(head)
    if why is not None:  # one reject for the file, read no further
        yield _error(source, 0, "unreadable_file", f"not a JSON Lines file: {why}", head[:200])
        return
    stream.seek(0)
    for index, line, too_long in _iter_lines(stream, max_bytes):
        if too_long:
            yield _error(source, index, "too_large", f"line longer than {max_bytes} bytes", line)
            continue
        rec = _line_record(source, index, line, max_bytes)
        if rec is not None:
            yield rec


def _json_records(source: str, data: bytes) -> Iterator[RawRecord]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        yield _error(source, 0, "unreadable_bytes", f"invalid UTF-8: {exc.reason}", data)
        return
    try:
        doc = json.loads(text)
    except RecursionError:
        yield _error(source, 0, "too_large", "JSON nested too deeply", text)
        return
    except ValueError as exc:
        yield _error(source, 0, "invalid_json", short(str(exc), 120), text)
        return
    items: Any = doc
    if isinstance(doc, dict) and not any(k in doc for k in LIST_KEYS):
        wrapped = next((doc[k] for k in _WRAPPER_KEYS if isinstance(doc.get(k), list)), None)
        items = wrapped if wrapped is not None else [doc]
    elif not isinstance(doc, list):
        items = [doc]
    escaped = bool(_SURROGATE_ESCAPE.search(text))
    for index, item in enumerate(items):
        yield _decoded(source, index, item, preview(item), escaped=escaped)


def _parquet_records(source: str, open_file: Any) -> Iterator[RawRecord]:
    index = 0
    try:
        parquet = pq.ParquetFile(open_file())
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield RawRecord(source, index, row, preview(row))
                index += 1
    except (pa.ArrowException, OSError, ValueError) as exc:
        message = f"unreadable Parquet: {short(str(exc), 120)}"
        yield _error(source, index, "unreadable_file", message, b"")


def _extension(name: str) -> str:
    return Path(name).suffix.lower()


def records_from_bytes(
    name: str, data: bytes, *, max_bytes: int = MAX_RECORD_BYTES
) -> Iterator[RawRecord]:
    """Decode one whole file given as bytes; the container is chosen by ``name``'s extension.

    Args:
        name: file name or path (also the records' ``source``).
        data: the file's bytes.
        max_bytes: longest JSONL line accepted.

    Returns:
        An iterator of RawRecord; bad lines and corrupt files yield records with ``error``.
    """
    ext = _extension(name)
    if ext in JSONL_EXTENSIONS:
        yield from _jsonl_records(name, io.BytesIO(data), max_bytes)
    elif ext == ".json":
        yield from _json_records(name, data)
    elif ext == ".parquet":
        yield from _parquet_records(name, lambda: io.BytesIO(data))
    else:
        message = (
            f"unsupported extension {ext or '(none)'!r}; use {', '.join(SUPPORTED_EXTENSIONS)}"
        )
        yield _error(name, 0, "unreadable_file", message, data[:RAW_LIMIT])


# --- files, directories, globs -----------------------------------------------------------


# A seed file: a local path, or a ``pyarrow.fs`` URI (``s3://bucket/seeds/a.jsonl``) kept as
# text, since ``Path`` would fold its ``//``. A URI is read through pyarrow.fs, streamed
# (1 MiB buffered ranges), so a seed set on a store never has to fit on the driver's disk.
Source = Path | str


def _source(spec: str | Path) -> Source:
    """``spec`` as a ``Source``: a URI stays text, anything else becomes a ``Path``."""
    text = str(spec)
    if isinstance(spec, str) and is_uri(text):
        return text
    if text.startswith("file://"):
        return Path(urlsplit(text).path)
    return Path(spec)


def _arrow(uri: str) -> tuple[Any, str]:
    """The filesystem and path of a URI.

    Raises:
        ConfigError: pyarrow cannot open it (key path ``seeds.path``).
    """
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # ArrowInvalid, OSError, ValueError ...
        raise ConfigError(
            f"cannot open seed location {short(uri, 120)}: {short(str(exc), 160)}",
            key_path="seeds.path",
        ) from exc


def _uri_of(uri: str, path: str) -> str:
    """The URI of ``path`` on the filesystem of ``uri`` (its scheme; the bucket is in
    the path pyarrow gives for object stores)."""
    scheme = uri.split("://", 1)[0]
    query = urlsplit(uri).query
    return f"{scheme}://{path.lstrip('/')}" + (f"?{query}" if query else "")


def _name(source: Source) -> str:
    return source.name if isinstance(source, Path) else Path(urlsplit(source).path).name


def _open(source: Source) -> IO[bytes]:
    """A binary stream over the file (a seekable, buffered reader for a URI)."""
    if isinstance(source, Path):
        return source.open("rb")
    fs, path = _arrow(source)
    return io.BufferedReader(fs.open_input_file(path), 1 << 20)


def _size(source: Source) -> int:
    if isinstance(source, Path):
        return source.stat().st_size
    fs, path = _arrow(source)
    return int(fs.get_file_info(path).size or 0)


def _resolve_uri(spec: str) -> list[Source]:
    """``resolve_paths`` for a URI: a file, a folder (recursively) or a glob (``*``, ``?``,
    ``[...]``, ``**``) matched against the paths listed below its fixed part."""
    import fnmatch

    import pyarrow.fs as pafs

    fs, path = _arrow(spec)
    if not _GLOB_CHARS & set(path):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [spec]
        if info.type != pafs.FileType.Directory:
            raise ConfigError(f"seed path {short(spec, 200)!r} does not exist", key_path="seeds")
        base, pattern = path, None
    else:
        fixed = re.split(r"[*?\[]", path, maxsplit=1)[0]
        base, pattern = fixed.rsplit("/", 1)[0] if "/" in fixed else fixed, path
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    found = sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and not i.base_name.startswith(".")
        and (
            fnmatch.fnmatchcase(i.path, pattern)
            if pattern
            else i.extension and f".{i.extension.lower()}" in SUPPORTED_EXTENSIONS
        )
    )
    if not found:
        raise ConfigError(f"no seed files match {short(spec, 200)!r}", key_path="seeds")
    return [_uri_of(spec, p) for p in found]


def resolve_paths(spec: str | Path | Iterable[str | Path]) -> list[Source]:
    """Files named by a path, a directory (recursively), a glob, or a list of those; any
    of them may be a ``pyarrow.fs`` URI (returned as text).

    Directory and glob results are sorted so runs are deterministic; directories
    contribute only files with a supported extension.

    Raises:
        ConfigError: a spec matches no file.
    """
    if not isinstance(spec, (str, Path)):
        return [path for item in spec for path in resolve_paths(item)]
    source = _source(spec)
    if isinstance(source, str):
        return _resolve_uri(source)
    path = source
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in SUPPORTED_EXTENSIONS
            and not p.name.startswith(".")
        )
    elif _GLOB_CHARS & set(str(spec)):
        found = sorted(Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file())
    else:
        raise ConfigError(f"seed path {short(str(spec), 200)!r} does not exist", key_path="seeds")
    if not found:
        raise ConfigError(f"no seed files match {short(str(spec), 200)!r}", key_path="seeds")
    return list(found)


def _file_records(path: Source, max_bytes: int) -> Iterator[RawRecord]:
    source = str(path)
    ext = _extension(_name(path))
    try:
        if ext in JSONL_EXTENSIONS:
            with _open(path) as stream:
                yield from _jsonl_records(source, stream, max_bytes)
        elif ext == ".parquet":
            local = isinstance(path, Path)
            yield from _parquet_records(source, lambda: source if local else _open(path))
        else:
            with _open(path) as stream:
                data = stream.read()
            yield from records_from_bytes(source, data, max_bytes=max_bytes)
    except OSError as exc:
        yield _error(source, 0, "unreadable_file", f"cannot read: {short(str(exc), 120)}", b"")


def unusable_reason(path: Path | str, *, max_bytes: int = MAX_RECORD_BYTES) -> str | None:
    """Why the seed file ``path`` holds nothing usable at its start; None when it does.

    Cheap, so it runs before Ray starts: the extension, the first 64 KiB (text or
    binary), then the first ``SNIFF_RECORDS`` records, of which one must parse as a
    trajectory in a known format (rule checks come later, per record). A ``.json``
    larger than ``JSON_PARSE_LIMIT`` is only sniffed. Never raises for bad content.
    """
    path = _source(path)
    ext = _extension(_name(path))
    try:
        size = _size(path)
        with _open(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    if ext not in SUPPORTED_EXTENSIONS:
        kind = binary_reason(head) or _text_kind(head)
        hint = f" ({kind})" if kind else ""
        allowed = ", ".join(SUPPORTED_EXTENSIONS)
        return f"unsupported extension {ext or '(none)'!r}{hint}; use {allowed}"
    if size == 0:
        return "the file is empty (0 bytes)"
    if ext != ".parquet":
        why = binary_reason(head)
        if why is not None:
            return why
        if not head.strip():
            return f"no record in its first {len(head):,} bytes (blank)"
        if ext == ".json" and size > JSON_PARSE_LIMIT:
            first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
            return None if first in (b"{", b"[") else f"not JSON: it starts with {first!r}"
    problems: list[str] = []
    for raw in itertools.islice(_file_records(path, max_bytes), SNIFF_RECORDS):
        where = f"line {raw.index + 1}" if ext in JSONL_EXTENSIONS else f"record {raw.index}"
        if raw.error is not None:
            problems.append(f"{where}: {raw.error.reason}: {raw.error}")
            continue
        try:
            parse_record(raw.record, source=f"{path}:{raw.index}", max_bytes=max_bytes)
            return None
        except SeedError as exc:
            problems.append(f"{where}: {exc.reason}: {exc}")
    if not problems:
        return "it holds no record"
    return f"none of its first {len(problems)} records is a trajectory ({short(problems[0], 200)})"


def _text_kind(head: bytes) -> str | None:
    """A guess at what a text file of an unsupported kind holds, for the message."""
    first = head.decode("utf-8", "replace").lstrip("\ufeff").split("\n", 1)[0]
    if first.lstrip()[:1] in ("{", "["):
        return "it looks like JSON: name it .jsonl or .json"
    if "," in first or "\t" in first:
        return "it looks like CSV/TSV, which is not a seed format"
    return None


def iter_records(
    spec: str | Path | Iterable[str | Path], *, max_bytes: int = MAX_RECORD_BYTES
) -> Iterator[RawRecord]:
    """Stream the records of every file ``spec`` names, in sorted file order.

    Raises:
        ConfigError: ``spec`` matches no file (raised before the first record).
    """
    paths = resolve_paths(spec)
    for path in paths:
        yield from _file_records(path, max_bytes)


def iter_hf_records(name_or_path: str, split: str = "train") -> Iterator[RawRecord]:
    """Stream a Hugging Face dataset (hub name, or local JSON/JSONL/Parquet files).

    Uses ``datasets.load_dataset(..., streaming=True)``. Its JSON builder fails a
    whole file on one bad line; use :func:`iter_records` for untrusted local JSONL.

    Raises:
        ConfigError: the dataset cannot be opened (unknown name, no files, mixed types).
    """
    import datasets  # heavy import, only when a dataset is actually read

    path = Path(name_or_path)
    try:
        if path.exists():
            files = resolve_paths(path)
            kinds = {"parquet" if _extension(_name(f)) == ".parquet" else "json" for f in files}
            if len(kinds) != 1:
                raise ConfigError(f"{name_or_path}: mixes Parquet and JSON files", key_path="seeds")
            data_files = {split: [str(f) for f in files]}
            ds = datasets.load_dataset(
                kinds.pop(), data_files=data_files, split=split, streaming=True
            )
        else:
            ds = datasets.load_dataset(name_or_path, split=split, streaming=True)
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many unrelated types; translate at the boundary
        message = f"cannot open dataset {short(name_or_path, 200)!r}: {short(str(exc), 200)}"
        raise ConfigError(message, key_path="seeds") from exc
    index = 0
    try:
        for row in ds:
            yield RawRecord(name_or_path, index, row, preview(row))
            index += 1
    except Exception as exc:  # a corrupt shard mid-stream: record it, stop this dataset
        message = f"dataset stream failed: {type(exc).__name__}: {short(str(exc), 160)}"
        yield _error(name_or_path, index, "unreadable_file", message, b"")


# --- records -> trajectories -------------------------------------------------------------


def convert_record(
    raw: RawRecord,
    *,
    default_tools: list[dict[str, Any]] | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
    max_depth: int = MAX_RECORD_DEPTH,
) -> Trajectory | SeedReject:
    """Turn one RawRecord into a Trajectory, or a SeedReject with the reason; never raises."""
    if raw.error is not None:
        return SeedReject(raw.source, raw.index, raw.error.reason, str(raw.error), raw.raw)
    try:
        return parse_record(
            raw.record,
            source=f"{raw.source}:{raw.index}",
            default_tools=default_tools,
            max_bytes=max_bytes,
            max_depth=max_depth,
        )
    except SeedError as exc:
        return SeedReject(raw.source, raw.index, exc.reason, str(exc), raw.raw)


def read_seeds(
    spec: str | Path | Iterable[str | Path],
    *,
    default_tools: list[dict[str, Any]] | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
    max_depth: int = MAX_RECORD_DEPTH,
) -> Iterator[Trajectory | SeedReject]:
    """Every seed record of ``spec`` as a Trajectory or a SeedReject, in file order.

    Args:
        spec: a file, directory, glob, or a list of them.
        default_tools: tool specs for records that carry none (tau-bench).
        max_bytes: per-record size limit.
        max_depth: per-record nesting limit.

    Raises:
        ConfigError: ``spec`` matches no file. Bad records never raise.
    """
    for raw in iter_records(spec, max_bytes=max_bytes):
        yield convert_record(
            raw, default_tools=default_tools, max_bytes=max_bytes, max_depth=max_depth
        )
