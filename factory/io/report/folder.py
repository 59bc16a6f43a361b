"""Read a finished output folder: its manifest, its rows, its rejects.

Why one reader: the run report, ``factory inspect``, the dataset card and
``factory push`` all look at the same folder; each streams what it needs
(Parquet batches, JSONL lines) and never loads a whole shard set into memory.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from factory.errors import ConfigError, OutputDamaged
from factory.io.runstate import find_damage, read_manifest

__all__ = ["OutputFolder", "Where", "meta_keys", "parse_where", "reservoir", "unknown_keys"]

DATA_DIR = "data"
REJECT_DIRS = ("rejects", "failed")
#: The row layout of a pipeline's data when its files do not say (sharegpt for the others).
_ROW_FORMATS = {"envsim": "alpaca"}
REBUILD_HINT = (
    "run the command that wrote this folder again: it rebuilds the file from the response "
    "cache (nothing is paid twice)"
)


@dataclass(frozen=True)
class Where:
    """One ``KEY=VALUE`` row filter (``--where outcome=refused``).

    ``KEY`` is a dotted path into the row's ``meta`` (``labels.outcome``, ``seed_id``);
    a bare key that is not in ``meta`` is looked up in ``meta["labels"]``, so
    ``outcome=refused`` reads the label people mean. Values compare as text.
    """

    key: str
    value: str

    def matches(self, meta: dict[str, Any]) -> bool:
        found = _lookup(meta, self.key)
        if found is _MISSING and "." not in self.key:
            found = _lookup(meta.get("labels") or {}, self.key)
        if found is _MISSING:
            return False
        text = (
            json.dumps(found) if isinstance(found, (dict, list, bool)) or found is None else found
        )
        return str(text) == self.value


_MISSING = object()


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def parse_where(items: Iterable[str]) -> list[Where]:
    """``["outcome=refused", ...]`` -> filters.

    Raises:
        ConfigError: an item without ``=`` (the message shows the expected form).
    """
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--where {item!r}: expected KEY=VALUE, e.g. outcome=refused")
        out.append(Where(key.strip(), value.strip()))
    return out


def meta_keys(metas: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every key a ``Where`` can name in ``metas``: the dotted path of each value
    (``seed_id``, ``labels.outcome``) and, as ``Where`` reads them, the labels' bare
    names (``outcome``)."""
    keys: set[str] = set()

    def walk(obj: Mapping[str, Any], prefix: str) -> None:
        for key, value in obj.items():
            path = f"{prefix}{key}"
            keys.add(path)
            if isinstance(value, dict):
                walk(value, path + ".")

    for meta in metas:
        walk(meta, "")
        labels = meta.get("labels")
        if isinstance(labels, dict):
            keys.update(str(k) for k in labels)
    return keys


def unknown_keys(where: Iterable[Where], known: set[str]) -> list[str]:
    """The filters' keys that no row has (a typo: ``outcom=refused``), each once."""
    return list(dict.fromkeys(w.key for w in where if w.key not in known))


def reservoir(rows: Iterable[Any], k: int, *, seed: int = 0) -> list[Any]:
    """``k`` items drawn uniformly from a stream of unknown length (Algorithm R), in
    stream order; deterministic for a seed, so two reports of a folder show the same rows."""
    rng = random.Random(seed)
    picked: list[tuple[int, Any]] = []
    for i, row in enumerate(rows):
        if len(picked) < k:
            picked.append((i, row))
        else:
            j = rng.randint(0, i)
            if j < k:
                picked[j] = (i, row)
    return [row for _, row in sorted(picked, key=lambda p: p[0])]


class OutputFolder:
    """A run's output folder (``OUT/``), read-only.

    Raises:
        ConfigError: ``path`` is not a folder a run wrote (no ``manifest.json``).
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        manifest = self.path / "manifest.json"
        if not manifest.is_file():
            raise ConfigError(
                f"{self.path} holds no manifest.json: not the output folder of a finished "
                "run (run `factory run RECIPE -o FOLDER` first)"
            )
        self.manifest: dict[str, Any] = read_manifest(self.path)
        state = self.path / "run.json"
        self.state: dict[str, Any] = (
            json.loads(state.read_text(encoding="utf-8")) if state.is_file() else {}
        )
        self.skipped: set[Path] = set()  # damaged files the readers pass over (``skip``)

    # -- is it what the manifest says? -------------------------------------------------------
    def damage(self) -> list[OutputDamaged]:
        """The files that are not what the manifest says (SHA-256, rows, missing,
        unlisted), each naming its path and what is wrong, with what mends it.

        Why the checksums: a shard with flipped bytes keeps its row count and its footer,
        so it reads until the page that is damaged (``OSError: ZSTD decompression
        failed``); the run checks the same before it says "already complete"."""
        return [
            OutputDamaged(d.path, d.problem, hint=REBUILD_HINT)
            for d in find_damage(self.path, self.manifest, checksums=True)
        ]

    def check(self) -> None:
        """Raise the first damage (``damage``).

        Raises:
            OutputDamaged: a file is not what the manifest says (exit code 7).
        """
        for problem in self.damage():
            raise problem

    def skip(self, problems: Iterable[OutputDamaged]) -> None:
        """Read around these damaged files (``rows`` and ``rejects`` pass over them)."""
        self.skipped.update(Path(p.path) for p in problems)

    # -- what is there ---------------------------------------------------------------------
    def data_files(self) -> list[Path]:
        """The accepted rows' shards, as the manifest lists them (what is on disk)."""
        listed = self.manifest.get("files") or {}
        return [
            self.path / rel
            for rel in sorted(listed)
            if rel.startswith(f"{DATA_DIR}/")
            and rel.endswith(".parquet")
            and self.path / rel not in self.skipped
        ]

    def reject_files(self) -> list[Path]:
        listed = self.manifest.get("files") or {}
        return [
            self.path / rel
            for rel in sorted(listed)
            if rel.split("/", 1)[0] in REJECT_DIRS
            and rel.endswith(".jsonl")
            and self.path / rel not in self.skipped
        ]

    @property
    def pipeline(self) -> str:
        return str(self.manifest.get("pipeline") or "curate")

    @property
    def row_format(self) -> str:
        """``sharegpt`` (conversations) or ``alpaca`` (envsim step samples)."""
        files = self.data_files()
        if files and "instruction" in pq.ParquetFile(files[0]).schema_arrow.names:
            return "alpaca"
        return _ROW_FORMATS.get(self.pipeline, "sharegpt")

    # -- rows ------------------------------------------------------------------------------
    def rows(self, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
        """Accepted rows, shard by shard, with ``meta`` decoded to a dict."""
        for file in self.data_files():
            pf = pq.ParquetFile(file)
            names = pf.schema_arrow.names
            cols = None if columns is None else [c for c in columns if c in names]
            for batch in pf.iter_batches(columns=cols, batch_size=1024):
                for row in batch.to_pylist():
                    row["meta"] = _json_dict(row.get("meta"))
                    yield row

    def rejects(self) -> Iterator[dict[str, Any]]:
        """Rejected and failed rows (``rejects/``, ``failed/``), one dict each."""
        for file in self.reject_files():
            with open(file, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)

    def select(
        self, where: list[Where] | None = None, *, rejects: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Rows matching every filter: accepted rows, or with ``rejects`` the rejected
        and failed rows of that reason (``all``: every reason)."""
        if rejects is not None:
            for row in self.rejects():
                if rejects != "all" and row.get("reason") != rejects:
                    continue
                if all(w.matches(row) for w in where or ()):
                    yield row
            return
        for row in self.rows():
            if all(w.matches(row["meta"]) for w in where or ()):
                yield row


def _json_dict(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
