"""``python -m factory.simenv serve``: an OpenEnv server of simulated episodes.

Example (offline, the development server plays the LLM roles)::

    python -m factory.simenv serve --domain airline --mode hybrid --devserver \\
        --tasks ../shared/data/taubench-airline/gpt-4o-airline.json \\
        --db ../shared/data/taubench-airline --cache out/simenv-cache --port 8000

Tasks for any domain, derived from its seed trajectories by the LLM (cached), with
the LLM playing the tools too::

    python -m factory.simenv serve --domain retail --mode llm --devserver \\
        --seeds seeds/retail/seeds.jsonl --cache out/simenv-cache --port 8000

With a real model: ``--base-url https://api.openai.com/v1 --model gpt-5
--api-key-env OPENAI_API_KEY`` instead of ``--devserver``. Expected errors print one
line and exit with the factory's documented codes (2: configuration).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from factory.errors import EXIT_CONFIG, FactoryError
from factory.simenv.spec import MODES
from factory.simenv.tasks import DerivedTasks

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m factory.simenv", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve episodes over OpenEnv's HTTP and WebSocket API")
    s.add_argument("--domain", required=True, help="a domain plug-in (factory.domains)")
    s.add_argument("--mode", choices=MODES, default="hybrid")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument("--tasks", help="tau-bench-style task file (JSON list)")
    source.add_argument(
        "--seeds", help="derive tasks from seed trajectories (a file, folder or glob)"
    )
    world = s.add_mutually_exclusive_group()
    world.add_argument("--db", help="the domain's database folder (tau-bench layout)")
    world.add_argument("--world-seed", type=int, help="a generated world instead of --db")
    llm = s.add_mutually_exclusive_group()
    llm.add_argument("--base-url", help="OpenAI-compatible endpoint of the role LLM")
    llm.add_argument("--devserver", action="store_true", help="start the development server")
    s.add_argument("--model", default="factory-dev")
    s.add_argument("--api-key-env", help="environment variable holding the endpoint's key")
    s.add_argument("--cache", help="response cache folder (replays cost nothing)")
    s.add_argument("--rollouts", help="write every finished episode here (sharegpt shards)")
    s.add_argument("--no-judge", action="store_true", help="skip the LLM judge")
    s.add_argument("--reward", choices=("auto", "executor", "judge"), default="auto")
    s.add_argument("--simulate-tools", default="", help="hybrid: tools the LLM answers (a,b)")
    s.add_argument("--max-steps", type=int, default=60)
    s.add_argument("--max-sessions", type=int, default=256, help="concurrent WebSocket sessions")
    s.add_argument("--concurrency", type=int, default=256, help="LLM requests in flight")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    return p


def serve(args: argparse.Namespace) -> None:
    """Build the runtime and serve it until SIGINT or SIGTERM.

    ``--port 0`` binds a free port; the line on stderr names the URL either way.
    """
    from factory.simenv.runtime import EnvSettings, Runtime
    from factory.simenv.server import ThreadedServer, build_app

    dev = None
    base_url = args.base_url
    if args.devserver:
        from factory.devserver import DevServer

        dev = DevServer().start()
        base_url = dev.url
    try:
        settings = EnvSettings(
            mode=args.mode,
            judge=not args.no_judge,
            reward=args.reward,
            simulate_tools=frozenset(t for t in args.simulate_tools.split(",") if t),
            max_steps=args.max_steps,
        )
        runtime = Runtime.create(
            args.domain,
            tasks=args.tasks,
            seeds=args.seeds,
            db=args.db,
            world_seed=args.world_seed,
            base_url=base_url,
            model=args.model,
            api_key_env=args.api_key_env,
            cache_dir=args.cache,
            settings=settings,
            concurrency=args.concurrency,
            rollouts=args.rollouts,
        )
        runtime.new_env()  # refuse a mode the domain cannot serve before binding the port
        if runtime.derived is not None:
            _report_derived(runtime.derived, args.seeds)
        app = build_app(runtime, max_sessions=args.max_sessions)
        server = ThreadedServer(app, host=args.host, port=args.port).start()
        try:
            print(
                f"serving {args.domain} ({args.mode}) on {server.url} (WebSocket /ws); "
                f"{len(runtime.spec.tasks)} tasks; LLM {base_url or 'none'}",
                file=sys.stderr,
                flush=True,
            )
            _wait_for_stop()
        finally:
            server.stop()  # the app's shutdown flushes the cache and the rollout shards
    finally:
        if dev is not None:
            dev.stop()


def _wait_for_stop() -> None:
    """Block until SIGINT or SIGTERM (a trainer's or Ray's way to end the server)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def _report_derived(derived: DerivedTasks, seeds: str) -> None:
    """Say on stderr what the seeds gave, naming every seed that gave no task."""
    print(
        f"derived {len(derived.tasks)} tasks from {seeds}; "
        f"{len(derived.rejected)} records rejected, {len(derived.failed)} derivations failed",
        file=sys.stderr,
    )
    for where, why in derived.rejected:
        print(f"  rejected {where}: {why}", file=sys.stderr)
    for seed_id, why in derived.failed:
        print(f"  failed {seed_id}: {why}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        serve(args)
    except FactoryError as exc:
        if os.environ.get("FACTORY_RAISE"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_CONFIG) or EXIT_CONFIG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
