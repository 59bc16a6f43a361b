"""``python -m factory.devserver``: serve the simulated model until SIGINT/SIGTERM.

Prints exactly one line, ``factory devserver listening on http://127.0.0.1:PORT/v1``,
so scripts can read the URL (``--port 0`` picks a free port). Exits 0 on a
signal, on ``POST /admin/stop`` and after ``--fail-after`` requests; 2 on a
bad option; 1 when the port cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from factory.devserver.app import DEFECTS, LATENCY_KINDS, DevServerConfig, parse_defects
from factory.devserver.server import start_server
from factory.errors import EXIT_CONFIG, EXIT_INTERNAL, ConfigError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m factory.devserver",
        description="OpenAI-compatible development LLM server that simulates a model on 127.0.0.1.",
    )
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port)")
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="ID",
        help="model id to list (repeatable; default factory-dev)",
    )
    p.add_argument(
        "--strict-models", action="store_true", help="answer 404 for a model id that is not listed"
    )
    p.add_argument("--latency", choices=LATENCY_KINDS, default="fixed", help="latency distribution")
    p.add_argument("--latency-ms", type=float, default=0.0, help="fixed or mean latency")
    p.add_argument(
        "--latency-spread-ms",
        type=float,
        default=0.0,
        help="half-width (uniform) or standard deviation (lognormal)",
    )
    p.add_argument(
        "--latency-p99-ratio",
        type=float,
        default=None,
        metavar="R",
        help="lognormal only: --latency-ms is the median and p99 = R x median (heavy tail)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=256,
        help="requests generated at once; the rest queue",
    )
    p.add_argument(
        "--defects", default="", help=f"name=rate,... with names from: {', '.join(DEFECTS)}"
    )
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds of a 429")
    p.add_argument("--stall-seconds", type=float, default=300.0, help="how long a stall lasts")
    p.add_argument(
        "--fence-rate",
        type=float,
        default=0.2,
        help="share of JSON answers wrapped in a ```json fence",
    )
    p.add_argument(
        "--sim-drop-change",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of simulate answers that leave one state change out",
    )
    p.add_argument(
        "--wrong-observation",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of amplification answers with one observation that contradicts the world",
    )
    p.add_argument(
        "--repeat",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of amplification answers that are renamed copies of an earlier "
        "request's reference (planted near-duplicates)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-log", metavar="PATH", help="append one JSON line per request")
    p.add_argument(
        "--fail-after",
        type=int,
        metavar="N",
        help="die (drop connections, stop listening) when request N+1 arrives",
    )
    p.add_argument(
        "--batch-delay",
        type=float,
        default=1.0,
        metavar="S",
        help="Batch API: seconds a batch takes from validating to completed",
    )
    p.add_argument(
        "--batch-error-rate",
        type=float,
        default=0.0,
        metavar="RATE",
        help="Batch API: share of requests answered with an error line (500)",
    )
    p.add_argument(
        "--batch-fail-first",
        type=int,
        default=0,
        metavar="N",
        help="Batch API: the first N batches created fail validation",
    )
    p.add_argument(
        "--batch-expire-first",
        type=int,
        default=0,
        metavar="N",
        help="Batch API: the next N batches expire half-way (partial output)",
    )
    p.add_argument(
        "--anthropic-overloaded",
        action="store_true",
        help="Anthropic Messages: the server_error defect answers 529 overloaded_error",
    )
    p.add_argument(
        "--gemini-cache-min-tokens",
        type=int,
        default=1024,
        metavar="N",
        help="Gemini API: the shortest prefix a cachedContents cache takes (400 below it)",
    )
    p.add_argument(
        "--rpm",
        type=float,
        default=None,
        metavar="N",
        help="requests per minute a provider's budget allows (429 beyond; x-ratelimit-* headers)",
    )
    p.add_argument(
        "--tpm",
        type=float,
        default=None,
        metavar="N",
        help="tokens per minute (prompt estimate + max_tokens of each request)",
    )
    p.add_argument(
        "--rate-window",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds of the --rpm/--tpm budget held at once (60: a full minute; 1: "
        "quantized per second, as OpenAI may enforce it)",
    )
    return p  # fmt: skip


def config_from_args(args: argparse.Namespace) -> DevServerConfig:
    """Raises: ConfigError for a bad option value."""
    return DevServerConfig(
        port=args.port,
        models=tuple(args.models or ("factory-dev",)),
        strict_models=args.strict_models,
        latency=args.latency,
        latency_ms=args.latency_ms,
        latency_spread_ms=args.latency_spread_ms,
        latency_p99_ratio=args.latency_p99_ratio,
        max_concurrency=args.max_concurrency,
        defects=parse_defects(args.defects),
        retry_after_s=args.retry_after,
        stall_s=args.stall_seconds,
        fence_rate=args.fence_rate,
        seed=args.seed,
        request_log=args.request_log,
        fail_after=args.fail_after,
        sim_drop_change=args.sim_drop_change,
        wrong_observation=args.wrong_observation,
        repeat=args.repeat,
        batch_delay_s=args.batch_delay,
        batch_error_rate=args.batch_error_rate,
        batch_fail_first=args.batch_fail_first,
        batch_expire_first=args.batch_expire_first,
        anthropic_overloaded=args.anthropic_overloaded,
        gemini_cache_min_tokens=args.gemini_cache_min_tokens,
        rate_rpm=args.rpm,
        rate_tpm=args.tpm,
        rate_window_s=args.rate_window,
    )


async def serve(config: DevServerConfig) -> None:
    """Serve until a signal arrives or the server dies."""
    server = await start_server(config)
    print(f"factory devserver listening on {server.url}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    stopped = loop.create_task(stop.wait())
    dead = loop.create_task(server.wait_dead())
    await asyncio.wait({stopped, dead}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    await server.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        asyncio.run(serve(config))
    except OSError as exc:
        print(f"error: cannot listen on 127.0.0.1:{config.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_INTERNAL
    return 0


if __name__ == "__main__":
    sys.exit(main())
