"""``python -m factory.run RECIPE``: the one command that runs a recipe.

Parses arguments and calls one library function. Expected errors become a
one-line message and a documented exit code (README, "Exit codes"):
0 done, 1 internal error, 2 config error, 3 input error, 4 stopped by a budget
cap, 130 interrupted (Ctrl-C, SIGTERM: one line says how to resume). Under
pytest unexpected errors re-raise so tests see the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from factory import interrupts
from factory.config import load_recipe, resolve_recipe_path
from factory.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, FactoryError
from factory.secrets import install_log_redaction, redact

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m factory.run",
        description="Run a factory recipe (pipelines/*.yaml).",
    )
    p.add_argument("recipe", help="recipe file, or a name under pipelines/ (airline.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a recipe value (YAML-parsed); repeatable",
    )
    p.add_argument("--output", "-o", help="output folder (overrides output.dir)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="read and check seeds, print the plan (calls, tokens, cost); call nothing",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument(
        "--devserver",
        nargs="?",
        const="",
        metavar="DEFECTS",
        help="run offline: start the development LLM server on 127.0.0.1 and send every "
        "LLM call there (optional defects, e.g. malformed_json=0.05,rate_limit=0.1)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over in the output folder (by default a run there is resumed)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="on a finished output folder: issue the calls that failed again",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    handlers = interrupts.install()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    server = None
    try:
        overrides = list(args.overrides)
        if args.devserver is not None and not args.dry_run:
            server = _start_devserver(args.devserver)
            overrides += devserver_overrides(server.url)
        cfg = load_recipe(resolve_recipe_path(args.recipe), overrides)
        if args.dry_run:
            from factory.plan import make_plan

            plan = make_plan(cfg, with_examples=not args.json)
            print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.render())
            return 0
        from factory.runner import run

        out_dir = Path(args.output or cfg.output.dir).resolve()
        result = run(
            cfg,
            out_dir,
            progress=not args.no_progress,
            fresh=args.fresh,
            retry_failed=args.retry_failed,
        )
        print(result.summary())
        return result.exit_code
    except KeyboardInterrupt as exc:
        return _interrupted(interrupts.signal_name(exc), argv)
    except FactoryError as exc:
        if interrupts.received():  # Ray torn down under us by the same Ctrl-C
            return _interrupted(interrupts.received() or "SIGINT", argv)
        # One line, always: YAML and jsonschema messages carry line breaks of their own.
        print(f"error: {' '.join(redact(str(exc)).splitlines())}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        sys.stderr.close()
        return 0
    except Exception as exc:
        if interrupts.received():
            return _interrupted(interrupts.received() or "SIGINT", argv)
        if os.environ.get("PYTEST_CURRENT_TEST") or os.environ.get("FACTORY_DEBUG"):
            raise
        print(
            f"internal error: {type(exc).__name__}: {redact(str(exc))[:500]} "
            "(set FACTORY_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    finally:
        if server is not None:
            server.stop()
        interrupts.restore(handlers)


def _interrupted(signame: str, argv: list[str]) -> int:
    """The one line an interrupted run prints; the folder stays resumable (run.json
    keeps status "running", the cache holds every stored response)."""
    print(
        f"interrupted by {signame}: the output folder is resumable; to continue, run the "
        f"same command: {interrupts.resume_command(argv)}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_INTERRUPTED


def devserver_overrides(url: str) -> list[str]:
    """Recipe overrides that send every LLM call of a recipe to a development server."""
    return [
        f'llm.endpoints=[{{"base_url": "{url}"}}]',
        "llm.model=factory-dev",
        "prefilter.model=factory-dev",
    ]


def _start_devserver(defects: str) -> Any:
    from factory.devserver import DevServer, DevServerConfig, parse_defects

    server = DevServer(DevServerConfig(defects=parse_defects(defects) if defects else {})).start()
    print(f"factory devserver on {server.url}", file=sys.stderr)
    return server


if __name__ == "__main__":
    code = main()
    if code == EXIT_INTERRUPTED:
        # Skip Ray's at-exit teardown: after a Ctrl-C its head processes may already be
        # gone and the teardown then waits on them or aborts (exit 134). The head is
        # fate-shared with this process and the workers watch it (factory.watchdog).
        sys.stdout.flush()
        os._exit(code)
    raise SystemExit(code)
