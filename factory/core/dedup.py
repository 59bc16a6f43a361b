"""Exact-duplicate detection by content hash.

Seeds repeat (the same tau-bench task run twice with the same outcome, one
file concatenated twice), and amplification can reproduce its reference
verbatim; training on a row twice weights it twice. The key is
``Trajectory.content_id``: system prompt, tools and turns, never metadata, so
the same conversation read from two files is one trajectory. Near-duplicates
are a different (statistical) question and are not handled here.

``Deduper`` is the in-process state; the distributed stage keeps one per
shard of the key space and calls ``check`` per row.
"""

from __future__ import annotations

from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory

__all__ = ["Deduper", "dedup_key"]


def dedup_key(traj: Trajectory) -> str:
    """The exact-content key of ``traj`` (24 hex chars over system, tools and turns)."""
    return traj.content_id()


class Deduper:
    """Remembers every key seen, with the id of the row that first had it."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, key: object) -> bool:
        return key in self._first

    def check_key(self, key: str, row_id: str) -> Issue | None:
        """Record ``key`` for ``row_id``; a ``duplicate`` issue if it was seen before.

        Args:
            key: a ``dedup_key``.
            row_id: the id reported to later duplicates of this key.

        Returns:
            ``None`` for a first occurrence, else an issue naming the first row's id
            (every later occurrence is a duplicate, even one that carries the same id:
            two identical seeds without ids both get their content id).
        """
        first = self._first.get(key)
        if first is None:
            self._first[key] = row_id
            return None
        return Issue("duplicate", f"same content as {first}", path=key)

    def check(self, traj: Trajectory) -> Issue | None:
        """``check_key`` with ``traj``'s key and id (``metadata["id"]`` or its content id)."""
        return self.check_key(dedup_key(traj), traj.id)
