"""Deterministic, coverage-first selection of rows by a mixture's quotas.

Why: the quotas of a mixture file (``factory.core.mixture``) say how many rows of
each kind a data set holds; this module picks them, reproducibly, from labels
alone.

Selection rules (all of :func:`select`):

* **Deterministic**: candidates are ordered by a seeded hash of their id, never by
  arrival, so the same set of rows in any order gives the same selection.
* **Quotas in file order**; a quota takes its rows from the samples that match it
  and that no earlier quota took. Overlapping quotas are allowed: a sample goes
  to the first quota that matches it and still needs rows (put narrow quotas
  first). A quota never borrows from another group: what it cannot fill is
  reported in ``shortfall``.
* **Coverage first**: within a quota, one sample per distinct environment is
  taken before a second from any (``env_id``; ``task_id`` then ``user_id`` when
  the environment is unknown), and at equal depth samples of not-yet-seen tasks
  and users come first. Each round follows the seeded order.
* **Tool balance**: with the mixture's ``min_per_tool``, every tool (the
  ``tools`` argument, else every tool seen) first gets that many rows, rarest
  tool first, each counted against the first quota it matches that has room;
  a tool short of rows is reported in ``shortfall`` as ``tool:<name>``. With
  ``max_per_tool``, a quota passes over the candidates of a tool that already has
  that many rows (``tool_capped`` counts them); what it then cannot fill is a
  shortfall like any other.
* **Decontamination**: rows whose ``task_id`` / ``user_id`` is listed are
  dropped and counted (ids compared as strings, so task ``5`` matches ``"5"``).

Memory: :func:`select` reads each row once and keeps, for rows that match some
quota, only the id, a hash, a quota bitmask and the :data:`KEPT_LABELS` values
(interned: rows share them): O(matching rows), about 0.5 KB each, never a
payload or the caller's label dicts. Rows matching no quota, excluded and
invalid rows are only counted (invalid ones with their reason). The chosen
payloads are then pulled in a second streaming pass with :meth:`Selection.rows`.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.core.labels import GROUPS
from factory.core.mixture import _INT_SELECTORS, Mixture, _is_count
from factory.core.trajectory import canonical_json
from factory.errors import short

__all__ = ["KEPT_LABELS", "Selection", "held_out", "id_and_labels", "select"]

_ID_KEYS = ("env_id", "task_id", "user_id")
#: Label keys a selection keeps per candidate and returns in ``Selection.selected``.
KEPT_LABELS: tuple[str, ...] = (
    "kind",
    "outcome",
    "group",
    "delta_size",
    "write_calls",
    "arg_cardinality",
    "apps",
    "task_id",
    "user_id",
    "env_id",
    "tool",
)


def id_and_labels(sample: Any) -> tuple[str, Mapping[str, Any]]:
    """Default ``key`` of :func:`select`: ``(sample["id"], sample["labels"])``."""
    return sample["id"], sample["labels"]


def held_out(labels: Mapping[str, Any], *, by: str, share: float, seed: int) -> bool:
    """Whether a row belongs to the held-out split of ``by`` (``task`` or ``user``).

    Why by id and not by row: every row of a held-out task (or user) must stay
    out of training, so the decision is a seeded hash of the id alone, the same
    on every worker and in every run. A row without that id is never held out.
    """
    value = _id_str(labels.get(f"{by}_id"))
    if value is None:
        return False
    digest = hashlib.sha256(f"heldout:{seed}:{by}:{value}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def _seeded_hash(seed: int, sample_id: str) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{sample_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _id_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _labels_problem(labels: Any) -> str | None:
    if not isinstance(labels, Mapping):
        return f"labels must be a mapping, got {type(labels).__name__}"
    group = labels.get("group")
    if group is not None and group not in GROUPS:
        return f"unknown group {short(group, 40)}"
    for label in ("kind", "outcome"):
        if labels.get(label) is not None and not isinstance(labels[label], str):
            return f"{label} must be a string"
    for label in _INT_SELECTORS.values():
        value = labels.get(label)
        if value is not None and not _is_count(value):
            return f"{label} must be a non-negative integer, got {short(value, 40)}"
    for key in _ID_KEYS:
        value = labels.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            return f"{key} must be a string or an integer"
    return None


_ABSENT: Any = type("_Absent", (), {"__repr__": lambda self: "<absent>"})()


def _project(labels: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(labels.get(k, _ABSENT) for k in KEPT_LABELS)


def _unproject(values: tuple[Any, ...]) -> dict[str, Any]:
    return {k: v for k, v in zip(KEPT_LABELS, values, strict=True) if v is not _ABSENT}


@dataclass(slots=True, eq=False)
class _Candidate:
    """What selection keeps of a row: id, seeded hash, quota bitmask, kept labels."""

    id: str
    h: int
    mask: int  # bit i set: the row matches quota i
    values: tuple[Any, ...]  # KEPT_LABELS values, interned (many rows share them)
    cover: tuple[str, str]
    task: str | None
    user: str | None


def _candidate(
    sample_id: str, labels: Mapping[str, Any], seed: int, mask: int, interned: dict[Any, Any]
) -> _Candidate:
    def intern(value: Any) -> Any:
        return interned.setdefault(value, value)

    values = intern(tuple(intern(v) if isinstance(v, str) else v for v in _project(labels)))
    env, task, user = (
        None if (v := _id_str(labels.get(k))) is None else intern(v) for k in _ID_KEYS
    )
    cover = intern(
        ("env", env)
        if env is not None
        else ("task", task)
        if task is not None
        else ("user", user)
        if user is not None
        else ("id", sample_id)
    )
    return _Candidate(sample_id, _seeded_hash(seed, sample_id), mask, values, cover, task, user)


def _coverage_order(cands: list[_Candidate]) -> list[_Candidate]:
    """Round-robin over coverage keys; ``cands`` must be in seeded order.

    Each candidate gets a rank per key: how many earlier candidates (in seeded
    order) share its task / user. Inside a coverage unit, members are ranked by
    (task rank, user rank, seeded position) and their index there is their
    *depth*; sorting everything by (depth, task rank, user rank, position) takes
    one per unit, preferring unseen tasks and users, then a second, and so on.
    """
    tasks: Counter[str] = Counter()
    users: Counter[str] = Counter()
    task_rank: list[int] = []
    user_rank: list[int] = []
    by_cover: dict[tuple[str, str], list[int]] = defaultdict(list)
    for n, c in enumerate(cands):
        task_rank.append(tasks[c.task] if c.task is not None else 0)
        user_rank.append(users[c.user] if c.user is not None else 0)
        if c.task is not None:
            tasks[c.task] += 1
        if c.user is not None:
            users[c.user] += 1
        by_cover[c.cover].append(n)
    depth = [0] * len(cands)
    for members in by_cover.values():
        members.sort(key=lambda n: (task_rank[n], user_rank[n], n))
        for d, n in enumerate(members):
            depth[n] = d
    order = sorted(range(len(cands)), key=lambda n: (depth[n], task_rank[n], user_rank[n], n))
    return [cands[n] for n in order]


@dataclass
class Selection:
    """What :func:`select` chose and why the rest was not.

    ``selected`` entries are ``{"id", "quota", "labels"}`` in quota order, then
    pick order; ``labels`` holds the :data:`KEPT_LABELS` keys the row had.
    ``available`` counts the rows that matched a quota and were not taken by an
    earlier one, so ``counts[q] == min(wanted[q], available[q])``. ``duplicates``
    counts rows whose id was already a candidate (one version is kept: the
    smaller canonical labels, so arrival order does not matter).
    """

    mixture: str
    seed: int
    selected: list[dict[str, Any]] = field(default_factory=list)
    wanted: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    available: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)
    distinct: dict[str, dict[str, int]] = field(default_factory=dict)
    seen: int = 0
    excluded: int = 0
    excluded_by: dict[str, int] = field(default_factory=lambda: {"task_id": 0, "user_id": 0})
    unmatched: int = 0
    duplicates: int = 0
    invalid: dict[str, str] = field(default_factory=dict)
    tool_capped: dict[str, int] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [entry["id"] for entry in self.selected]

    @property
    def complete(self) -> bool:
        """Every quota got all the rows it wanted."""
        return not self.shortfall

    def rows(
        self, samples: Iterable[Any], *, key: Callable[[Any], Any] = id_and_labels
    ) -> Iterator[Any]:
        """Second pass: yield the chosen rows (payloads included) in arrival order.

        A repeated id is yielded once, from the row whose labels were chosen.
        """
        chosen = {entry["id"]: entry["labels"] for entry in self.selected}
        emitted: set[str] = set()
        for sample in samples:
            try:
                sample_id, labels = key(sample)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if (
                sample_id in chosen
                and sample_id not in emitted
                and isinstance(labels, Mapping)
                and _unproject(_project(labels)) == chosen[sample_id]
            ):
                emitted.add(sample_id)
                yield sample

    def to_dict(self) -> dict[str, Any]:
        """JSON summary for the manifest (ids included, payloads never)."""
        return {
            "mixture": self.mixture,
            "seed": self.seed,
            "ids": self.ids,
            "wanted": self.wanted,
            "counts": self.counts,
            "available": self.available,
            "shortfall": self.shortfall,
            "distinct": self.distinct,
            "seen": self.seen,
            "excluded": self.excluded,
            "excluded_by": self.excluded_by,
            "unmatched": self.unmatched,
            "duplicates": self.duplicates,
            "invalid": self.invalid,
        }

    def summary(self) -> dict[str, Any]:
        """The per-quota outcome for a run manifest (no ids)."""
        return {
            "name": self.mixture,
            "wanted": self.wanted,
            "selected": self.counts,
            "available": self.available,
            "shortfall": self.shortfall,
            "excluded": self.excluded,
            "tool_capped": self.tool_capped,
            "tools": dict(
                sorted(
                    Counter(
                        e["labels"].get("tool") for e in self.selected if "tool" in e["labels"]
                    ).items()
                )
            ),
        }

    def report(self) -> str:
        """A short table: per quota wanted / selected / available / coverage / shortfall."""
        total_wanted = sum(self.wanted.values())
        lines = [
            f"mixture {self.mixture} (seed {self.seed}): selected {len(self.selected)} of "
            f"{total_wanted} wanted, from {self.seen} rows"
        ]
        width = max([len("quota"), *(len(name) for name in self.wanted)])
        lines.append(
            f"  {'quota':<{width}}  {'wanted':>7} {'selected':>8} {'available':>9} "
            f"{'envs':>5} {'tasks':>5} {'users':>5} {'short':>6}"
        )
        for name, wanted in self.wanted.items():
            d = self.distinct.get(name, {})
            lines.append(
                f"  {name:<{width}}  {wanted:>7} {self.counts.get(name, 0):>8} "
                f"{self.available.get(name, 0):>9} {d.get('env_id', 0):>5} "
                f"{d.get('task_id', 0):>5} {d.get('user_id', 0):>5} "
                f"{self.shortfall.get(name, 0):>6}"
            )
        lines.append(
            f"  excluded {self.excluded} (task_id {self.excluded_by['task_id']}, "
            f"user_id {self.excluded_by['user_id']}); matched no quota {self.unmatched}; "
            f"duplicate ids {self.duplicates}; invalid labels {len(self.invalid)}"
        )
        if self.tool_capped:
            passed = ", ".join(f"{tool} {n}" for tool, n in self.tool_capped.items())
            lines.append(f"  passed over at max_per_tool: {passed}")
        if self.shortfall:
            missing = ", ".join(f"{k} {v}" for k, v in self.shortfall.items())
            lines.append(f"  SHORTFALL (not filled from other quotas): {missing}")
        return "\n".join(lines)


def select(
    samples: Iterable[Any],
    mixture: Mixture,
    *,
    seed: int,
    exclude_task_ids: Iterable[Any] = (),
    exclude_user_ids: Iterable[Any] = (),
    key: Callable[[Any], tuple[str, Mapping[str, Any]]] = id_and_labels,
    tools: Iterable[str] = (),
) -> Selection:
    """Choose the rows of ``mixture`` from labelled samples (rules in the module docstring).

    Args:
        samples: rows, read once; ``key`` turns each into ``(id, labels)``.
        mixture: the quotas.
        seed: seed of the hash order; same seed and same set of rows, same result.
        exclude_task_ids, exclude_user_ids: decontamination lists (compared as strings).
        key: extracts ``(id, labels)`` from a row (default: ``row["id"]``, ``row["labels"]``).
        tools: every tool that ``mixture.min_per_tool`` applies to (default: the tools seen).

    Returns:
        The :class:`Selection`; a row whose id or labels cannot be read is
        recorded in ``invalid`` (id, or ``<row N>``, -> reason), never raised.
    """
    ex_tasks = {str(t) for t in exclude_task_ids}
    ex_users = {str(u) for u in exclude_user_ids}
    out = Selection(mixture=mixture.name, seed=seed)
    pool: dict[str, _Candidate] = {}
    interned: dict[Any, Any] = {}
    for n, sample in enumerate(samples):
        out.seen += 1
        try:
            sample_id, labels = key(sample)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            out.invalid[f"<row {n}>"] = f"no id/labels: {type(exc).__name__}: {short(exc, 80)}"
            continue
        if not isinstance(sample_id, str) or not sample_id:
            out.invalid[f"<row {n}>"] = f"id must be a non-empty string, got {short(sample_id, 40)}"
            continue
        problem = _labels_problem(labels)
        if problem is not None:
            out.invalid[sample_id] = problem
            continue
        if _id_str(labels.get("task_id")) in ex_tasks:
            out.excluded += 1
            out.excluded_by["task_id"] += 1
            continue
        if _id_str(labels.get("user_id")) in ex_users:
            out.excluded += 1
            out.excluded_by["user_id"] += 1
            continue
        mask = sum(1 << i for i, q in enumerate(mixture.quotas) if q.matches(labels))
        if not mask:
            out.unmatched += 1
            continue
        previous = pool.get(sample_id)
        if previous is not None:
            out.duplicates += 1
            # Keep one version whatever the arrival order: the smaller canonical labels.
            kept = canonical_json(_unproject(previous.values))
            if kept <= canonical_json(_unproject(_project(labels))):
                continue
        pool[sample_id] = _candidate(sample_id, labels, seed, mask, interned)
    interned.clear()

    ordered = sorted(pool.values(), key=lambda c: (c.h, c.id))
    room = [q.count for q in mixture.quotas]
    pre: list[list[_Candidate]] = [[] for _ in mixture.quotas]
    taken: set[str] = set()
    tool_at = KEPT_LABELS.index("tool")
    if mixture.min_per_tool:
        by_tool: dict[str, list[_Candidate]] = defaultdict(list)
        for c in ordered:
            if isinstance(c.values[tool_at], str):
                by_tool[c.values[tool_at]].append(c)
        names = set(tools) or set(by_tool)
        for tool in sorted(names, key=lambda t: (len(by_tool.get(t, ())), t)):
            got = 0
            for c in _coverage_order(by_tool.get(tool, [])):
                if got >= mixture.min_per_tool:
                    break
                index = next((i for i in range(len(room)) if c.mask >> i & 1 and room[i] > 0), None)
                if index is None:
                    continue
                pre[index].append(c)
                room[index] -= 1
                taken.add(c.id)
                got += 1
            if got < mixture.min_per_tool:
                out.shortfall[f"tool:{tool}"] = mixture.min_per_tool - got
    per_tool: Counter[str] = Counter(
        c.values[tool_at] for picks in pre for c in picks if isinstance(c.values[tool_at], str)
    )
    capped: Counter[str] = Counter()
    for index, quota in enumerate(mixture.quotas):
        cands = [c for c in ordered if c.mask >> index & 1 and c.id not in taken]
        picks = pre[index] + _capped(
            _coverage_order(cands), room[index], mixture.max_per_tool, per_tool, capped
        )
        taken.update(c.id for c in picks)
        out.selected.extend(
            {"id": c.id, "quota": quota.name, "labels": _unproject(c.values)} for c in picks
        )
        out.wanted[quota.name] = quota.count
        out.counts[quota.name] = len(picks)
        out.available[quota.name] = len(cands) + len(pre[index])
        out.distinct[quota.name] = {
            "env_id": len({c.cover for c in picks if c.cover[0] == "env"}),
            "task_id": len({c.task for c in picks} - {None}),
            "user_id": len({c.user for c in picks} - {None}),
        }
        if len(picks) < quota.count:
            out.shortfall[quota.name] = quota.count - len(picks)
    out.tool_capped = dict(sorted(capped.items()))
    return out


def _capped(
    ordered: list[_Candidate],
    room: int,
    cap: int | None,
    per_tool: Counter[str],
    capped: Counter[str],
) -> list[_Candidate]:
    """The first ``room`` candidates, passing over those of a tool that has ``cap`` rows
    (counted in ``capped``); ``per_tool`` counts the picks."""
    tool_at = KEPT_LABELS.index("tool")
    picks: list[_Candidate] = []
    for c in ordered:
        if len(picks) >= room:
            break
        tool = c.values[tool_at]
        if isinstance(tool, str):
            if cap is not None and per_tool[tool] >= cap:
                capped[tool] += 1
                continue
            per_tool[tool] += 1
        picks.append(c)
    return picks
