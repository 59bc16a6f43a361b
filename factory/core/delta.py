"""Exact state changes (Δ) between two JSON states, and applying them.

Why our own and not RFC 6902 JSON Patch: a Δ here is a training label and a
check ("this action changed exactly these things"), so it must be canonical
and small, and every op carries the value it replaces so a stale Δ is caught
instead of silently applied.

Granularity (as in EnvSimBench): mappings are compared key by key,
recursively; **lists are compared as whole values**. Appending a reservation
id to a user's list is one ``replace`` of ``/users/<id>/reservations`` with the
whole old and new list, never an index-level insert. Scalars are compared
with their JSON type (``1``, ``1.0`` and ``true`` differ), so ``apply`` restores
types exactly.

An op is ``{"op": "add", "path": p, "after": v}``, ``{"op": "remove", "path":
p, "before": v}`` or ``{"op": "replace", "path": p, "before": v, "after": w}``;
absent keys mean "no value" (``None`` would be JSON ``null``). ``path`` is an
RFC 6901 JSON Pointer (``~`` -> ``~0``, ``/`` -> ``~1``); ``""`` is the whole
document. |Δ| is ``len(ops)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from factory.errors import FactoryError, short

__all__ = [
    "DeltaError",
    "apply",
    "changed_size",
    "diff",
    "escape",
    "invert",
    "pointer",
    "same_json",
    "split",
]

OPS = ("add", "remove", "replace")


class DeltaError(FactoryError):
    """An op cannot be applied: its path is missing or its ``before`` is stale."""

    reason = "delta_conflict"


# --- JSON Pointer -------------------------------------------------------------------------


def escape(token: str) -> str:
    """One reference token, RFC 6901-escaped."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(parts: Iterable[str]) -> str:
    """``["users", "a/b"]`` -> ``"/users/a~1b"``."""
    return "".join("/" + escape(p) for p in parts)


def split(path: str) -> list[str]:
    """``"/users/a~1b"`` -> ``["users", "a/b"]``; ``""`` -> ``[]``.

    Raises:
        DeltaError: ``path`` is neither empty nor starts with ``/``.
    """
    if path == "":
        return []
    if not isinstance(path, str) or not path.startswith("/"):
        raise DeltaError(f"not a JSON pointer: {short(path)}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


# --- equality and copies --------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def same_json(a: Any, b: Any) -> bool:
    """Equality of JSON values that also compares types (``1 != 1.0 != True``)."""
    if a is b:
        return True
    kind = _kind(a)
    if kind != _kind(b):
        return False
    if kind == "object":
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if kind == "array":
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _clone(value: Any) -> Any:
    """Deep copy of a JSON value (much faster than ``copy.deepcopy``)."""
    if isinstance(value, Mapping):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clone(v) for v in value]
    return value


# --- diff / apply / invert --------------------------------------------------------------------


def diff(before: Any, after: Any) -> list[dict[str, Any]]:
    """The ops that turn ``before`` into ``after`` (see the module docstring).

    Order: keys of ``before`` in its order (removals and replacements), then keys
    new in ``after`` in its order, depth first. Identical objects (``is``) are
    skipped without a walk, so two forks that share untouched objects diff in
    time proportional to what changed.

    Raises:
        DeltaError: a mapping key on a changed path is not a string.
    """
    ops: list[dict[str, Any]] = []
    _diff(before, after, [], ops)
    return ops


def _diff(a: Any, b: Any, parts: list[str], ops: list[dict[str, Any]]) -> None:
    if a is b:
        return
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key, value in a.items():
            if key in b:
                _diff(value, b[key], [*parts, _str_key(key)], ops)
            else:
                ops.append(
                    {
                        "op": "remove",
                        "path": pointer([*parts, _str_key(key)]),
                        "before": _clone(value),
                    }
                )
        for key, value in b.items():
            if key not in a:
                ops.append(
                    {"op": "add", "path": pointer([*parts, _str_key(key)]), "after": _clone(value)}
                )
    elif not same_json(a, b):
        ops.append(
            {"op": "replace", "path": pointer(parts), "before": _clone(a), "after": _clone(b)}
        )


def _str_key(key: Any) -> str:
    if not isinstance(key, str):
        raise DeltaError(f"mapping key {short(key)} is not a string; JSON states have string keys")
    return key


def apply(ops: Sequence[Mapping[str, Any]], state: Any) -> Any:
    """``state`` with ``ops`` applied, in order; ``state`` itself is not modified.

    The result shares the subtrees no op touches with ``state`` (copying a whole
    database per step would defeat the point); the mappings along each op's path
    and every inserted value are new. Deep-copy the result before mutating it if
    ``state`` must stay untouched.

    Raises:
        DeltaError: an op is malformed, its path (or its parent) does not exist,
            ``add`` targets an existing key, a path walks through a non-mapping
            (lists are whole values), or ``before`` differs from the current value.
    """
    holder: dict[str, Any] = {"": state}
    fresh: set[int] = set()  # ids of mappings this call created (safe to write)
    for index, op in enumerate(ops):
        _apply_one(holder, fresh, index, op)
    return holder[""]


def _writable(parent: dict[str, Any], key: str, fresh: set[int]) -> dict[str, Any]:
    child = parent[key]
    if id(child) not in fresh:
        child = dict(child)
        parent[key] = child
        fresh.add(id(child))
    return child


def _apply_one(holder: dict[str, Any], fresh: set[int], index: int, op: Mapping[str, Any]) -> None:
    kind, path = (op.get("op"), op.get("path")) if isinstance(op, Mapping) else (None, None)
    if kind not in OPS or not isinstance(path, str):
        raise DeltaError(f"op #{index} is not an add/remove/replace op with a path: {short(op)}")
    if kind != "remove" and "after" not in op:
        raise DeltaError(f"op #{index} ({kind} {path}) has no 'after' value")
    parts = ["", *split(path)]
    if len(parts) == 1 and kind != "replace":
        raise DeltaError(f"op #{index} ({kind}): only 'replace' can target the document root")
    node = holder
    for depth, key in enumerate(parts[:-1]):
        if not isinstance(node.get(key), Mapping):
            where = pointer(parts[1 : depth + 1]) or "the document root"
            state = "does not exist" if key not in node else "is not an object"
            raise DeltaError(f"op #{index} ({kind} {path}): {where} {state}")
        node = _writable(node, key, fresh)
    last = parts[-1]
    exists = last in node
    if kind == "add":
        if exists:
            raise DeltaError(f"op #{index} (add {path}): the path already exists")
        node[last] = _clone(op["after"])
        return
    if not exists:
        raise DeltaError(f"op #{index} ({kind} {path}): the path does not exist")
    if "before" in op and not same_json(node[last], op["before"]):
        raise DeltaError(
            f"op #{index} ({kind} {path}): 'before' does not match the current value "
            f"{short(node[last], 80)}"
        )
    if kind == "remove":
        del node[last]
    else:
        node[last] = _clone(op["after"])


def invert(ops: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ops that undo ``ops``: ``apply(invert(d), apply(d, s)) == s``.

    Raises:
        DeltaError: an op lacks the value its inverse needs.
    """
    undone: list[dict[str, Any]] = []
    for op in reversed(ops):
        kind, path = op.get("op"), op.get("path")
        try:
            if kind == "add":
                undone.append({"op": "remove", "path": path, "before": op["after"]})
            elif kind == "remove":
                undone.append({"op": "add", "path": path, "after": op["before"]})
            elif kind == "replace":
                undone.append(
                    {"op": "replace", "path": path, "before": op["after"], "after": op["before"]}
                )
            else:
                raise DeltaError(f"not an add/remove/replace op: {short(op)}")
        except KeyError as exc:
            raise DeltaError(f"{kind} {path} lacks {exc} and cannot be inverted") from None
    return undone


def changed_size(before: Mapping[str, Any], after: Mapping[str, Any]) -> int:
    """Exact |Δ| (``len(diff(before, after))``) between two forks of one world, cheaply.

    Entries of the top-level tables that are the same object in both forks
    cannot differ (a copy-on-write fork copies an object before writing
    it), so only the entries that are not are diffed. The op
    count equals that of diffing the whole states, since ``diff`` emits
    nothing for identical subtrees; for environments that do not share
    objects every entry is diffed, which is slower but still exact.
    """
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key in [*before, *(k for k in after if k not in before)]:
        a, b = before.get(key), after.get(key)
        if key in before and key in after and a is b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = [k for k in b if k not in a or a[k] is not b[k]] + [k for k in a if k not in b]
            old[key] = {k: a[k] for k in keys if k in a}
            new[key] = {k: b[k] for k in keys if k in b}
            continue
        if key in before:
            old[key] = a
        if key in after:
            new[key] = b
    return len(diff(old, new))
