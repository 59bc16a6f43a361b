"""What a run checks and says before its first paid call (issue 25: a safe first command).

Why: the shipped recipe asks gpt-5 for 90,000 rows, about $950; a first command must
not spend that unseen. Before Ray starts, ``factory run``:

1. checks that every endpoint's API key is set (``check_keys``) and that something
   answers a TCP connect at every endpoint's host and port within a few seconds
   (``check_endpoints``; the development server is an endpoint like any other), so
   a missing key or a dead URL is reported in a second, not after Ray started;
2. prints the plan: calls, tokens and cost per stage (``factory.engine.plan``, its
   yield measured by an earlier run of the folder when there is one: ``measured``),
   whether the run resumes the folder's run and why, what the answers in the folder's
   response cache already cost (the cache answers them again at no cost, so only the
   rest is left to pay: ``prior_run``, ``left_to_pay``), and the caps that bound the
   spend (``plan_lines``);
3. on a terminal, asks before a run whose cost left to pay exceeds the recipe's
   ``amplify.confirm_above_usd`` (default $25; ``--confirm-above``), unless ``--yes``
   (``needs_confirmation``). Without a terminal (``ray job submit``) nothing is asked:
   the plan is in the job's log and the recipe's caps stand.

The logic is pure functions over the plan and the recipe; ``factory.run`` calls them.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from factory.errors import FactoryError, UnreachableError
from factory.recipe import AmplifyRecipe, Recipe

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Estimate",
    "Prior",
    "check_endpoints",
    "check_keys",
    "estimate",
    "left_to_pay",
    "measured",
    "needs_confirmation",
    "plan_lines",
    "prior_run",
    "question",
]

CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Estimate:
    """The plan's totals over its LLM stages."""

    calls: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: a stage's model has no price
    batch: bool = False  # cost_usd at the Batch API's prices
    unpriced: tuple[str, ...] = ()


def estimate(stages: list[Any], *, batch: bool = False) -> Estimate:
    """Sum ``factory.engine.plan.StagePlan`` s (anything with their attributes);
    ``batch``: the calls go through a batch API (a batched ``llm.backend``), so
    ``cost_usd`` is at its prices."""
    unpriced = tuple(sorted({s.model for s in stages if s.cost_usd is None}))
    priced = not unpriced
    online = sum(s.cost_usd for s in stages) if priced else None
    batched = sum(s.batch_cost_usd or 0.0 for s in stages) if priced else None
    return Estimate(
        calls=sum(s.calls for s in stages),
        input_tokens=sum(s.input_tokens for s in stages),
        cached_tokens=sum(s.cached_tokens for s in stages),
        output_tokens=sum(s.output_tokens for s in stages),
        cost_usd=batched if batch else online,
        batch=batch,
        unpriced=unpriced,
    )


@dataclass(frozen=True)
class Prior:
    """What the output folder already holds for this run.

    ``cached``: per LLM stage, the answers in the folder's response cache and what they
    cost when paid; the run gets them again at no cost. ``resumes``: why this run
    continues the folder's run (None: a new run, or ``--fresh``). ``finished``: the
    folder holds a finished run of this recipe with the same target, so the run will
    only say "already complete" (``factory.io.runstate.prepare_output``).
    """

    cached: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    resumes: str | None = None
    finished: bool = False

    @property
    def answers(self) -> int:
        return sum(n for n, _ in self.cached.values())

    @property
    def cost_usd(self) -> float:
        return sum(usd for _, usd in self.cached.values())


def _read_json(out_dir: Path | str, name: str) -> dict[str, Any]:
    """``OUT/name`` as a JSON object, from the store when ``out_dir`` is a URI ({} if none)."""
    if isinstance(out_dir, str):
        from factory.io.mirror import read_remote_json

        return read_remote_json(out_dir, name)
    try:
        value = json.loads((out_dir / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def prior_run(
    out_dir: Path | str, cfg: Recipe, *, fresh: bool, drop_cache: bool, retry_failed: bool
) -> Prior:
    """Read ``OUT/run.json`` and the response cache of an earlier run, if any (``run.json``
    from the store when ``out_dir`` is an ``s3://`` URI).

    Why the cache and not the manifest: an interrupted run leaves no manifest (each run
    writes it at its end), and its answers are paid all the same (issue 39: a gpt-5 run
    stopped after 105 answers planned its resume as a fresh run). The answers of a stage
    whose prompts changed since (``OUT/prompts.json``) are not counted: their requests
    have other ids now. A cache behind a URI (``s3://``) is not read here: the run reads
    it, and the plan then says nothing of it.
    """
    from factory.engine.prompts import prompt_fingerprints
    from factory.engine.settings import llm_stages
    from factory.io.runstate import CACHE_DIR, changed_prompts

    state = {} if fresh else _read_json(out_dir, "run.json")
    before = ((state.get("recipe") or {}).get("amplify") or {}).get("target")
    now = cfg.amplify.target if cfg.amplify else None
    status = state.get("status")
    finished = not retry_failed and status == "done" and before == now
    location = cfg.cache.path or f"{str(out_dir).rstrip('/')}/{CACHE_DIR}"
    cached: dict[str, tuple[int, float]] = {}
    local = isinstance(out_dir, Path) and "://" not in location and Path(location).is_dir()
    if cfg.cache.enabled and not drop_cache and local:
        assert isinstance(out_dir, Path)
        stale = set(changed_prompts(out_dir, prompt_fingerprints(cfg)))
        stages = [s for s in llm_stages(cfg) if s not in stale]  # ids start with "<stage>-"
        cached = _cache_spend(location, stages)
    return Prior(cached=cached, resumes=_resumes(state, now, retry_failed), finished=finished)


def _cache_spend(location: str, stages: list[str]) -> dict[str, tuple[int, float]]:
    from factory.io.cache import ResponseCache

    try:
        with ResponseCache(location, refresh_interval_s=0.0) as cache:
            spent = {stage: cache.spend(f"{stage}-") for stage in stages}
    except (OSError, FactoryError):  # an unreadable cache: the run reports it
        return {}
    return {stage: found for stage, found in spent.items() if found[0]}


def _resumes(state: Mapping[str, Any], target: int | None, retry_failed: bool) -> str | None:
    """Why a run continues the folder's run (run.json's ``state``), or None."""
    status = state.get("status")
    if status == "running":
        return "it did not end (interrupted, killed or crashed)"
    if status == "stopped":
        return f"it was stopped ({state.get('stopped_by') or 'short of its target'})"
    if status == "done":
        before = ((state.get("recipe") or {}).get("amplify") or {}).get("target")
        if before != target:
            return f"it finished, and amplify.target changed from {before} to {target}"
        if retry_failed:
            return "it finished; --retry-failed issues its failed calls again"
    return None


def measured(out_dir: Path | str, cfg: Recipe) -> tuple[int, int] | None:
    """``(rows, calls)`` of the folder's last run that ended (``run.json`` totals: rows
    accepted or surplus, calls used), for the plan's yield; None for a new folder, an
    interrupted run (it wrote no totals) or a mixed recipe (its parts differ)."""
    if not isinstance(cfg, AmplifyRecipe):  # no calls, or a mixed recipe's parts
        return None
    totals = _read_json(out_dir, "run.json").get("totals") or {}
    try:
        rows = int(totals.get("accepted") or 0) + int(totals.get("surplus") or 0)
        calls = int(totals.get("total") or 0)
    except (TypeError, ValueError):
        return None
    return (rows, calls) if calls > 0 else None


def left_to_pay(
    stages: list[Any], prior: Prior, *, batch: bool = False
) -> tuple[int, float | None]:
    """``(calls, usd)`` the run has still to pay: per stage, its planned calls less the
    answers of that stage the response cache holds (answered at no cost), at the stage's
    planned cost per call; usd is None when a stage has no price.

    Why per call and not the estimate less what was paid: the estimate's cost per call
    is what the calls left will cost; the cached answers may have cost more or less.
    """
    planned: dict[str, list[Any]] = {}
    for s in stages:  # a mixed recipe's parts (amplify/airline ...) share one cache stage
        planned.setdefault(s.stage.split("/", 1)[0], []).append(s)
    calls, usd, priced = 0, 0.0, True
    for stage, group in planned.items():
        total = sum(s.calls for s in group)
        left = max(0, total - prior.cached.get(stage, (0, 0.0))[0])
        calls += left
        for s in group:
            cost = s.batch_cost_usd if batch else s.cost_usd
            if cost is None:
                priced = False
            elif total:
                usd += cost * left / total
    return calls, (usd if priced else None)


def _usd(value: float) -> str:
    return f"{value:,.2f} USD"


def _tokens(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return str(n)


def caps(cfg: Recipe) -> list[str]:
    """The recipe's caps on spend, as ``key = value`` text."""
    amp = cfg.amplify
    if amp is None:
        return []
    out = []
    if amp.max_cost_usd is not None:
        out.append(f"amplify.max_cost_usd = {_usd(amp.max_cost_usd)}")
    if amp.max_tokens is not None:
        out.append(f"amplify.max_tokens = {amp.max_tokens:,}")
    if amp.max_calls is not None:
        out.append(f"amplify.max_calls = {amp.max_calls:,}")
    return out


def plan_lines(
    est: Estimate,
    cfg: Recipe,
    prior: Prior,
    *,
    devserver: bool = False,
    left: tuple[int, float | None] | None = None,
    out_dir: Path | str | None = None,
) -> list[str]:
    """What a run prints under the plan's table before its first call. ``left``: the
    calls and cost left to pay (``left_to_pay``), shown when the cache holds answers."""
    lines = [
        f"plan: {est.calls:,} LLM calls, {_tokens(est.input_tokens)} prompt tokens "
        f"({_tokens(est.cached_tokens)} of them cached), {_tokens(est.output_tokens)} "
        "completion tokens"
    ]
    if est.cost_usd is None:
        lines.append(
            f"estimated cost: unknown ({', '.join(est.unpriced)} has no price: add it under "
            "prices: in the recipe to estimate and cap the spend)"
        )
    else:
        backend = cfg.llm.backend if cfg.llm is not None else "?"
        how = f" (batch API prices: llm.backend {backend})" if est.batch else ""
        lines.append(f"estimated cost: {_usd(est.cost_usd)}{how}")
    if prior.resumes is not None:
        where = f" in {out_dir}" if out_dir is not None else ""
        lines.append(f"resuming the run{where}: {prior.resumes}")
    if prior.answers:
        cache = f"the response cache {cfg.cache.path}" if cfg.cache.path else "its response cache"
        lines.append(
            f"already paid in this folder: {_usd(prior.cost_usd)} for {prior.answers:,} "
            f"answers in {cache} (reused at no cost)"
        )
        if left is not None:
            calls, usd = left
            cost = "" if usd is None else f", about {_usd(usd)}"
            lines.append(f"left to pay: {calls:,} of the {est.calls:,} calls{cost}")
    found = caps(cfg)
    lines.append(
        f"cap: {', '.join(found)} (the run stops issuing calls there)"
        if found
        else "cap: none (set amplify.max_cost_usd to bound the spend)"
    )
    if devserver:
        lines.append(
            "development server: nothing is paid (the estimate uses the prices the recipe "
            "gives its model)"
        )
    return lines


def question(cost_usd: float, prior: Prior) -> str:
    """The question a terminal is asked: about what is left to pay, on a resume."""
    verb = "Resume" if prior.resumes is not None else "Start"
    if prior.answers:
        return (
            f"{verb} this run? What is left to pay may cost about {_usd(cost_usd)} "
            f"({_usd(prior.cost_usd)} already paid). [y/N] "
        )
    return f"{verb} this run? It may cost about {_usd(cost_usd)}. [y/N] "


def needs_confirmation(
    cost_usd: float | None,
    threshold_usd: float | None,
    *,
    interactive: bool,
    yes: bool,
    paid: bool = True,
) -> bool:
    """Whether to ask a person before the first call.

    Only on a terminal (``interactive``: someone can answer), only for calls that are
    paid (not the development server), only when the estimate is known and above the
    threshold (None: never ask), and never with ``--yes``.
    """
    return (
        paid
        and interactive
        and not yes
        and cost_usd is not None
        and threshold_usd is not None
        and cost_usd > threshold_usd
    )


# -- before Ray: keys and endpoints ---------------------------------------------------------


def _endpoints(cfg: Recipe) -> list[Any]:
    """The recipe's endpoints, unless the run starts its own (``llm.serve``)."""
    llm = cfg.llm if cfg.calls_llm else None
    if llm is None or llm.serve is not None:
        return []
    return list(llm.endpoints)


def check_keys(cfg: Recipe) -> None:
    """Every endpoint's key variable is set (or it needs none).

    Raises:
        ConfigError: naming the variable to export (``factory.llm.client.resolve_api_key``).
    """
    from factory.llm.client import resolve_api_key
    from factory.llm.pool import Endpoint

    for e in _endpoints(cfg):
        resolve_api_key(Endpoint(base_url=e.base_url, api_key_env=e.api_key_env))


def host_port(base_url: str) -> tuple[str, int]:
    """The TCP address an endpoint's requests go to."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


def _connect(address: tuple[str, int], timeout_s: float) -> str | None:
    """None when something accepts a TCP connection at ``address``, else why not."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return None
    except socket.gaierror:
        return "cannot resolve the host name"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def check_endpoints(cfg: Recipe, *, timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
    """Connect to every endpoint's host and port at once; returns a warning per endpoint
    that did not answer while another did (the pool routes around it).

    Raises:
        UnreachableError: no endpoint answered (each one named with why).
    """
    endpoints = _endpoints(cfg)
    if not endpoints:
        return []
    addresses = [host_port(e.base_url) for e in endpoints]
    with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
        found = list(pool.map(lambda a: _connect(a, timeout_s), addresses))
    failed = [
        f"llm.endpoints.{i}.base_url {e.base_url} ({host}:{port}): {why}"
        for i, (e, (host, port), why) in enumerate(zip(endpoints, addresses, found, strict=True))
        if why is not None
    ]
    if failed and len(failed) == len(endpoints):
        raise UnreachableError(
            "no LLM endpoint answers: "
            + "; ".join(failed)
            + ". Check the URL and the network, or start the server; nothing was started"
        )
    return [f"{line}; the run goes on with the other endpoints" for line in failed]
