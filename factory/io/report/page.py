"""``OUT/report.html``: the run report, one self-contained file.

Why one file with no script: a person opens it from a laptop, a cluster's
shared disk or a CI artifact, offline; every plot is an inlined SVG picture
(``plots``), the styles are inline, and nothing is fetched. The page is built
from the manifest (funnel, reasons, tokens, cost, cache, time series) and one
streamed pass over the accepted rows (``stats.RowStats``), headed by what 1,000 accepted
rows cost (the manifest's ``cost_summary``, with the cache-read share and what caching
and a batch API saved); manifest sections
this module does not know (added by other features) are shown as tables, their
numeric mappings as bar plots, and a section that is absent is skipped.
"""

from __future__ import annotations

import contextlib
import html
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.core.labels import GROUPS, STEP_OUTCOMES, TRAJECTORY_OUTCOMES
from factory.io.report import plots
from factory.io.report.folder import OutputFolder, reservoir
from factory.io.report.more import label_order, more_sections
from factory.io.report.stats import RowStats
from factory.io.report.training import SFT_FILE, Fit, fit, load_counter
from factory.io.writer import atomic_write_text

__all__ = ["REPORT_FILE", "Analysis", "analyse", "build_report", "throughput", "write_report"]

REPORT_FILE = "report.html"
SAMPLES = 5
# Manifest keys this page shows in sections of its own (the rest: "More from the manifest").
_KNOWN = {
    "recipe", "config_hash", "versions", "started_at", "wall_time_s", "wall_time_from",
    "totals", "stages", "reasons", "files", "checksums", "tokens", "cost_usd",
    "cost_usd_paid_this_run", "responses_from_cache", "unissued", "timeline", "by_stage",
    "retries", "pipeline",
    "calls", "unissued_by_stage", "target", "prompt_cache", "generated_with_devserver",
    "budget", "timings", "model", "seeds", "mixture", "episodes", "grounding", "domain",
    "cost_summary",
}  # fmt: skip

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:1em 2em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums} .muted{color:#777}
.plots{display:flex;flex-wrap:wrap;gap:1em} figure.plot{margin:0}
figure.plot img{max-width:520px;width:100%;height:auto;border:1px solid #eee}
.conv{border:1px solid #ddd;border-radius:6px;padding:.5em;margin:.8em 0}
.turn{margin:.3em 0;padding:.3em .6em;border-radius:4px;white-space:pre-wrap;word-break:break-word}
.role{font-weight:600;font-size:.85em;text-transform:uppercase;color:#555;display:block}
.human{background:#eef4ff} .gpt{background:#f2f2f2} .function_call{background:#fff6e0}
.observation{background:#eaf7ea;font-family:monospace;font-size:.9em} .system{background:#fafafa}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:.5em;margin:.2em 0}
.headline{font-size:1.5em;margin:.3em 0} .headline b{font-size:1.3em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value else "0"
    return f"{value:,}" if isinstance(value, int) else _e(value)


def _table(rows: list[tuple[Any, ...]], head: tuple[str, ...] | None = None) -> str:
    out = ["<table>"]
    if head and any(head):  # no blank header row over a key/value table
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = []
        for v in row:
            numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
            cells.append(f'<td class="n">{_num(v)}</td>' if numeric else f"<td>{_e(v)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _figures(items: list[plots.Plot]) -> str:
    return (
        '<div class="plots">'
        + "".join(
            f'<figure class="plot"><img class="plot" alt="{_e(p.title)}" src="{p.data_uri()}">'
            f"</figure>"
            for p in items
        )
        + "</div>"
    )


def _section(title: str, body: str, anchor: str) -> str:
    return f'<section id="{_e(anchor)}"><h2>{_e(title)}</h2>{body}</section>'


# -- sections ---------------------------------------------------------------------------------


def _header(folder: OutputFolder) -> str:
    m, state = folder.manifest, folder.state
    status = state.get("status", "?")
    if state.get("stopped_by"):
        status += f" (stopped by {state['stopped_by']})"
    rows = [
        ("recipe", m.get("recipe", "?")),
        ("pipeline", folder.pipeline),
        ("status", status),
        ("started", m.get("started_at", "?")),
        ("wall time", f"{m.get('wall_time_s', 0)} s (since {m.get('wall_time_from', '?')})"),
        ("model", m.get("model") or "none (no LLM)"),
        ("generated with the development server", m.get("generated_with_devserver", False)),
        ("config hash", m.get("config_hash", "?")),
        ("factory version", (m.get("versions") or {}).get("factory", "?")),
    ]
    return f"<h1>Run report: {_e(m.get('recipe', '?'))}</h1>" + _table(rows)


def _funnel(m: Mapping[str, Any]) -> str:
    totals = m.get("totals") or {}
    seeds = m.get("seeds") or {}
    rows: list[tuple[Any, ...]] = []
    steps: dict[str, float] = {}
    if seeds:
        for key in ("total", "kept", "rejected", "failed", "unissued"):
            rows.append((f"seeds {key}", int(seeds.get(key) or 0)))
        steps["seeds"], steps["kept"] = seeds.get("total", 0), seeds.get("kept", 0)
    calls = m.get("calls") or {}
    if calls:
        rows.append(("calls issued", int(calls.get("issued") or 0)))
        if calls.get("rounds"):  # a folder of the round-based engine; the item loop has none
            rows.append(("rounds", int(calls["rounds"])))
        steps["calls"] = calls.get("issued", 0)
    what = {"amplify": "calls", "curate": "seeds", "envsim": "step samples"}
    rows.append((f"total ({what.get(str(m.get('pipeline')), 'rows')})", totals.get("total", 0)))
    for key in ("accepted", "surplus", "rejected", "failed"):
        rows.append((key, totals.get(key, 0)))
        steps[key] = totals.get(key, 0)
    rows.append(("unissued", m.get("unissued", 0)))
    steps["unissued"] = m.get("unissued", 0) or 0
    target = m.get("target") or {}
    if target:
        rows.append(("target", f"{target.get('requested')} (reached: {target.get('reached')})"))
    check = "accepted + surplus + rejected + failed = total: " + (
        "holds"
        if sum(totals.get(k, 0) for k in ("accepted", "surplus", "rejected", "failed"))
        == totals.get("total", 0)
        else "DOES NOT HOLD"
    )
    body = _table(rows, ("", "count")) + f'<p class="muted">{check}</p>'
    return body + _figures([plots.bars(steps, "Funnel", xlabel="rows")])


def _reasons(m: Mapping[str, Any]) -> str:
    merged: Counter[str] = Counter()
    for stage, codes in (m.get("reasons") or {}).items():
        for code, n in codes.items():
            merged[f"{stage}: {code}"] += n
    for key, n in ((m.get("seeds") or {}).get("reasons") or {}).items():
        merged[f"seeds {key}"] += n
    if not merged:
        return "<p>No row was rejected or failed.</p>"
    ordered = dict(merged.most_common())
    body = _table(list(ordered.items()), ("stage: reason", "rows"))
    return body + _figures([plots.bars(ordered, "Reasons", xlabel="rows", horizontal=True)])


def _distributions(m: Mapping[str, Any], stats: RowStats) -> str:
    figs: list[plots.Plot] = []
    outcomes = (*TRAJECTORY_OUTCOMES, *STEP_OUTCOMES)
    if stats.outcome:
        figs.append(plots.bars(label_order(stats.outcome, outcomes), "Outcome", xlabel="rows"))
    if stats.group:
        figs.append(plots.bars(label_order(stats.group, GROUPS), "Group", xlabel="rows"))
    for counts, title, xlabel in (
        (stats.delta_size, "|Δ| (state-change ops)", "|Δ|"),
        (stats.arg_cardinality, "Argument cardinality", "arguments"),
        (stats.turns, "Turns per row", "turns"),
        (stats.calls_per_row, "Tool calls per row", "calls"),
    ):
        if counts:
            figs.append(plots.histogram(counts, title, xlabel=xlabel))
    body = _figures(figs) if figs else "<p>No accepted row to count.</p>"
    mixture = m.get("mixture") or {}
    if mixture.get("wanted"):
        selected, available = mixture.get("selected") or {}, mixture.get("available") or {}
        rows = [
            (
                q,
                w,
                selected.get(q, 0),
                available.get(q, 0),
                (mixture.get("shortfall") or {}).get(q, 0),
            )
            for q, w in mixture["wanted"].items()
        ]
        body += f"<h3>Mixture {_e(mixture.get('name', ''))}: quotas</h3>"
        body += _table(rows, ("quota", "wanted", "selected", "available", "shortfall"))
    return body


def _tools(m: Mapping[str, Any], stats: RowStats) -> str:
    offered = (m.get("domain") or {}).get("tools") or []
    coverage = stats.coverage(offered)
    if not coverage or not sum(coverage.values()):
        return "<p>No tool call in the accepted rows.</p>"
    never = [name for name, n in coverage.items() if not n]
    body = (
        f"<p>{len(coverage) - len(never)} of {len(coverage)} tools called "
        f"({sum(coverage.values()):,} calls).</p>"
    )
    if never:
        body += "<p><b>Never called:</b> " + ", ".join(f"<code>{_e(n)}</code>" for n in never)
        body += "</p>"
    return body + _figures(
        [plots.bars(coverage, "Calls per tool", xlabel="calls", horizontal=True)]
    )


def _seed_yield(m: Mapping[str, Any], stats: RowStats) -> str:
    kept = (m.get("seeds") or {}).get("kept")
    summary = stats.seed_yield(kept)
    if not summary:
        return "<p>The rows carry no seed id.</p>"
    rows = [(k.replace("_", " "), v) for k, v in summary.items()]
    body = _table(rows, ("accepted rows per seed", ""))
    nothing = ((m.get("diversity") or {}).get("per_seed") or {}).get("seeds_with_nothing_ids")
    if nothing:
        body += "<p><b>Seeds without an accepted row:</b> " + ", ".join(map(_e, nothing)) + "</p>"
    histo = Counter(stats.per_seed.values())
    if summary.get("seeds_without_rows"):
        histo[0] += summary["seeds_without_rows"]
    return body + _figures(
        [plots.histogram(histo, "Seeds by accepted rows", xlabel="accepted rows", ylabel="seeds")]
    )


def _usd(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):,.4f} USD"


def _headline(m: Mapping[str, Any]) -> str:
    """What 1,000 accepted rows cost, first: the figure a person compares runs and
    teachers by; then the cache-read share and what caching and a batch API saved. A
    run with no priced model shows the share and no dollar figure."""
    summary = m.get("cost_summary") or {}
    priced = bool(summary.get("priced"))
    per_k = summary.get("per_1k_accepted_usd")
    if not priced:
        head = (
            '<p class="headline">No priced model: no dollar figure (give the model a '
            "price under <code>prices:</code> in the recipe).</p>"
        )
    elif per_k is None:
        head = '<p class="headline">No accepted row: no cost per 1,000 rows.</p>'
    else:
        head = f'<p class="headline"><b>{float(per_k):,.2f} USD</b> per 1,000 accepted rows</p>'
    share = summary.get("cache_read_share")
    rows: list[tuple[Any, ...]] = [("accepted rows", int(summary.get("accepted") or 0))]
    if priced:
        rows.append(("cost of the output", _usd(m.get("cost_usd"))))
    rows.append(
        (
            "prompt tokens read from the provider's cache",
            "n/a" if share is None else f"{float(share):.1%}",
        )
    )
    rows.append(
        ("prompt tokens written to the provider's cache", summary.get("cache_write_tokens", 0))
    )
    if priced:
        rows.append(("caching saved (cost at the full input price, less the cost)",
                     _usd(summary.get("cache_saved_usd"))))  # fmt: skip
        if summary.get("batch_saved_usd") is not None:
            rows.append(("the batch API saved (online price, less the batch price)",
                         _usd(summary["batch_saved_usd"])))  # fmt: skip
    unpriced = summary.get("unpriced_stages") or []
    note = (
        f'<p class="muted">Unpriced stages (counted at 0): {_e(", ".join(unpriced))}.</p>'
        if priced and unpriced
        else ""
    )
    return head + _table(rows, ("", "")) + note


def _cost(m: Mapping[str, Any]) -> str:
    from factory.llm.backends.openai_wire import tokens_usage  # the manifest's token names

    by_stage = m.get("by_stage") or {}
    tokens = m.get("tokens") or {}
    if not by_stage and not tokens:
        return "<p>This run made no LLM call.</p>"
    priced = (m.get("cost_summary") or {}).get("priced", True)

    def share(info: Mapping[str, Any], used: Any) -> str:
        value = info.get("cache_read_share")
        if value is None and used.input:
            value = used.cached_input / used.input
        return "n/a" if value is None else f"{float(value):.1%}"

    rows: list[tuple[Any, ...]] = []
    costs: dict[str, float] = {}
    for stage, info in by_stage.items():
        t = tokens_usage(info.get("tokens"))
        usd = float(info.get("cost_usd") or 0.0)
        costs[stage] = usd
        saved = info.get("cache_saved_usd")
        cells = (usd if priced else "unpriced", "n/a" if saved is None else float(saved))
        rows.append((stage, t.input, t.cached_input, share(info, t), t.cache_write, t.output,
                     *cells))  # fmt: skip
    run = tokens_usage(tokens)
    saved_run = (m.get("cost_summary") or {}).get("cache_saved_usd")
    rows.append(("run", run.input, run.cached_input, share({}, run), run.cache_write, run.output,
                 float(m.get("cost_usd") or 0.0) if priced else "unpriced",
                 "n/a" if saved_run is None else float(saved_run)))  # fmt: skip
    body = _table(rows, ("stage", "prompt tokens", "cached", "cache read", "cache written",
                         "completion tokens", "cost USD", "caching saved USD"))  # fmt: skip
    figs = []
    if by_stage:
        figs.append(plots.bars(costs, "Cost per stage (USD)", xlabel="USD"))
        figs.append(
            plots.bars({r[0]: r[1] + r[5] for r in rows[:-1]}, "Tokens per stage", xlabel="tokens")
        )
    retries = m.get("retries") or {}
    if retries:
        body += "<h3>Retries</h3>" + _table(list(retries.items()), ("reason", "attempts"))
    return body + _figures(figs)


def throughput(
    seconds: list[float], total: list[float], bins: int = 40
) -> tuple[list[float], list[float]]:
    """Rows per second over the phase rows arrive in, from the timeline's cumulative
    ``total`` at its ``seconds``: ``(window starts and the phase's end, rates)``, the
    last rate repeated (a step plot's end); ``([], [])`` when no row arrived.

    Why a phase, not the whole run: a run spends its first seconds (Ray, reading and
    judging seeds) with no row; over the whole run the rows' rate is a flat zero and
    then one step. The phase starts at the last point before the first row (the
    start-up is the span before it) and ends at the point the last row arrived by. The
    rows counted between two points are spread evenly over the time between them, so a
    window's rate does not depend on where the sparse points fell.
    """
    first = next((i for i, n in enumerate(total) if n > 0), None)
    if first is None:
        return [], []
    last = total.index(total[-1])
    begin, end = (seconds[first - 1] if first else seconds[first]), seconds[last]
    before = total[first - 1] if first else 0.0
    if end <= begin:  # every row at one point: its rate over the run so far
        begin = 0.0
    span = max(end - begin, 1e-9)
    width = span / bins
    done = [0.0] * bins
    t0 = begin
    for t, n in zip(seconds[first : last + 1], total[first : last + 1], strict=True):
        rows, before = n - before, n
        if t <= t0:  # no interval (the first point of the timeline): its first window
            done[min(bins - 1, int((t - begin) / width))] += rows
            continue
        for b in range(int((t0 - begin) / width), min(bins, int((t - begin) / width) + 1)):
            low, high = max(t0, begin + b * width), min(t, begin + (b + 1) * width)
            if high > low:
                done[b] += rows * (high - low) / (t - t0)
        t0 = t
    starts = [begin + i * width for i in range(bins)]
    return [*starts, begin + span], [d / width for d in done] + [done[-1] / width]


def _over_time(m: Mapping[str, Any]) -> str:
    timeline = m.get("timeline") or {}
    points, columns = timeline.get("points") or [], timeline.get("columns") or []
    if points and "seconds" in columns and "total" in columns:
        col = {name: [p[i] for p in points] for i, name in enumerate(columns)}
        wall = float(m.get("wall_time_s") or col["seconds"][-1])
        x = [0.0, *col["seconds"], max(wall, col["seconds"][-1])]  # the whole run
        run = (0.0, x[-1])

        def spanned(name: str) -> list[float]:
            return [0.0, *col[name], col[name][-1]]

        since = f"seconds since {m.get('wall_time_from') or 'start'}"
        starts, rates = throughput(col["seconds"], col["total"])
        startup = (0.0, starts[0], "start-up: no row yet") if starts and starts[0] > 0 else None
        counts = {k: spanned(k) for k in ("total", "accepted") if k in col}
        figs = [plots.lines(x, counts, "Rows over time", xlabel=since, ylabel="rows", xlim=run,
                            shade=startup)]  # fmt: skip
        if starts:
            phase = since if startup is None else f"{since} (start-up until {starts[0]:,.1f} s)"
            figs.append(
                plots.lines(starts, {"rows/s": rates}, "Throughput", xlabel=phase,
                            ylabel="rows/s", xlim=(starts[0], starts[-1]), step=True)
            )  # fmt: skip
        if "cost_usd" in col:
            names = {"cost_usd": "cost of the output", "paid_usd": "paid by this run"}
            costs = {names[k]: spanned(k) for k in names if k in col}
            figs.append(plots.lines(x, costs, "Cost over time", xlabel=since, ylabel="USD",
                                    xlim=run, shade=startup))  # fmt: skip
        note = f"{len(points)} points over {x[-1]:,.1f} s of wall time"
        if startup is not None:
            note += (
                f"; the first {starts[0]:,.1f} s are start-up (no row yet), so throughput is"
                f" drawn over the {starts[-1] - starts[0]:,.1f} s rows arrived in"
            )
        return f'<p class="muted">{note}.</p>' + _figures(figs)
    rounds = (m.get("timings") or {}).get("rounds") or []
    if rounds:
        rows = [
            (i + 1, r.get("calls", 0), r.get("seconds", 0.0),
             round(r.get("calls", 0) / r["seconds"], 2) if r.get("seconds") else "")
            for i, r in enumerate(rounds)
        ]  # fmt: skip
        return _table(rows, ("round", "calls", "seconds", "calls/s"))
    return "<p>This run recorded no time series.</p>"


def _training(fit: Fit | None) -> str:
    if fit is None or not fit.lengths:
        return "<p>No accepted row to train on.</p>"
    n = len(fit.lengths)
    rows: list[tuple[Any, ...]] = [
        ("config", SFT_FILE),
        ("model", fit.model),
        ("template (renders the tools)", fit.template),
        ("cutoff_len", fit.cutoff_len),
        ("rows longer than cutoff_len (cut)", f"{fit.over:,} of {n:,} ({fit.over / n:.1%})"),
        ("longest row (tokens)", max(fit.lengths)),
        ("tokens counted with", fit.counted_with),
    ]
    if fit.note:
        rows.append(("note", fit.note))
    counts, width = plots.binned(list(fit.lengths))
    fig = plots.histogram(
        counts, f"Tokens per row (bins of {width:,})", xlabel="tokens", bin_width=width,
        marker=(f"cutoff_len {fit.cutoff_len:,}", fit.cutoff_len),
    )  # fmt: skip
    return _table(rows, ("", "")) + _figures([fig])


def _cache(m: Mapping[str, Any]) -> str:
    calls = (m.get("calls") or {}).get("issued") or 0
    seeds_total = (m.get("seeds") or {}).get("total") or 0
    replayed = m.get("responses_from_cache")
    if replayed is None:
        return "<p>This run has no response cache figures.</p>"
    asked = calls + seeds_total
    rows: list[tuple[Any, ...]] = [("responses replayed from the cache", replayed)]
    if asked:
        rows.append(("share of LLM requests answered from the cache", round(replayed / asked, 4)))
    rows.append(("cost of the output (USD)", float(m.get("cost_usd") or 0.0)))
    rows.append(("paid by this run (USD)", float(m.get("cost_usd_paid_this_run") or 0.0)))
    for key, value in (m.get("prompt_cache") or {}).items():
        rows.append((key.replace("_", " "), value if value is not None else "n/a"))
    return _table(rows, ("", ""))


def _conversation(row: Mapping[str, Any]) -> str:
    meta = row.get("meta") or {}
    head = f"<b>{_e(row.get('id', '?'))}</b>"
    labels = meta.get("labels") or {}
    extra = {k: meta[k] for k in ("seed_id", "variation") if k in meta}
    extra.update(
        {k: v for k, v in labels.items() if v is not None and k in ("outcome", "group", "calls")}
    )
    if extra:
        head += (
            ' <span class="muted">'
            + _e(", ".join(f"{k}={v}" for k, v in extra.items()))
            + "</span>"
        )
    parts = [f'<div class="conv">{head}']
    if row.get("system"):
        parts.append(
            '<details><summary>system prompt</summary><div class="turn system">'
            f"{_e(row['system'])}</div></details>"
        )
    for turn in row.get("conversations") or []:
        role = str(turn.get("from", "?"))
        value = str(turn.get("value") or "")
        if role == "function_call":
            with contextlib.suppress(ValueError):
                value = json.dumps(json.loads(value), indent=1, ensure_ascii=False)
        parts.append(
            f'<div class="turn {_e(role)}"><span class="role">{_e(role)}</span>{_e(value)}</div>'
        )
    parts.append("</div>")
    return "".join(parts)


def _step_sample(row: Mapping[str, Any]) -> str:
    meta = row.get("meta") or {}
    labels = meta.get("labels") or {}
    info = ", ".join(
        f"{k}={labels[k]}"
        for k in ("outcome", "group", "delta_size", "arg_cardinality")
        if k in labels
    )
    if meta.get("tool"):
        info = f"tool={meta['tool']}, {info}"
    return (
        f'<div class="conv"><b>{_e(row.get("id", "?"))}</b> <span class="muted">{_e(info)}</span>'
        "<details><summary>instruction</summary>"
        f"<pre>{_e(row.get('instruction', ''))}</pre></details>"
        f'<span class="role">input</span><pre>{_e(row.get("input", ""))}</pre>'
        f'<span class="role">output</span><pre>{_e(row.get("output", ""))}</pre></div>'
    )


def _samples(folder: OutputFolder, samples: list[dict[str, Any]]) -> str:
    if not samples:
        return "<p>No accepted row.</p>"
    render = _step_sample if folder.row_format == "alpaca" else _conversation
    what = "step samples" if folder.row_format == "alpaca" else "conversations"
    note = f'<p class="muted">{len(samples)} {what} drawn at random (seed 0) from the accepted'
    note += " rows.</p>"
    return note + "".join(render(r) for r in samples)


def _reject_examples(folder: OutputFolder, per_reason: int = 2) -> str:
    shown: Counter[str] = Counter()
    parts = []
    for row in folder.rejects():
        reason = f"{row.get('stage', '?')}: {row.get('reason', '?')}"
        if shown[reason] >= per_reason or (len(shown) > 12 and reason not in shown):
            continue
        shown[reason] += 1
        parts.append(
            f'<div class="conv"><b>{_e(reason)}</b> <span class="muted">'
            f"{_e(row.get('id') or row.get('seed_id') or '')}</span>"
            f"<pre>{_e(str(row.get('message') or '')[:800])}</pre></div>"
        )
    return "".join(parts) or "<p>None.</p>"


# -- the page ---------------------------------------------------------------------------------


@dataclass
class Analysis:
    """One pass over a folder's accepted rows: what the report and sft.yaml need."""

    stats: RowStats
    samples: list[dict[str, Any]]
    fit: Fit


def analyse(folder: OutputFolder, *, samples: int = SAMPLES) -> Analysis:
    """Count the rows (``RowStats``, tokens with the recipe's tokenizer), draw the samples
    and fit the SFT config (``training``), streaming the shards once."""
    recipe = dict(folder.state.get("recipe") or {})
    counter, note = load_counter((recipe.get("output") or {}).get("tokenizer"))
    stats = RowStats(count=counter.count)

    def counted() -> Iterator[dict[str, Any]]:
        for row in folder.rows():
            stats.add(row)
            yield row

    picked = reservoir(counted(), samples)
    recipe["pipeline"] = folder.pipeline
    return Analysis(stats, picked, fit(stats.tokens, counter, recipe, note=note))


def build_report(
    folder: OutputFolder, *, samples: int = SAMPLES, analysis: Analysis | None = None
) -> str:
    """The report page of ``folder`` as one HTML string."""
    a = analysis or analyse(folder, samples=samples)
    stats, m = a.stats, folder.manifest
    sections = [
        *(
            [("Cost per 1,000 accepted rows", _headline(m), "headline")]
            if m.get("cost_summary")
            else []
        ),
        ("Funnel", _funnel(m), "funnel"),
        ("Reasons", _reasons(m), "reasons"),
        ("Distributions", _distributions(m, stats), "distributions"),
        ("Tool coverage", _tools(m, stats), "tools"),
        ("Per-seed yield", _seed_yield(m, stats), "yield"),
        ("Training fit (LLaMA-Factory)", _training(a.fit), "training"),
        ("Tokens and cost per stage", _cost(m), "cost"),
        ("Throughput and cost over time", _over_time(m), "time"),
        ("Response cache", _cache(m), "cache"),
    ]
    more = more_sections(m, _KNOWN)
    if more:
        sections.append(("More from the manifest", more, "more"))
    sections.append(("Samples", _samples(folder, a.samples), "samples"))
    sections.append(("Rejected and failed rows: examples", _reject_examples(folder), "rejects"))
    body = _header(folder) + "".join(_section(t, b, a) for t, b, a in sections)
    title = f"factory run report: {m.get('recipe', '?')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )


def write_report(
    out_dir: Path | str, *, samples: int = SAMPLES, analysis: Analysis | None = None
) -> Path:
    """Write ``OUT/report.html`` (atomically) and return its path.

    Raises:
        ConfigError: ``out_dir`` is not a run's output folder.
        OutputWriteError: the file could not be written.
    """
    folder = OutputFolder(out_dir)
    path = folder.path / REPORT_FILE
    page = build_report(folder, samples=samples, analysis=analysis)
    atomic_write_text(path, page, folder.path)
    return path
