"""Seed formats: detect a record's layout and convert it to the canonical Trajectory.

One module per format (``sharegpt``, ``openai_chat``, ``hermes``), each with
``parse(record, *, default_tools=None) -> Trajectory``. :func:`parse_record`
is the one entry point the pipeline uses: it enforces size limits, picks the
format, stamps ``metadata["source"]`` and guarantees that the only exception
leaving it is ``SeedError`` (with a reason code from ``factory.core.reasons``), so
a bad seed becomes a reject row, never a crashed worker.

Detection looks at the message list (``conversations``, ``messages`` or
``traj``) rather than at the key name, since datasets mix them: Hermes when
text carries ``<tool_call>`` / ``<tool_response>`` markup and there are no
structured calls; otherwise ShareGPT for ``{from, value}`` messages and
OpenAI chat for ``{role, content}`` messages. A domain whose actions are text
passes its action grammar, and every record is read by ``textaction`` with it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from factory.core.formats import hermes, openai_chat, sharegpt, textaction
from factory.core.formats._common import LIST_KEYS, message_list
from factory.core.trajectory import Trajectory
from factory.errors import RepairError, SeedError, SeedFormatError, short

if TYPE_CHECKING:
    from factory.core.grammar import ActionGrammar

__all__ = [
    "FORMATS",
    "LIST_KEYS",
    "MAX_RECORD_BYTES",
    "MAX_RECORD_DEPTH",
    "detect_format",
    "parse_record",
]

# Limits that protect a worker from one pathological record; override per call.
MAX_RECORD_BYTES = 2_000_000
MAX_RECORD_DEPTH = 64

Parser = Callable[..., Trajectory]
FORMATS: dict[str, Parser] = {
    sharegpt.FORMAT: sharegpt.parse,
    openai_chat.FORMAT: openai_chat.parse,
    hermes.FORMAT: hermes.parse,
}
_STRUCTURED_ROLES = {"function_call", "observation"}


def check_limits(record: Any, *, max_bytes: int, max_depth: int) -> None:
    """Refuse records whose text size or nesting exceeds the limits (iterative walk).

    Size counts string characters plus a few bytes per scalar, close to the
    record's JSON length, and stops as soon as the limit is passed. Depth counts
    nested containers: ``{"messages": [{...}]}`` has depth 3.

    Raises:
        SeedFormatError: ``too_large``.
    """
    size = 0
    todo: list[tuple[Any, int]] = [(record, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > max_depth and isinstance(item, (dict, list, tuple)):
            raise SeedFormatError("too_large", f"record nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            size += 2 + 4 * len(item)
            for key, value in item.items():
                size += len(key) if isinstance(key, str) else 8
                todo.append((value, depth + 1))
        elif isinstance(item, (list, tuple)):
            size += 2 + len(item)
            todo.extend((value, depth + 1) for value in item)
        elif isinstance(item, (str, bytes)):
            size += len(item) + 2
        else:
            size += 8
        if size > max_bytes:
            raise SeedFormatError("too_large", f"record larger than {max_bytes} bytes")


def detect_format(record: dict[str, Any]) -> str:
    """Name of the format of ``record`` (a key of ``FORMATS``).

    Raises:
        SeedFormatError: ``unknown_format``, ``bad_field_type`` or ``empty_trajectory``.
    """
    key, messages = message_list(record)
    if not messages:
        raise SeedFormatError("empty_trajectory", f"{key} is empty")
    first = messages[0]
    if "from" in first:
        layout = sharegpt.FORMAT
    elif "role" in first:
        layout = openai_chat.FORMAT
    else:
        raise SeedFormatError("unknown_format", f"{key}[0] has neither 'from' nor 'role'")
    structured = False
    markup = False
    for msg in messages:
        role = msg.get("from", msg.get("role"))
        text = msg.get("value", msg.get("content"))
        if role in _STRUCTURED_ROLES or msg.get("tool_calls") or msg.get("function_call"):
            structured = True
            break
        if isinstance(role, str) and isinstance(text, str) and hermes.has_markup(role, text):
            markup = True
    return hermes.FORMAT if markup and not structured else layout


def parse_record(
    record: Any,
    *,
    source: str,
    default_tools: list[dict[str, Any]] | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
    max_depth: int = MAX_RECORD_DEPTH,
    grammar: ActionGrammar | None = None,
) -> Trajectory:
    """Convert one raw seed record into a canonical Trajectory.

    Args:
        record: the decoded record (a dict for every supported format).
        source: provenance, ``"path:index"``, stored in ``metadata["source"]``.
        default_tools: tool specs for records that carry none (tau-bench).
        max_bytes: size limit, roughly the record's JSON length.
        max_depth: nesting limit.
        grammar: the action grammar of a text-action domain: the record is read by
            ``textaction`` (its agent turns' text holds the actions), whatever its layout.

    Returns:
        The Trajectory with metadata ``format``, ``source``, ``repairs``, ``id``
        and, when present, ``reward``, ``task_id``, ``trial``, ``user_id``.

    Raises:
        SeedError: always a ``SeedFormatError`` with a reason code; nothing else.
    """
    try:
        if not isinstance(record, dict):
            raise SeedFormatError(
                "not_an_object", f"expected a JSON object, got {type(record).__name__}"
            )
        check_limits(record, max_bytes=max_bytes, max_depth=max_depth)
        if default_tools is not None and not isinstance(default_tools, list):
            raise SeedFormatError("bad_tools", "default_tools must be a list of tool specs")
        if grammar is not None:
            traj = textaction.parse(record, grammar=grammar)
        else:
            fmt = detect_format(record)
            traj = FORMATS[fmt](record, default_tools=default_tools)
        # JSON inside strings (arguments, tool lists) is decoded only now: nesting the
        # record check could not see would hit the recursion limit in validation.
        nested = {"tools": traj.tools, "turns": [t.to_dict() for t in traj.turns]}
        check_limits(nested, max_bytes=sys.maxsize, max_depth=max_depth)
    except SeedError as exc:
        exc.row_id = exc.row_id or source
        raise
    except RepairError as exc:
        raise SeedFormatError(exc.reason, str(exc), row_id=source) from exc
    except RecursionError as exc:
        raise SeedFormatError("too_large", "record nested too deeply", row_id=source) from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        message = f"{type(exc).__name__}: {short(str(exc), 120)}"
        raise SeedFormatError("bad_field_type", message, row_id=source) from exc
    traj.metadata["source"] = source
    return traj
