"""What a run returns, and the manifest and progress bar every job starts from.

Why a module of its own: ``runner`` dispatches to the jobs (``factory.engine.jobs``)
and the jobs build the same ``RunResult``; with these in ``runner`` the jobs and
the runner imported each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.engine.console import ProgressBar, run_clock
from factory.engine.ledger import Ledger
from factory.engine.loop import JobReport
from factory.errors import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_OK, EXIT_UNREACHABLE, EXIT_WRITE
from factory.io.writer import Manifest
from factory.llm.backends.openai_wire import tokens_usage
from factory.llm.costs import cache_read_share, per_thousand
from factory.recipe import Recipe, config_hash

__all__ = [
    "CAPS",
    "STAGE_ORDER",
    "RunResult",
    "cost_line",
    "cost_lines",
    "cost_summary",
    "domain_summary",
    "new_manifest",
    "write_manifest",
]

STAGE_ORDER = (
    "read",
    "parse",
    "seed_check",
    "validate",
    "prefilter",
    "amplify",
    "postprocess",
    "export",
    "decontam",
    "dedup",
    "neardup",
)
CAPS = ("max_calls", "max_cost_usd", "max_tokens")


@dataclass
class RunResult:
    out_dir: Path | str  # a folder, or the s3:// URI of a remote output
    totals: dict[str, int]
    manifest: dict[str, Any]
    # Why the run ended short of its target: a cap (``max_cost_usd`` ...), ``no_progress``
    # (many calls in a row gave no row), ``unreachable`` (no call succeeded for
    # ``llm.stall_s``) or ``cache_write`` (the cache refused a response).
    stopped_by: str | None = None
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a write failure that stopped the run (path and OS error)

    @property
    def exit_code(self) -> int:
        """0 only when the run did what was asked (docs/cli.md, "Exit codes")."""
        if self.error is not None:
            return EXIT_WRITE
        if self.stopped_by == "unreachable":
            return EXIT_UNREACHABLE
        if self.stopped_by in CAPS:
            return EXIT_BUDGET
        return EXIT_INCOMPLETE if self.stopped_by else EXIT_OK

    def summary(self) -> str:
        t = self.totals
        lines = [
            f"output: {self.out_dir}",
            f"rows: {t.get('total', 0)} total = {t.get('accepted', 0)} accepted"
            f" + {t.get('surplus', 0)} surplus + {t.get('rejected', 0)} rejected"
            f" + {t.get('failed', 0)} failed",
        ]
        decided = self.manifest.get("stages", {})
        if decided:
            lines.append(f"{'deciding stage':<16}{'accepted':>10}{'rejected':>10}{'failed':>8}")
            order = {s: i for i, s in enumerate(STAGE_ORDER)}
            for stage in sorted(decided, key=lambda s: order.get(s, 99)):
                c = decided[stage]
                lines.append(
                    f"{stage:<16}{c.get('accepted', 0):>10}{c.get('rejected', 0):>10}"
                    f"{c.get('failed', 0):>8}"
                )
        reasons = self.manifest.get("reasons", {})
        for stage, codes in reasons.items():
            for code, n in sorted(codes.items(), key=lambda kv: -kv[1]):
                lines.append(f"  {stage}: {code} x{n}")
        lines += cost_lines(self.manifest)
        retries = self.manifest.get("retries") or {}
        if retries:  # summarised here; one line per retry only at DEBUG
            by_count = sorted(retries.items(), key=lambda kv: -kv[1])
            lines.append("retries: " + ", ".join(f"{code} x{n}" for code, n in by_count))
        if self.extra.get("report"):
            lines.append(self.extra["report"])
        since = self.manifest.get("wall_time_from")
        lines.append(f"wall time: {self.wall_s:.1f}s" + (f" (since {since})" if since else ""))
        if self.stopped_by in CAPS:
            lines.append(f"stopped by cap: {self.stopped_by} (raise it and run again to continue)")
        elif self.extra.get("stop_message"):
            lines.append(f"stopped before the target: {self.extra['stop_message']}")
        elif self.stopped_by:
            lines.append(
                f"stopped before the target: {self.stopped_by} "
                "(run the same command again to continue)"
            )
        return "\n".join(lines)


def _usd(value: float, *, cents_from: float = 100.0) -> str:
    return f"{value:,.2f}" if abs(value) >= cents_from else f"{value:,.4f}"


def cost_lines(manifest: dict[str, Any]) -> list[str]:
    """The summary's cost block: the cost per 1,000 accepted rows first (the headline),
    then what the output cost and this run paid, the tokens with the share read from the
    provider's prompt cache and the tokens written to it, what caching and batching
    saved, and each stage's cache-read share. A run with no priced model shows the
    shares and no dollar figure (its cost would claim a 0 nobody paid)."""
    tokens = manifest.get("tokens") or {}
    if not tokens:
        return []
    summary = manifest.get("cost_summary") or {}
    priced = summary.get("priced", True)  # a manifest from before the section: priced
    used = tokens_usage(tokens)
    lines = []
    per_k = summary.get("per_1k_accepted_usd")
    if not priced:
        lines.append("cost: no priced model (add it under prices: in the recipe): no USD figure")
    elif per_k is not None:
        lines.append(
            f"cost: {_usd(float(per_k), cents_from=1.0)} USD per 1,000 accepted rows; "
            f"{cost_line(manifest)}"
        )
    else:
        lines.append(f"cost: {cost_line(manifest)} (no accepted row)")
    share = cache_read_share(used)
    cache = "" if share is None else f", {share:.1%} read from the provider's prompt cache"
    written = f"; {used.cache_write:,} written to it" if used.cache_write else ""
    lines.append(
        f"  tokens: prompt {used.input:,} (cached {used.cached_input:,}{cache}{written}), "
        f"completion {used.output:,}"
    )
    saved = []
    if priced and summary.get("cache_saved_usd") is not None:
        saved.append(f"caching saved {_usd(float(summary['cache_saved_usd']))} USD")
    if priced and summary.get("batch_saved_usd") is not None:
        saved.append(f"the batch API saved {_usd(float(summary['batch_saved_usd']))} USD")
    if saved:
        lines.append("  " + "; ".join(saved))
    shares = {
        stage: info.get("cache_read_share")
        for stage, info in (manifest.get("by_stage") or {}).items()
        if info.get("cache_read_share") is not None
    }
    if len(shares) > 1:
        order = {s: i for i, s in enumerate(STAGE_ORDER)}
        lines.append(
            "  cache read by stage: "
            + ", ".join(
                f"{stage} {shares[stage]:.1%}"
                for stage in sorted(shares, key=lambda s: order.get(s, 99))
            )
        )
    return lines


def cost_summary(manifest: Manifest, ledger: Ledger, accepted: int) -> dict[str, Any]:
    """The manifest's ``cost_summary``: the cost per 1,000 accepted rows, the run's
    cache-read share and cache writes, what caching and batching saved; from the
    manifest's final ``tokens`` and ``cost_usd`` (a job's own, a mixed recipe's over its
    parts) and the ledger's priced stages. No dollar figure when no stage is priced."""
    used = tokens_usage(manifest.extra.get("tokens") or {})
    priced = any(paid is not None for paid, _ in ledger.prices.values())
    cost = float(manifest.extra.get("cost_usd") or 0.0) if priced else None
    share = cache_read_share(used)
    per_k = per_thousand(cost, accepted)
    savings = ledger.savings() if priced else {}
    return {
        "per_1k_accepted_usd": None if per_k is None else round(per_k, 6),
        "accepted": accepted,
        "priced": priced,
        "unpriced_stages": sorted(s for s, (paid, _) in ledger.prices.items() if paid is None),
        "cache_read_share": None if share is None else round(share, 4),
        "cache_write_tokens": used.cache_write,
        "cache_saved_usd": savings.get("cache_saved_usd"),
        "batch_saved_usd": savings.get("batch_saved_usd"),
    }


def cost_line(manifest: dict[str, Any]) -> str:
    """What the output cost and what this run paid: an extended or resumed run replays
    the calls earlier runs paid for from the cache, so the two differ (issue 25)."""
    total = float(manifest.get("cost_usd") or 0.0)
    paid = manifest.get("cost_usd_paid_this_run")
    if paid is None or abs(float(paid) - total) < 5e-5:
        return f"cost {total:.4f} USD"
    return (
        f"paid by this run {float(paid):.4f} USD; cost of the whole output {total:.4f} USD "
        "(the rest answered from the response cache)"
    )


def _progress(enabled: bool, total: int | None, desc: str) -> ProgressBar:
    return ProgressBar(total=total, desc=desc, disable=not enabled, unit="row", dynamic_ncols=True)


def new_manifest(cfg: Recipe, domain: dict[str, Any] | None = None) -> Manifest:
    """The run's manifest, timed by the run's clock (``factory.engine.console.run_clock``);
    ``domain``: its ``domain`` section when the job gives its own (a mixed recipe's parts),
    else ``domain_summary``."""
    started, since = run_clock()
    manifest = Manifest(
        recipe=cfg.name, config_hash=config_hash(cfg), started=started, wall_time_from=since
    )
    manifest.extra["domain"] = domain_summary(cfg) if domain is None else domain
    return manifest


def domain_summary(cfg: Recipe) -> dict[str, Any]:
    """The manifest's ``domain``: its name and every tool it offers, so the report can
    list the tools no row called (envsim's step samples carry no tool list). A recipe
    reading several packs (a mixed recipe's parts) gets its name only: its job names its
    parts (``MixJob``)."""
    from factory.envs.pack import load_domain

    if cfg.domains() != [cfg.domain]:
        return {"name": cfg.domain.name}
    tools = [str(t.get("name")) for t in load_domain(cfg.domain).public_tools()]
    return {"name": cfg.domain.name, "tools": sorted(tools)}


def write_manifest(
    out_dir: Path,
    manifest: Manifest,
    ledger: Ledger,
    *,
    pipeline: str,
    report: JobReport,
) -> dict[str, int]:
    """Write ``manifest.json`` from the run's ledger (totals, stages, reasons, tokens,
    cost, budget, timeline) and the job's report (``Job.finish``: its own sections, and
    its own totals and stages when its rows are decided after the loop); returns the
    totals."""
    totals = dict(report.totals) if report.totals is not None else ledger.totals()
    manifest.stages = (
        {stage: dict(kinds) for stage, kinds in report.stages.items()}
        if report.stages is not None
        else ledger.stages()
    )
    for stage, codes in ledger.reasons.items():
        for code, n in codes.items():
            manifest.reason(stage, code, n)
    manifest.extra.update(pipeline=pipeline, **ledger.manifest_fields())
    for key, value in report.sections.items():
        if value is not None or key == "mixture":
            manifest.extra[key] = value
    if ledger.prices:  # a job with LLM stages: its cost summary (a curation pays nothing)
        manifest.extra["cost_summary"] = cost_summary(manifest, ledger, totals.get("accepted", 0))
    manifest.write(out_dir, **totals)
    return totals
