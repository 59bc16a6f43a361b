"""Mixture specs (quotas over labels) and deterministic, coverage-first selection.

Why: EnvSimBench trains on a fixed mix (Balance2: 1,000 Failure, 1,000
No-Change, 2,000 Simple, 2,230 Complex) rather than on whatever the factory
happened to produce. A mixture file states the quotas; :func:`select` picks
the rows, reproducibly, from labels alone.

File format (``pipelines/mixtures/<name>.yaml``)::

    name: balance2
    description: optional text
    quotas:
      - name: complex_change           # unique; keys of counts / shortfall
        count: 2230                    # rows wanted (0 disables the quota)
        group: [Medium, Difficult, Beyond]   # one group or a list (factory.core.labels.GROUPS)
        outcome: change                # one outcome or a list (step or trajectory outcomes)
        delta: [1, {min: 3, max: 6}]   # exact |Δ| (labels.delta_size): values and/or ranges
        write_calls: {min: 1}          # labels.write_calls (trajectories without executor)
        arg_cardinality: {max: 3}      # labels.arg_cardinality
        description: optional text

A quota needs ``group`` or ``outcome``; the other selectors narrow it. A sample
whose label is missing or ``None`` never matches a selector on that label, so a
write-call count can never stand in for |Δ|.

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
from pathlib import Path
from typing import Any, TypeGuard

from factory.core.labels import GROUPS, STEP_OUTCOMES, TRAJECTORY_OUTCOMES
from factory.core.trajectory import canonical_json
from factory.core.yamlfile import read_yaml
from factory.errors import ConfigError, short

__all__ = [
    "KEPT_LABELS",
    "IntSet",
    "Mixture",
    "Quota",
    "Selection",
    "id_and_labels",
    "select",
]

OUTCOMES: tuple[str, ...] = STEP_OUTCOMES + TRAJECTORY_OUTCOMES
_MIXTURE_KEYS = ("name", "description", "quotas")
_QUOTA_KEYS = (
    "name",
    "count",
    "group",
    "outcome",
    "delta",
    "write_calls",
    "arg_cardinality",
    "description",
)
_RANGE_KEYS = ("min", "max")
# Selector key in the file -> label key it reads.
_INT_SELECTORS = {
    "delta": "delta_size",
    "write_calls": "write_calls",
    "arg_cardinality": "arg_cardinality",
}
_ID_KEYS = ("env_id", "task_id", "user_id")
#: Label keys a selection keeps per candidate and returns in ``Selection.selected``.
KEPT_LABELS: tuple[str, ...] = (
    "kind",
    "outcome",
    "group",
    "delta_size",
    "write_calls",
    "arg_cardinality",
    "task_id",
    "user_id",
    "env_id",
)


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- spec -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntSet:
    """Exact values and inclusive ranges of a non-negative integer label.

    ``ranges`` holds ``(low, high)`` pairs; ``high`` ``None`` means unbounded.
    """

    ranges: tuple[tuple[int, int | None], ...]

    def __contains__(self, value: object) -> bool:
        if not _is_count(value):
            return False
        return any(lo <= value and (hi is None or value <= hi) for lo, hi in self.ranges)

    @classmethod
    def parse(cls, raw: Any, key_path: str) -> IntSet:
        """``3``, ``{min: 1, max: 2}`` (either bound optional) or a list of those.

        Raises:
            ConfigError: naming the offending key path.
        """
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise ConfigError("must not be an empty list", key_path=key_path)
        ranges: list[tuple[int, int | None]] = []
        for n, item in enumerate(items):
            where = f"{key_path}[{n}]" if isinstance(raw, list) else key_path
            if _is_count(item):
                ranges.append((item, item))
            elif isinstance(item, Mapping):
                _no_unknown_keys(item, _RANGE_KEYS, where)
                lo, hi = item.get("min", 0), item.get("max")
                if not _is_count(lo):
                    raise ConfigError("must be a non-negative integer", key_path=f"{where}.min")
                if hi is not None and not _is_count(hi):
                    raise ConfigError("must be a non-negative integer", key_path=f"{where}.max")
                if hi is not None and hi < lo:
                    raise ConfigError(f"max {hi} is below min {lo}", key_path=where)
                ranges.append((lo, hi))
            else:
                raise ConfigError(
                    "expected a non-negative integer, {min: a, max: b}, or a list of them, "
                    f"got {short(item, 60)}",
                    key_path=where,
                )
        return cls(tuple(ranges))

    def to_yaml(self) -> list[Any]:
        return [
            lo if hi == lo else {"min": lo, **({"max": hi} if hi is not None else {})}
            for lo, hi in self.ranges
        ]


@dataclass(frozen=True)
class Quota:
    """``count`` rows whose labels match every given selector."""

    name: str
    count: int
    groups: tuple[str, ...] | None = None
    outcomes: tuple[str, ...] | None = None
    delta: IntSet | None = None
    write_calls: IntSet | None = None
    arg_cardinality: IntSet | None = None
    description: str = ""

    def matches(self, labels: Mapping[str, Any]) -> bool:
        """Whether a sample with these labels may fill this quota."""
        if self.groups is not None and labels.get("group") not in self.groups:
            return False
        if self.outcomes is not None and labels.get("outcome") not in self.outcomes:
            return False
        for selector, label in _INT_SELECTORS.items():
            wanted: IntSet | None = getattr(self, selector)
            if wanted is not None and labels.get(label) not in wanted:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "count": self.count}
        if self.groups is not None:
            out["group"] = list(self.groups)
        if self.outcomes is not None:
            out["outcome"] = list(self.outcomes)
        for selector in _INT_SELECTORS:
            wanted: IntSet | None = getattr(self, selector)
            if wanted is not None:
                out[selector] = wanted.to_yaml()
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Mixture:
    """A named list of quotas, filled in order."""

    name: str
    quotas: tuple[Quota, ...]
    description: str = ""

    @property
    def total(self) -> int:
        return sum(q.count for q in self.quotas)

    @classmethod
    def load(cls, path: str | Path) -> Mixture:
        """Read a mixture file.

        Raises:
            ConfigError: unreadable file, bad YAML, or a malformed spec (with key path).
        """
        return cls.from_dict(read_yaml(path, "mixture file", key_path="mixture"))

    @classmethod
    def from_dict(cls, data: Any) -> Mixture:
        """Build a mixture from its parsed YAML mapping.

        Raises:
            ConfigError: unknown key, wrong type, negative count, unknown group or
                outcome, a quota without group/outcome, duplicate quota names.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("a mixture must be a mapping with name and quotas", key_path="")
        _no_unknown_keys(data, _MIXTURE_KEYS, "")
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("must be a non-empty string", key_path="name")
        raw_quotas = data.get("quotas")
        if not isinstance(raw_quotas, list) or not raw_quotas:
            raise ConfigError("must be a non-empty list of quotas", key_path="quotas")
        quotas: list[Quota] = []
        for n, raw in enumerate(raw_quotas):
            quota = _parse_quota(raw, f"quotas[{n}]")
            if any(q.name == quota.name for q in quotas):
                raise ConfigError(
                    f"duplicate quota name {quota.name!r}", key_path=f"quotas[{n}].name"
                )
            quotas.append(quota)
        return cls(name=name, quotas=tuple(quotas), description=_text(data, "description", ""))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["quotas"] = [q.to_dict() for q in self.quotas]
        return out


def _no_unknown_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise ConfigError(f"unknown key (allowed here: {', '.join(allowed)})", key_path=path)


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError("must be a string", key_path=f"{where}.{key}" if where else key)
    return value


def _names(raw: Any, allowed: tuple[str, ...], key_path: str) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise ConfigError("must not be an empty list", key_path=key_path)
    for n, item in enumerate(items):
        if item not in allowed:
            where = f"{key_path}[{n}]" if isinstance(raw, list) else key_path
            raise ConfigError(
                f"unknown value {short(item, 60)} (allowed: {', '.join(allowed)})", key_path=where
            )
    return tuple(dict.fromkeys(items))


def _parse_quota(raw: Any, where: str) -> Quota:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "a quota must be a mapping with name, count and selectors", key_path=where
        )
    _no_unknown_keys(raw, _QUOTA_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("must be a non-empty string", key_path=f"{where}.name")
    count = raw.get("count")
    if not _is_count(count):
        raise ConfigError(
            f"must be a non-negative integer, got {short(count, 40)}", key_path=f"{where}.count"
        )
    if raw.get("group") is None and raw.get("outcome") is None:
        raise ConfigError("a quota needs a group or an outcome selector", key_path=where)
    groups = None if raw.get("group") is None else _names(raw["group"], GROUPS, f"{where}.group")
    outcomes = (
        None if raw.get("outcome") is None else _names(raw["outcome"], OUTCOMES, f"{where}.outcome")
    )
    ints = {
        selector: None
        if raw.get(selector) is None
        else IntSet.parse(raw[selector], f"{where}.{selector}")
        for selector in _INT_SELECTORS
    }
    return Quota(
        name=name,
        count=count,
        groups=groups,
        outcomes=outcomes,
        description=_text(raw, "description", where),
        **ints,
    )


# --- selection ------------------------------------------------------------------------------


def id_and_labels(sample: Any) -> tuple[str, Mapping[str, Any]]:
    """Default ``key`` of :func:`select`: ``(sample["id"], sample["labels"])``."""
    return sample["id"], sample["labels"]


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
) -> Selection:
    """Choose the rows of ``mixture`` from labelled samples (rules in the module docstring).

    Args:
        samples: rows, read once; ``key`` turns each into ``(id, labels)``.
        mixture: the quotas.
        seed: seed of the hash order; same seed and same set of rows, same result.
        exclude_task_ids, exclude_user_ids: decontamination lists (compared as strings).
        key: extracts ``(id, labels)`` from a row (default: ``row["id"]``, ``row["labels"]``).

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
    taken: set[str] = set()
    for index, quota in enumerate(mixture.quotas):
        cands = [c for c in ordered if c.mask >> index & 1 and c.id not in taken]
        picks = _coverage_order(cands)[: quota.count]
        taken.update(c.id for c in picks)
        out.selected.extend(
            {"id": c.id, "quota": quota.name, "labels": _unproject(c.values)} for c in picks
        )
        out.wanted[quota.name] = quota.count
        out.counts[quota.name] = len(picks)
        out.available[quota.name] = len(cands)
        out.distinct[quota.name] = {
            "env_id": len({c.cover for c in picks if c.cover[0] == "env"}),
            "task_id": len({c.task for c in picks} - {None}),
            "user_id": len({c.user for c in picks} - {None}),
        }
        if len(picks) < quota.count:
            out.shortfall[quota.name] = quota.count - len(picks)
    return out
