"""What a run checks and says before its first paid call (issue 25: a safe first command).

Why: the shipped recipe asks gpt-5 for 90,000 rows, about $950; a first command must
not spend that unseen. Before Ray starts, ``factory run``:

1. checks that every endpoint's API key is set (``check_keys``) and that something
   answers a TCP connect at every endpoint's host and port within a few seconds
   (``check_endpoints``; the development server is an endpoint like any other), so
   a missing key or a dead URL is reported in a second, not after Ray started;
2. prints the plan: calls, tokens and cost per stage (``factory.engine.plan``), what
   earlier runs of the folder already paid (their calls come back from the response
   cache at no cost), and the caps that bound the spend (``plan_lines``);
3. on a terminal, asks before a run whose cost left to pay exceeds the recipe's
   ``amplify.confirm_above_usd`` (default $25; ``--confirm-above``), unless ``--yes``
   (``needs_confirmation``). Without a terminal (``ray job submit``) nothing is asked:
   the plan is in the job's log and the recipe's caps stand.

The logic is pure functions over the plan and the recipe; ``factory.run`` calls them.
"""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from factory.config import RecipeConfig
from factory.errors import UnreachableError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Estimate",
    "Prior",
    "check_endpoints",
    "check_keys",
    "estimate",
    "needs_confirmation",
    "plan_lines",
    "prior_run",
]

CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Estimate:
    """The plan's totals over its LLM stages."""

    calls: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: a stage's model has no price
    batch: bool = False  # cost_usd at the Batch API's prices
    unpriced: tuple[str, ...] = ()


def estimate(stages: list[Any], *, batch: bool = False) -> Estimate:
    """Sum ``factory.engine.plan.StagePlan`` s (anything with their attributes);
    ``batch``: the calls go through a batch API (``llm.backend: openai_batch``), so
    ``cost_usd`` is at its prices."""
    unpriced = tuple(sorted({s.model for s in stages if s.cost_usd is None}))
    priced = not unpriced
    online = sum(s.cost_usd for s in stages) if priced else None
    batched = sum(s.batch_cost_usd or 0.0 for s in stages) if priced else None
    return Estimate(
        calls=sum(s.calls for s in stages),
        prompt_tokens=sum(s.prompt_tokens for s in stages),
        cached_tokens=sum(s.cached_tokens for s in stages),
        completion_tokens=sum(s.completion_tokens for s in stages),
        cost_usd=batched if batch else online,
        batch=batch,
        unpriced=unpriced,
    )


@dataclass(frozen=True)
class Prior:
    """What an earlier run of the output folder left: its cost and whether it finished."""

    cost_usd: float = 0.0
    finished: bool = False


def prior_run(
    out_dir: Path | str, cfg: RecipeConfig, *, fresh: bool, drop_cache: bool, retry_failed: bool
) -> Prior:
    """Read ``OUT/manifest.json`` and ``OUT/run.json`` of an earlier run, if any (from the
    store when ``out_dir`` is an ``s3://`` URI).

    ``cost_usd``: what the folder's output cost so far; those calls are answered from
    the response cache again (0 when the cache is off or dropped). ``finished``: the
    folder holds a finished run of this recipe with the same target, so the run will
    only say "already complete" (``factory.io.runstate.prepare_output``).
    """

    def read(name: str) -> dict[str, Any]:
        if isinstance(out_dir, str):
            from factory.io.mirror import read_remote_json

            return read_remote_json(out_dir, name)
        try:
            value = json.loads((out_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    state = read("run.json")
    cost = 0.0
    if cfg.cache.enabled and not drop_cache:
        cost = float(read("manifest.json").get("cost_usd") or 0.0)
    before = ((state.get("recipe") or {}).get("amplify") or {}).get("target")
    now = cfg.amplify.target if cfg.amplify else None
    finished = not fresh and not retry_failed and state.get("status") == "done" and before == now
    return Prior(cost_usd=cost, finished=finished)


def _usd(value: float) -> str:
    return f"{value:,.2f} USD"


def _tokens(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return str(n)


def caps(cfg: RecipeConfig) -> list[str]:
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


def to_pay(est: Estimate, prior: Prior) -> float | None:
    """The estimated cost left to pay: the estimate less what the cache will answer."""
    if est.cost_usd is None:
        return None
    return max(0.0, est.cost_usd - prior.cost_usd)


def plan_lines(
    est: Estimate, cfg: RecipeConfig, prior: Prior, *, devserver: bool = False
) -> list[str]:
    """What a run prints under the plan's table before its first call."""
    lines = [
        f"plan: {est.calls:,} LLM calls, {_tokens(est.prompt_tokens)} prompt tokens "
        f"({_tokens(est.cached_tokens)} of them cached), {_tokens(est.completion_tokens)} "
        "completion tokens"
    ]
    if est.cost_usd is None:
        lines.append(
            f"estimated cost: unknown ({', '.join(est.unpriced)} has no price: add it under "
            "prices: in the recipe to estimate and cap the spend)"
        )
    else:
        how = " (Batch API prices: llm.backend openai_batch)" if est.batch else ""
        lines.append(f"estimated cost: {_usd(est.cost_usd)}{how}")
    if prior.cost_usd > 0:
        left = to_pay(est, prior)
        rest = f"; about {_usd(left)} left to pay" if left is not None else ""
        lines.append(
            f"already paid in this folder: {_usd(prior.cost_usd)} (those calls are answered "
            f"from the response cache at no cost){rest}"
        )
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


def _endpoints(cfg: RecipeConfig) -> list[Any]:
    """The recipe's endpoints, unless the run starts its own (``llm.serve``)."""
    if cfg.llm is None or cfg.llm.serve is not None or cfg.pipeline != "amplify":
        return []
    return list(cfg.llm.endpoints)


def check_keys(cfg: RecipeConfig) -> None:
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


def check_endpoints(cfg: RecipeConfig, *, timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
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
