"""One way to file a row: check, reject with a reason code, count, write (every job).

Every job's sink files its final rows in the order the loop uses them
(``factory.engine.loop``): the trajectory collector (``factory.engine.collect``),
the amplify job's seed side and the simulator-data job's step sink. What differs
between them is declared, not rewritten: which checks run on a row that is still
``ok`` (the exact duplicate filter, the near-duplicate index), where a kept row goes
(``keep``: data/, surplus/, candidates/, the kept seeds), which reject files take the
rest and which columns those leave out. What is the same is here, once:

* a row never sent (``unissued``: a cap stopped it) is counted and goes nowhere;
* the first check that refuses an ``ok`` row marks it rejected by the check's stage
  with the issue's reason code (``factory.engine.stages.base.reject``);
* a rejected row goes to ``rejects/``, a failed one to ``failed/`` (or to ``rejects/``
  when the job keeps no failed folder), without its empty columns;
* every row is counted under its fate (``factory.engine.rows.Fate``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Generic, TypeVar

from factory.core.dedup import DEDUP_STAGE, Deduper
from factory.core.neardup import NEARDUP_STAGE, NearDupIndex
from factory.core.reasons import Issue
from factory.engine.rows import Fate, Row, Status, StepRow
from factory.engine.stages.base import reject
from factory.io.writer import RejectWriter

__all__ = ["Check", "Filing", "NearDuplicates", "exact_duplicates"]

R = TypeVar("R", Row, StepRow)
#: A check on an ``ok`` row: None, or the stage that refuses it and why.
Check = Callable[[R], tuple[str, Issue] | None]


def exact_duplicates(dedup: Deduper) -> Check[Row]:
    """The run's exact-duplicate filter as a check (stage ``dedup``): the first copy in
    order is kept, a later one refused naming it (``factory.core.dedup``)."""

    def check(row: Row) -> tuple[str, Issue] | None:
        issue = dedup.check_row(row)
        return None if issue is None else (DEDUP_STAGE, issue)

    return check


class NearDuplicates:
    """The run's near-duplicate index as a check (stage ``neardup``) on rows that carry a
    MinHash signature; counts what it refused (the manifest's ``near_duplicates``)."""

    def __init__(self, index: NearDupIndex) -> None:
        self.index = index
        self.rejected = 0

    def __call__(self, row: Row) -> tuple[str, Issue] | None:
        if not row.get("minhash"):
            return None
        issue = self.index.check(row.get("id") or "", row["minhash"] or b"")
        if issue is None:
            return None
        self.rejected += 1
        return NEARDUP_STAGE, issue


class Filing(Generic[R]):
    """File rows one at a time, in order; ``counts`` holds every row's fate.

    Args:
        rejects: where rejected rows go.
        failed: where failed rows go; None files them with the rejected ones (and
            counts them rejected).
        checks: run in order on a row still ``ok``; the first refusal rejects it.
        drop: columns a reject file leaves out (besides the empty ones).
    """

    def __init__(
        self,
        rejects: RejectWriter,
        failed: RejectWriter | None = None,
        *,
        checks: Sequence[Check[R]] = (),
        drop: Collection[str] = (),
    ) -> None:
        self.rejects = rejects
        self.failed = failed
        self.checks: tuple[Check[R], ...] = tuple(checks)
        self.drop = frozenset(drop)
        self.counts: Counter[Fate] = Counter()

    def file(self, row: R, keep: Callable[[R], Fate]) -> Fate:
        """File ``row``: ``keep`` decides where a row still ``ok`` after the checks goes
        (it returns accepted or surplus); returns the row's fate. The row is marked in
        place when a check refuses it."""
        if row["status"] == Status.UNISSUED:
            fate = Fate.UNISSUED
        else:
            if row["status"] == Status.OK:
                for check in self.checks:
                    refusal = check(row)
                    if refusal is not None:
                        stage, issue = refusal
                        reject(row, stage, issue.code, issue.message)
                        break
            fate = keep(row) if row["status"] == Status.OK else self._refuse(row)
        self.counts[fate] += 1
        return fate

    def _refuse(self, row: R) -> Fate:
        if row["status"] == Status.FAILED and self.failed is not None:
            writer, fate = self.failed, Fate.FAILED
        else:
            writer, fate = self.rejects, Fate.REJECTED
        writer.add({k: v for k, v in row.items() if v is not None and k not in self.drop})
        return fate

    def close(self) -> list[RejectWriter]:
        """Flush the reject files; returns their writers (for the manifest's file list)."""
        writers = [self.rejects] + ([self.failed] if self.failed is not None else [])
        for writer in writers:
            writer.close()
        return writers
