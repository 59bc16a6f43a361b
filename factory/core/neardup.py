"""Near-duplicate removal: MinHash signatures on the workers, one LSH index on the driver.

Amplifying 1.5k seeds into 90k rows asks each seed for ~60 trajectories, and a
model that only renames people, ids and places passes exact dedup
(``factory.core.dedup``) every time (issue 13). Near-duplicates are the
statistical sibling of that check and follow the same seam:

* **view** -- ``view_shingles(traj, view)``: the part of a trajectory that says
  what it *is about*: the user turns (``user``), the sequence of tool names and
  argument values (``tools``), or both. Text is lowercased and digits folded to
  ``0`` (a renamed id or date keeps its shape), then cut into word n-grams;
* **signature** -- ``signature(shingles)``: a rensa ``RMinHash`` (Rust; 100x
  faster than datasketch's pure-Python hashing on 90k rows, see BENCHMARKS.md),
  computed where the row is built and shipped as its serialised state (~700 bytes
  at 128 permutations), never the row;
* **index** -- a ``NearDupIndex`` (rensa ``RMinHashLSH`` plus the signatures, so
  every LSH candidate is confirmed by its estimated Jaccard similarity), owned by
  the one place that sees every row, ``engine/collect.Collector``. The first row
  of a cluster in stream order wins: the stream order is deterministic and a
  resumed run replays it, so it keeps the same set;
* **across runs** -- ``NearDupIndex.save`` writes ids and signatures to one file
  (``OUT/neardup.index``) and ``load_into`` adds an earlier run's file to a new
  index, so a second run rejects what the first one already has.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory, canonical_json
from factory.errors import ConfigError

__all__ = [
    "NEARDUP_STAGE",
    "VIEWS",
    "NearDupIndex",
    "NearDupParams",
    "signature",
    "signature_bytes",
    "view_shingles",
]

NEARDUP_STAGE = "neardup"  # the stage a near-duplicate is filed under
VIEWS = ("user", "tools", "both")
_WORD = re.compile(r"\w+", re.UNICODE)
_DIGIT = re.compile(r"\d")
_MAGIC = b"FACTORY-NEARDUP-1\n"


@dataclass(frozen=True)
class NearDupParams:
    """What makes two signatures comparable: a saved index records them, and an
    index made with other parameters cannot be loaded into this one."""

    view: str = "user"
    ngram: int = 2
    num_perm: int = 128
    seed: int = 0
    threshold: float = 0.35

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ConfigError(f"unknown view {self.view!r}; use one of {', '.join(VIEWS)}")
        if not 0.0 < self.threshold <= 1.0 or self.ngram < 1 or self.num_perm < 2:
            raise ConfigError("threshold must be in (0, 1], ngram >= 1, num_perm >= 2")

    @property
    def num_bands(self) -> int:
        """LSH bands: the fewest (longest rows, fewest false candidates) that still make
        a pair exactly at the threshold a candidate with probability >= 0.995, so the
        LSH misses (almost) nothing the Jaccard check would accept."""
        for rows in range(self.num_perm, 0, -1):
            if self.num_perm % rows:
                continue
            bands = self.num_perm // rows
            if 1.0 - (1.0 - self.threshold**rows) ** bands >= 0.995:
                return bands
        return self.num_perm

    def comparable(self) -> tuple[str, int, int, int]:
        return (self.view, self.ngram, self.num_perm, self.seed)


def _words(text: str) -> list[str]:
    return _WORD.findall(_DIGIT.sub("0", text.lower()))


def _ngrams(words: list[str], n: int) -> Iterator[str]:
    if len(words) < n:
        if words:
            yield " ".join(words)
        return
    for i in range(len(words) - n + 1):
        yield " ".join(words[i : i + n])


def view_shingles(traj: Trajectory, view: str = "user", ngram: int = 2) -> list[str]:
    """The shingles (distinct word n-grams) of ``traj``'s ``view``.

    ``user``: the user turns' text. ``tools``: each call as ``name key value ...``
    in order, so both the sequence of tools and their arguments count. ``both``:
    the union (prefixed, so a user word never meets a tool word).
    """
    out: set[str] = set()
    if view in ("user", "both"):
        for turn in traj.turns:
            if turn.role == "user":
                out.update("u:" + g for g in _ngrams(_words(turn.content), ngram))
    if view in ("tools", "both"):
        words: list[str] = []
        for _, call in traj.calls():
            words.append("call_" + call.name)
            words.extend(_words(canonical_json(call.arguments)))
        out.update("t:" + g for g in _ngrams(words, ngram))
    return sorted(out)


def signature(shingles: Iterable[str], params: NearDupParams) -> Any:
    """A rensa ``RMinHash`` of ``shingles``."""
    from rensa import RMinHash

    m = RMinHash(num_perm=params.num_perm, seed=params.seed)
    m.update(list(shingles))
    return m


def signature_bytes(traj: Trajectory, params: NearDupParams) -> bytes:
    """The serialised signature of ``traj``'s view (what a row carries to the driver)."""
    return bytes(signature(view_shingles(traj, params.view, params.ngram), params).__getstate__())


def _from_bytes(state: bytes, params: NearDupParams) -> Any:
    from rensa import RMinHash

    m = RMinHash(num_perm=params.num_perm, seed=params.seed)
    m.__setstate__(state)
    return m


class NearDupIndex:
    """Every accepted row's signature, queried before a row is accepted.

    Memory: the LSH tables plus one signature per row (~1 kB at 128 permutations),
    144 MB for the 89,961 rows of a whole 90k run (BENCHMARKS.md), independent of row
    length.
    """

    def __init__(self, params: NearDupParams):
        from rensa import RMinHashLSH

        self.params = params
        self._lsh = RMinHashLSH(
            threshold=params.threshold, num_perm=params.num_perm, num_bands=params.num_bands
        )
        self._ids: list[str] = []
        self._sigs: list[Any] = []
        self.loaded = 0  # entries that came from earlier runs' index files

    def __len__(self) -> int:
        return len(self._ids)

    def match(self, state: bytes) -> tuple[str, float] | None:
        """The earliest indexed row whose similarity to ``state`` reaches the threshold."""
        sig = _from_bytes(state, self.params)
        best: tuple[int, float] | None = None
        for key in self._lsh.query(sig):
            sim = float(sig.jaccard(self._sigs[key]))
            if sim >= self.params.threshold and (best is None or key < best[0]):
                best = (key, sim)
        return None if best is None else (self._ids[best[0]], best[1])

    def add(self, row_id: str, state: bytes) -> None:
        sig = _from_bytes(state, self.params)
        self._lsh.insert(len(self._ids), sig)
        self._ids.append(row_id)
        self._sigs.append(sig)

    def check(self, row_id: str, state: bytes) -> Issue | None:
        """Add ``row_id`` unless it is a near-duplicate of a row already indexed.

        Returns:
            ``None`` when the row was added, else a ``near_duplicate`` issue naming
            the kept row and the estimated similarity (the row is not added).
        """
        found = self.match(state)
        if found is None:
            self.add(row_id, state)
            return None
        kept, sim = found
        return Issue(
            "near_duplicate",
            f"near-duplicate of {kept} (estimated Jaccard {sim:.2f} over the "
            f"{self.params.view} view)",
            path=kept,
        )

    # -- across runs -----------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Write the ids and signatures (atomically: a crash leaves the old file)."""
        p = self.params
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_MAGIC)
            f.write(
                struct.pack("<16sIIIQ", p.view.encode(), p.ngram, p.num_perm, p.seed, len(self))
            )
            for row_id, sig in zip(self._ids, self._sigs, strict=True):
                rid, state = row_id.encode(), bytes(sig.__getstate__())
                f.write(struct.pack("<HI", len(rid), len(state)))
                f.write(rid)
                f.write(state)
        tmp.replace(path)

    def load_into(self, path: Path) -> int:
        """Add every entry of an index file an earlier run saved; returns how many.

        Raises:
            ConfigError: the file is not an index, or was made with another view,
                n-gram size, permutation count or seed (its signatures would not compare).
        """
        data = Path(path).read_bytes()
        if not data.startswith(_MAGIC):
            raise ConfigError(f"{path} is not a near-duplicate index file")
        pos = len(_MAGIC)
        view, ngram, num_perm, seed, count = struct.unpack_from("<16sIIIQ", data, pos)
        pos += struct.calcsize("<16sIIIQ")
        theirs = (view.rstrip(b"\0").decode(), ngram, num_perm, seed)
        if theirs != self.params.comparable():
            raise ConfigError(
                f"{path} was made with (view, ngram, num_perm, seed) = {theirs}, this recipe "
                f"uses {self.params.comparable()}: its signatures do not compare"
            )
        for _ in range(count):
            n_id, n_state = struct.unpack_from("<HI", data, pos)
            pos += 6
            row_id = data[pos : pos + n_id].decode()
            pos += n_id
            self.add(row_id, data[pos : pos + n_state])
            pos += n_state
        self.loaded += count
        return int(count)
