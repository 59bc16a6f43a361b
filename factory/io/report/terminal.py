"""``factory inspect``: rows of an output folder as conversations in the terminal.

Why: reading a dataset should not need a pyarrow script. Each accepted row is
one panel of turns (user, assistant, tool call, tool result), coloured by role;
an envsim step sample is its call, its answer and its labels; a rejected row
is its stage, reason and message. Rendering goes to a ``rich`` Console the
caller passes, so tests render to a string and read what a person would see.
"""

from __future__ import annotations

import difflib
import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from factory.errors import ConfigError
from factory.io.report.folder import OutputFolder, Where, meta_keys, unknown_keys

__all__ = ["inspect_folder", "render_row"]

ROLE_STYLE = {
    "human": ("user", "bold blue"),
    "gpt": ("assistant", "bold green"),
    "function_call": ("tool call", "bold yellow"),
    "observation": ("tool result", "bold magenta"),
    "system": ("system", "bold"),
}
MAX_VALUE = 2000  # characters of one turn shown; the rest is cut with a note


def _clip(text: str, limit: int = MAX_VALUE) -> str:
    return text if len(text) <= limit else text[:limit] + f" … ({len(text) - limit} more chars)"


def _meta_line(meta: Mapping[str, Any]) -> str:
    labels = meta.get("labels") or {}
    parts = [f"{k}={meta[k]}" for k in ("seed_id", "variation", "tool") if meta.get(k) is not None]
    parts += [
        f"{k}={labels[k]}"
        for k in ("outcome", "group", "delta_size", "arg_cardinality", "calls")
        if labels.get(k) is not None
    ]
    return ", ".join(parts)


def _conversation(row: Mapping[str, Any]) -> list[Text]:
    lines: list[Text] = []
    for turn in row.get("conversations") or []:
        role = str(turn.get("from", "?"))
        name, style = ROLE_STYLE.get(role, (role, "bold"))
        value = str(turn.get("value") or "")
        if role == "function_call":
            try:
                call = json.loads(value)
                calls = call if isinstance(call, list) else [call]
                value = "\n".join(
                    f"{c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                    for c in calls
                )
            except (ValueError, AttributeError):
                pass
        text = Text()
        text.append(f"{name}: ", style=style)
        text.append(_clip(value))
        lines.append(text)
    return lines


def _step(row: Mapping[str, Any]) -> list[Text]:
    out = []
    for key in ("input", "output"):
        text = Text()
        text.append(f"{key}: ", style="bold")
        text.append(_clip(str(row.get(key) or "")))
        out.append(text)
    return out


def _reject(row: Mapping[str, Any]) -> list[Text]:
    head = Text()
    head.append(f"{row.get('stage', '?')}: {row.get('reason', '?')}", style="bold red")
    out = [head, Text(_clip(str(row.get("message") or "")))]
    raw = row.get("raw") or row.get("completion") or row.get("record")
    if raw:
        text = Text()
        text.append("raw: ", style="bold")
        text.append(_clip(raw if isinstance(raw, str) else json.dumps(raw), 1200))
        out.append(text)
    return out


def render_row(row: Mapping[str, Any], *, rejected: bool = False) -> Panel:
    """One row as a panel: title = its id, first line = provenance and labels (whole)."""
    meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
    if rejected:
        body = _reject(row)
        meta = {k: row[k] for k in ("seed_id", "variation") if row.get(k) is not None}
    elif "conversations" in row:
        body = _conversation(row)
    else:
        body = _step(row)
    labels = _meta_line(meta or {})
    if labels:  # a line of the body, which wraps: a panel's subtitle is cut at its width
        body.insert(0, Text(labels, style="dim"))
    return Panel(
        Group(*body),
        title=str(row.get("id") or row.get("seed_id") or "?"),
        title_align="left",
        border_style="red" if rejected else "cyan",
    )


def inspect_folder(
    folder: OutputFolder,
    console: Console,
    *,
    n: int = 5,
    where: Iterable[Where] = (),
    rejects: str | None = None,
) -> int:
    """Print the first ``n`` rows that match; returns how many were printed."""
    filters = list(where)
    rows = folder.select(filters, rejects=rejects)
    shown = 0
    for row in itertools.islice(rows, n):
        console.print(render_row(row, rejected=rejects is not None))
        shown += 1
    if not shown:
        _check_keys(folder, filters, rejects)
        what = f"rejected rows with reason {rejects}" if rejects else "accepted rows"
        cond = " and ".join(f"{w.key}={w.value}" for w in filters)
        console.print(f"no {what}" + (f" where {cond}" if cond else "") + f" in {folder.path}")
        if rejects and rejects != "all":
            known = sorted({str(r["reason"]) for r in folder.rejects() if r.get("reason")})
            if known:
                console.print("reasons in this folder: " + ", ".join(known))
    return shown


KEY_SAMPLE = 1000  # rows whose keys are read to tell a mistyped --where key (rows share keys)


def _check_keys(folder: OutputFolder, filters: list[Where], rejects: str | None) -> None:
    """Refuse a ``--where`` key that no row has, naming the keys there are.

    Why: ``--where outcom=refused`` matched nothing and answered ``no accepted rows
    where outcom=refused``, which reads as "no refusals" (issue 39).

    Raises:
        ConfigError: a key no row of the folder has (the closest known key suggested).
    """
    if not filters:
        return
    if rejects is None:
        rows: Iterable[Mapping[str, Any]] = (r["meta"] for r in folder.rows(["meta"]))
    else:
        rows = folder.rejects()
    known = meta_keys(itertools.islice(rows, KEY_SAMPLE))
    unknown = unknown_keys(filters, known)
    if not unknown or not known:
        return
    shown = sorted(k for k in known if "." not in k)
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    guess = f"did you mean {close[0]}? " if close else ""
    what = "rejected rows" if rejects is not None else "rows"
    nested = "labels.outcome" if "labels.outcome" in known else min(known - set(shown), default="")
    how = f" (a dotted path reaches a nested one: {nested})" if nested else ""
    raise ConfigError(
        f"--where {unknown[0]}: no key {unknown[0]} in the {what} of {folder.path}; "
        f"{guess}keys: {', '.join(shown)}{how}"
    )
