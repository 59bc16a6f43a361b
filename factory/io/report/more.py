"""The report's "More from the manifest": manifest sections no other section shows.

Why a module: these sections come from many features (diversity, budget, batches,
grounding, decontamination, the held-out split, the serving pool), and dumped as
nested tables they were unreadable ("None" sections, histograms twice, counts and a
ratio on one axis). Here each known section has a renderer that shows it as a
table or a plot; any other section is flattened to one table of ``key path: value``
rows. Nothing already shown elsewhere on the page is repeated, and a section with
nothing in it is left out.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from factory.io.report import plots

__all__ = ["SHOWN_ELSEWHERE", "flatten", "label_order", "more_sections", "natural_key"]

# Diversity parts another section of the page already plots (from the rows).
SHOWN_ELSEWHERE = {"tool_calls", "calls_per_row", "turns", "tokens", "per_seed"}
# Labels the Distributions section plots.
PLOTTED_LABELS = {"outcome", "group", "delta_size", "arg_cardinality", "calls"}
_MAX_ROWS = 60  # rows of one flattened table; the rest is counted


def natural_key(value: Any) -> tuple[Any, ...]:
    """Sort key: numbers by value (1, 2, 11), then text; "None" last."""
    text = str(value)
    try:
        return (0, float(text), "")
    except ValueError:
        return (2, 0.0, text) if text == "None" else (1, 0.0, text)


def label_order(counts: Mapping[str, Any], order: tuple[str, ...] = ()) -> dict[str, Any]:
    """``counts`` in a known order (``order``: e.g. the |Δ| groups from Failure to
    Beyond), the rest after it in natural order."""
    rank = {v: i for i, v in enumerate(order)}
    return dict(
        sorted(counts.items(), key=lambda kv: (rank.get(kv[0], len(rank)), natural_key(kv[0])))
    )


def _e(value: Any) -> str:
    return html.escape(str(value))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, int):
        return f"{value:,}"
    return _e(value)


def _table(rows: list[tuple[Any, ...]], head: tuple[str, ...]) -> str:
    out = ["<table>"]
    if any(head):  # no blank header row over a key/value table
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = "".join(
            f'<td class="n">{_fmt(v)}</td>'
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            else f"<td>{_fmt(v)}</td>"
            for v in row
        )
        out.append(f"<tr>{cells}</tr>")
    return "".join(out) + "</table>"


def _empty(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, (Mapping, list)) and not value)


def flatten(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(key path, value)`` for every scalar under ``value``; a list of scalars is one
    value (joined), empty values and None are skipped."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from flatten(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        if all(not isinstance(v, (Mapping, list)) for v in value):
            if value:
                text = ", ".join(str(v) for v in value[:20])
                yield path, text + (f" (+{len(value) - 20} more)" if len(value) > 20 else "")
        else:
            for i, v in enumerate(value):
                yield from flatten(v, f"{path}.{i}")
    elif not _empty(value):
        yield path, value


def _flat_table(value: Any) -> str:
    rows = list(flatten(value))
    if not rows:
        return ""
    body = _table(rows[:_MAX_ROWS], ("key", "value"))
    if len(rows) > _MAX_ROWS:
        body += f'<p class="muted">{len(rows) - _MAX_ROWS} more values in manifest.json</p>'
    return body


def _figures(items: list[plots.Plot]) -> str:
    if not items:
        return ""
    figs = "".join(
        f'<figure class="plot"><img class="plot" alt="{_e(p.title)}" src="{p.data_uri()}"></figure>'
        for p in items
    )
    return f'<div class="plots">{figs}</div>'


def _counts(value: Any) -> dict[str, int] | None:
    """A mapping of category -> count (ints only), else None."""
    if not isinstance(value, Mapping) or not value:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        return {str(k): int(v) for k, v in value.items()}
    return None


def _histogram_of(summary: Mapping[str, Any], title: str, xlabel: str) -> plots.Plot | None:
    """A ``histogram_summary`` (``core.diversity``) as an integer histogram."""
    hist = _counts(summary.get("histogram"))
    if not hist:
        return None
    try:
        ints = {int(k): v for k, v in hist.items()}
    except ValueError:
        return None
    return plots.histogram(ints, title, xlabel=xlabel)


def _diversity(d: Mapping[str, Any]) -> str:
    scalars = [
        (k.replace("_", " "), v)
        for k, v in d.items()
        if not isinstance(v, (Mapping, list)) and not _empty(v) and k != "unit"
    ]
    body = _table(scalars, ("", "")) if scalars else ""
    ngrams = d.get("user_distinct_ngrams") or {}
    if ngrams:
        rows = [
            (f"{n}-grams", v.get("distinct"), v.get("total"), v.get("ratio"))
            for n, v in sorted(ngrams.items(), key=lambda kv: natural_key(kv[0]))
            if isinstance(v, Mapping)
        ]
        body += "<h4>Distinct word n-grams of the user turns</h4>"
        body += _table(rows, ("n", "distinct", "total", "distinct / total"))
    figs = []
    tools_per_row = d.get("tools_per_row")
    if isinstance(tools_per_row, Mapping):
        fig = _histogram_of(tools_per_row, "Distinct tools per row", "tools")
        figs += [fig] if fig else []
    constant = []
    for name, counts in sorted((d.get("labels") or {}).items()):
        found = _counts(counts)
        if not found or name in PLOTTED_LABELS or set(found) <= {"None"}:
            continue  # plotted above, or never set on these rows
        if len(found) == 1:
            constant.append((name, next(iter(found))))
            continue
        figs.append(plots.bars(label_order(found), f"Label {name}", xlabel="rows"))
    if constant:
        body += "<h4>Labels with one value on every row</h4>"
        body += _table(constant, ("label", "value"))
    for key, title in (("per_task", "Rows per task"), ("quotas", "Mixture quotas")):
        part = d.get(key)
        if isinstance(part, Mapping) and part:
            body += f"<h4>{title}</h4>" + _flat_table(part)
    return body + _figures(figs)


def _budget(b: Mapping[str, Any]) -> str:
    rows = []
    for cap, used, what in (
        ("max_cost_usd", "cost_usd", "cost (USD)"),
        ("max_tokens", "tokens", "tokens"),
        ("max_calls", "calls", "calls"),
    ):
        limit = b.get(cap)
        rows.append((what, b.get(used) or 0, "no cap" if limit is None else limit))
    body = _table(rows, ("", "used", "cap"))
    stop = b.get("stopped_by")
    refused = b.get("refused") or 0
    body += (
        f'<p class="muted">calls refused at a cap: {refused:,}; stopped by: {stop or "none"}</p>'
    )
    return body


def _batches(b: Mapping[str, Any]) -> str:
    summary = [(k.replace("_", " "), v) for k, v in b.items() if k not in ("batches", "by_status")]
    body = _table(summary, ("", ""))
    if b.get("by_status"):
        body += _table(list(b["by_status"].items()), ("status", "batches"))
    listed = [
        (x.get("id"), x.get("status"), x.get("requests"),
         (x.get("request_counts") or {}).get("completed"),
         (x.get("request_counts") or {}).get("failed"))
        for x in b.get("batches") or ()
    ]  # fmt: skip
    if listed:
        body += _table(listed, ("batch", "status", "requests", "completed", "failed"))
    return body


_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "diversity": _diversity,
    "budget": _budget,
    "batches": _batches,
}


def more_sections(m: Mapping[str, Any], known: set[str]) -> str:
    """HTML of every manifest section not in ``known`` (and ``budget``, ``grounding``),
    each a table or plots; empty sections are left out."""
    parts = []
    keys = sorted((set(m) - known) | {"budget", "grounding"})
    for key in keys:
        value = m.get(key)
        if _empty(value):
            continue
        render = _RENDERERS.get(key)
        body = render(value) if render and isinstance(value, Mapping) else _flat_table(value)
        if body:
            parts.append(f"<h3>{_e(key)}</h3>{body}")
    return "".join(parts)
