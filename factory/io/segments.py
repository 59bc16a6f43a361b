"""Where the response cache's segment files live: a local folder or any ``pyarrow.fs``.

Why a module of its own: ``factory.io.cache`` decides what a line means (keys,
checksums, the index, durability); these stores only list, read, append and
write whole segment files, one kind for a local folder (``pread``, ``O_APPEND``,
a bounded set of open descriptors) and one for every other filesystem (whole
segments cached in an LRU). See ``factory.io.cache`` for the format.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs

from factory.errors import ConfigError, short

Location = str | Path | tuple[pafs.FileSystem, str]

_SUFFIX = ".jsonl"
_MAX_OPEN_FDS = 64


class _Appender:
    """An open log of this writer: ``write`` reaches the OS (or the stream) before returning."""

    def __init__(
        self,
        write: Callable[[bytes], None],
        sync: Callable[[], None],
        close: Callable[[], None],
        size: int,
    ) -> None:
        self.write, self.sync, self.close, self.size = write, sync, close, size


class _LocalStore:
    """A local folder through ``os``: O_APPEND logs, ``pread`` reads, real fsync."""

    def __init__(self, root: str, appendable: bool) -> None:
        self.root, self.appendable = root, appendable
        self._fds: OrderedDict[str, int] = OrderedDict()

    def list(self) -> dict[str, int]:
        try:
            with os.scandir(self.root) as it:
                return {
                    e.name: e.stat().st_size for e in it if e.name.endswith(_SUFFIX) and e.is_file()
                }
        except (FileNotFoundError, NotADirectoryError):  # nothing written yet (or ever)
            return {}

    def _fd(self, name: str) -> int:
        fd = self._fds.pop(name, None)
        if fd is None:
            fd = os.open(os.path.join(self.root, name), os.O_RDONLY)
            while len(self._fds) >= _MAX_OPEN_FDS:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[name] = fd
        return fd

    def read(self, name: str, offset: int, length: int, file_size: int) -> bytes:
        return os.pread(self._fd(name), length, offset)

    def append(self, name: str) -> _Appender:
        os.makedirs(self.root, exist_ok=True)
        path = os.path.join(self.root, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fsync_dir(self.root)  # the new name itself must survive a power loss

        def write(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        return _Appender(write, lambda: os.fsync(fd), lambda: os.close(fd), os.fstat(fd).st_size)

    def write_object(self, name: str, data: bytes) -> None:
        os.makedirs(self.root, exist_ok=True)
        tmp = os.path.join(self.root, f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.root, name))  # readers never see half an object
        _fsync_dir(self.root)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ArrowStore:
    """Any ``pyarrow.fs`` filesystem; whole segments are cached (LRU by bytes)."""

    def __init__(self, fs: pafs.FileSystem, root: str, appendable: bool, cache_bytes: int):
        self.fs, self.root, self.appendable = fs, root.rstrip("/"), appendable
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes, self._cached = cache_bytes, 0

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def list(self) -> dict[str, int]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return {
            i.base_name: i.size
            for i in infos
            if i.type == pafs.FileType.File and i.base_name.endswith(_SUFFIX)
        }

    def _remember(self, name: str, data: bytes) -> None:
        if len(data) > self._cache_bytes // 4:
            return
        self._cached += len(data) - len(self._cache.pop(name, b""))
        self._cache[name] = data
        while self._cached > self._cache_bytes:
            self._cached -= len(self._cache.popitem(last=False)[1])

    def read(self, name: str, offset: int, length: int, file_size: int) -> bytes:
        data = self._cache.get(name)
        if data is not None and len(data) >= offset + length:
            self._cache.move_to_end(name)
            return data[offset : offset + length]
        with self.fs.open_input_file(self._path(name)) as f:
            if file_size > self._cache_bytes // 4:
                return f.read_at(length, offset)
            data = f.read()
        self._remember(name, data)
        return data[offset : offset + length]

    def read_range(self, name: str, start: int, end: int, file_size: int) -> bytes:
        if start == 0 and end == file_size:
            return self.read(name, 0, end, file_size)
        with self.fs.open_input_file(self._path(name)) as f:
            return f.read_at(end - start, start)

    def append(self, name: str) -> _Appender:
        self.fs.create_dir(self.root, recursive=True)
        info = self.fs.get_file_info(self._path(name))
        stream = self.fs.open_append_stream(self._path(name))

        def write(data: bytes) -> None:
            stream.write(data)
            stream.flush()

        size = info.size if info.type == pafs.FileType.File else 0
        return _Appender(write, stream.flush, stream.close, size or 0)

    def write_object(self, name: str, data: bytes) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(self._path(name)) as f:
            f.write(data)  # an object store publishes it whole, at close
        self._remember(name, data)

    def close(self) -> None:
        self._cache.clear()
        self._cached = 0


def _open_store(
    location: Location, append: bool | None, cache_bytes: int
) -> _LocalStore | _ArrowStore:
    if isinstance(location, tuple):
        fs, path = location
    elif isinstance(location, Path) or "://" not in location:
        return _LocalStore(os.path.abspath(os.fspath(location)), append is not False)
    else:
        try:
            fs, path = pafs.FileSystem.from_uri(location)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ValueError ...
            raise ConfigError(
                f"cannot open cache location {short(location, 120)}: {short(str(exc), 160)}; "
                "use a local folder or a URI pyarrow.fs.FileSystem.from_uri understands",
                key_path="cache.location",
            ) from exc
    base, local_path = fs, path
    while isinstance(base, pafs.SubTreeFileSystem):  # unwrap to reach a real local folder
        local_path = os.path.join(base.base_path, local_path.lstrip("/"))
        base = base.base_fs
    if isinstance(base, pafs.LocalFileSystem):
        return _LocalStore(os.path.abspath(local_path), append is not False)
    return _ArrowStore(fs, path, bool(append), cache_bytes)
