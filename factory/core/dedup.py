"""Exact-duplicate removal: one key function, one seen-set, one owner per stream of rows.

Seeds repeat (the same tau-bench task run twice with the same outcome, one
file concatenated twice), and amplification can reproduce its reference
verbatim; training on a row twice weights it twice. The key is
``Trajectory.content_id``: system prompt, tools and turns, never metadata, so
the same conversation read from two files is one trajectory.

The seam, for every pipeline:

* **key** -- ``dedup_key(traj)``, computed on the workers: the stage that builds
  a row stamps its ``id`` column with the trajectory's content id, so the
  driver reads the key with ``row_key(row)`` and hashes nothing;
* **seen-set** -- a ``Deduper``, owned by the one place that sees every row of a
  stream on the driver: ``Collector`` (the trajectories a run writes) and
  phase 1 of ``amplify_run`` (the seeds it keeps). Only rows still ``ok`` are
  checked; the first occurrence wins and every later one is rejected by stage
  ``dedup`` with reason ``duplicate``, naming the first;
* **resume** -- nothing is persisted: a resumed run rebuilds every output from the
  response cache, replaying the same rows in the same order (``factory.io.runstate``),
  so the seen-set refills exactly as the first run filled it and the same rows
  are kept.

Near-duplicates (issue 13, MinHash) are a different, statistical question: they
belong beside this check, with their own key function, as a second filter of
the same owners; nothing here handles them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory

__all__ = ["DEDUP_STAGE", "Deduper", "dedup_key", "row_key"]

DEDUP_STAGE = "dedup"  # the stage a duplicate is filed under (manifest reasons, rejects/)


def dedup_key(traj: Trajectory) -> str:
    """The exact-content key of ``traj`` (24 hex chars over system, tools and turns)."""
    return traj.content_id()


def row_key(row: Mapping[str, Any]) -> str:
    """The key of a pipeline row: its ``id`` column, the content id its stage stamped
    (``""`` for a row without one, so such rows are one key, as they always were)."""
    return str(row.get("id") or "")


class Deduper:
    """Remembers every key seen, with the id of the row that first had it.

    Args:
        message: the duplicate issue's message, ``{first}`` standing for the id of
            the row that had the key first (each owner words it for its rows).
    """

    def __init__(self, message: str = "same content as {first}") -> None:
        self._first: dict[str, str] = {}
        self.message = message

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, key: object) -> bool:
        return key in self._first

    def check_key(self, key: str, row_id: str | None = None) -> Issue | None:
        """Record ``key`` for ``row_id``; a ``duplicate`` issue if it was seen before.

        Args:
            key: a ``dedup_key``.
            row_id: the id reported to later duplicates of this key (default: the key).

        Returns:
            ``None`` for a first occurrence, else an issue naming the first row's id
            (every later occurrence is a duplicate, even one that carries the same id:
            two identical seeds without ids both get their content id).
        """
        first = self._first.get(key)
        if first is None:
            self._first[key] = key if row_id is None else row_id
            return None
        return Issue("duplicate", self.message.format(first=first), path=key)

    def check(self, traj: Trajectory) -> Issue | None:
        """``check_key`` with ``traj``'s key and id (``metadata["id"]`` or its content id)."""
        return self.check_key(dedup_key(traj), traj.id)

    def check_row(self, row: Mapping[str, Any]) -> Issue | None:
        """``check_key`` with a pipeline row's key (``row_key``), which is also its id."""
        return self.check_key(row_key(row))
