"""``python -m factory.run RECIPE``: the one command that runs a recipe.

Parses arguments and calls one library function. Expected errors become a
one-line message and a documented exit code (docs/cli.md, "Exit codes"):
0 done, 1 internal error, 2 config error, 3 input error, 4 stopped by a budget
cap, 5 stopped before the target (or not started: a confirmation declined), 6 output
folder in use, 7 a write failed, 8 no LLM endpoint answers, 130 interrupted (Ctrl-C,
SIGTERM: one line says how to resume). Under pytest unexpected errors re-raise so tests
see the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from factory.engine import interrupts
from factory.engine.console import expected_error, process_start_time, setup_logging
from factory.envs.pack import check_reviewed
from factory.errors import (
    EXIT_INCOMPLETE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    ConfigError,
    FactoryError,
)
from factory.recipe import load_recipe, resolve_recipe_path
from factory.secrets import redact

__all__ = ["main"]


def _parser(prog: str = "python -m factory.run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
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
        "--show-prompts",
        action="store_true",
        help="with --dry-run: print one rendered prompt per LLM stage before the cost table",
    )
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="start without asking, whatever the estimated cost (a terminal asks above "
        "amplify.confirm_above_usd)",
    )
    p.add_argument(
        "--confirm-above",
        type=float,
        metavar="USD",
        help="ask on a terminal before a run whose estimated cost left to pay exceeds USD "
        "(default: the recipe's amplify.confirm_above_usd, 25)",
    )
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
        help="start over in the output folder (by default a run there is resumed); "
        "the response cache is kept, so answers already paid for are reused",
    )
    p.add_argument(
        "--drop-cache",
        action="store_true",
        help="with --fresh: delete the folder's response cache too (its calls are paid again)",
    )
    p.add_argument(
        "--other-cache",
        action="store_true",
        help="resume with another response cache than the one the folder was started with "
        "(its answers are not reused: calls already paid for are paid again)",
    )
    p.add_argument(
        "--allow-unreviewed",
        action="store_true",
        help="run although the pack still holds the x-review marks of `factory domain init` "
        "(a run refuses them by default)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="on a finished output folder: issue the calls that failed again",
    )
    return p


def main(argv: list[str] | None = None, *, prog: str = "python -m factory.run") -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(prog).parse_args(argv)
    handlers = interrupts.install()
    typed = interrupts.invocation(prog, sys.orig_argv, sys.argv[0] if sys.argv else "")
    interrupts.set_resume_hint(interrupts.resume_command(argv, typed))
    setup_logging()  # console: factory messages at WARNING; OUT/logs/run.log: all at INFO
    server = None
    try:
        if args.drop_cache and not args.fresh:
            raise ConfigError("--drop-cache deletes the response cache and goes with --fresh")
        overrides = list(args.overrides)
        if args.devserver is not None and not args.dry_run:
            server = _start_devserver(args.devserver)
            # The dev model's price first, so a --set prices... of the user wins.
            overrides = [DEVSERVER_PRICE, *overrides, *devserver_overrides(server.url)]
        cfg = load_recipe(resolve_recipe_path(args.recipe), overrides)
        if not args.dry_run and not args.allow_unreviewed:
            check_reviewed(cfg.domains(), cfg.source)  # before a folder, Ray or a paid call
        if args.dry_run:
            from factory.engine.plan import make_plan
            from factory.envs.pack import unreviewed

            for file in unreviewed(cfg.domains(), cfg.source):
                print(f"note: {file} still holds x-review marks: a run refuses it", file=sys.stderr)

            from factory.preflight import measured

            folder = Path(args.output or cfg.output.dir).resolve()
            plan = make_plan(
                cfg,
                with_examples=args.show_prompts and not args.json,
                measured=measured(folder, cfg),
            )
            text = plan.render(show_prompts=args.show_prompts)
            print(json.dumps(plan.to_dict(), indent=2) if args.json else text)
            return 0
        from factory.io.objectstore import output_location

        out_dir = output_location(args.output or cfg.output.dir)  # a folder, or s3://...
        if not _preflight(cfg, out_dir, args, devserver=server is not None):
            return EXIT_INCOMPLETE
        from factory.engine.runner import run

        result = run(
            cfg,
            out_dir,
            progress=not args.no_progress,
            fresh=args.fresh,
            retry_failed=args.retry_failed,
            drop_cache=args.drop_cache,
            other_cache=args.other_cache,
            started=(process_start_time(), "process start"),
        )
        print(result.summary())
        if result.error:
            _print_error(result.error, result.exit_code)
        return result.exit_code
    except KeyboardInterrupt as exc:
        # the signal our handler saw first: Ray's C++ wait may re-raise a bare interrupt
        return _interrupted(interrupts.received() or interrupts.signal_name(exc), argv, typed)
    except FactoryError as exc:
        if interrupts.received():  # Ray torn down under us by the same Ctrl-C
            return _interrupted(interrupts.received() or "SIGINT", argv, typed)
        return _print_error(str(exc), exc.exit_code, exc.details)
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        sys.stderr.close()
        return 0
    except Exception as exc:
        if interrupts.received():
            return _interrupted(interrupts.received() or "SIGINT", argv, typed)
        expected = expected_error(exc)  # raised in a Ray task or actor: its one line
        if expected is not None:
            return _print_error(*expected)
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


def _preflight(cfg: Any, out_dir: Path | str, args: argparse.Namespace, *, devserver: bool) -> bool:
    """Before Ray: keys and endpoints checked, the plan printed, and on a terminal a costly
    run confirmed (``factory.preflight``). False: the person declined; nothing started.

    Raises:
        ConfigError: an endpoint's key variable is unset.
        UnreachableError: no endpoint answers a connect.
    """
    from factory import preflight

    preflight.check_keys(cfg)
    for line in preflight.check_endpoints(cfg):
        print(f"warning: {line}", file=sys.stderr)
    if not cfg.calls_llm:
        print(f"plan: {cfg.pipeline}: no LLM call, nothing is paid", flush=True)
        return True
    prior = preflight.prior_run(
        out_dir, cfg, fresh=args.fresh, drop_cache=args.drop_cache, retry_failed=args.retry_failed
    )
    if prior.finished:
        return True  # the run says "already complete" and calls nothing
    from factory.engine.plan import make_plan

    plan = make_plan(cfg, with_examples=False, measured=preflight.measured(out_dir, cfg))
    batch = plan.costing is not None and plan.costing.batched  # a batch API's prices
    est = preflight.estimate(plan.stages, batch=batch)
    left = preflight.left_to_pay(plan.stages, prior, batch=batch)
    lines = preflight.plan_lines(est, cfg, prior, devserver=devserver, left=left, out_dir=out_dir)
    # stdout: what `ray job submit` keeps in the job's log
    print(plan.render(), *lines, sep="\n")
    threshold = cfg.amplify.confirm_above_usd if args.confirm_above is None else args.confirm_above
    cost = left[1]
    ask = preflight.needs_confirmation(
        cost, threshold, interactive=sys.stdin.isatty(), yes=args.yes, paid=not devserver
    )
    if not ask:
        if cost is not None and threshold is not None and cost > threshold and not args.yes:
            print(
                f"no terminal to ask: starting (the estimate exceeds {threshold:,.2f} USD; "
                "the caps above bound the spend)",
                flush=True,
            )
        return True
    assert cost is not None  # asked only about a known cost
    try:
        answer = input(preflight.question(cost, prior))
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("not started: nothing was called or written (--yes starts without asking)")
    return False


def _interrupted(signame: str, argv: list[str], typed: list[str]) -> int:
    """The one line an interrupted run prints; the folder stays resumable (run.json
    keeps status "running", the cache holds every stored response).

    An interrupt after the run's data was complete (``interrupts.completed``: run.json
    says ``done``) cut only what follows it (the report, Ray's shutdown): the run is
    reported as done, exit 0, with what to run for the report."""
    done = interrupts.completed()
    if done is not None:
        print(
            f"{signame} after the run was complete: {done} holds the finished dataset "
            f"(run.json: done); the run report may be missing: `factory report {done}` "
            "writes it",
            file=sys.stderr,
            flush=True,
        )
        return 0
    print(
        f"interrupted by {signame}: the output folder is resumable; to continue, run the "
        f"same command: {interrupts.resume_command(argv, typed)}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_INTERRUPTED


# The development model's price: gpt-5's list price (factory.llm.pricing), so a recipe's
# max_cost_usd cap works offline as it would against the real model (a cap over an
# unpriced model is refused).
DEVSERVER_PRICE = (
    "prices.factory-dev={input_per_mtok: 1.25, cached_input_per_mtok: 0.125, "
    "output_per_mtok: 10.0, batch_share: 0.5}"
)


def _print_error(message: str, code: int, details: tuple[str, ...] | list[str] = ()) -> int:
    """``error: message`` on one line (YAML and jsonschema messages carry line breaks of
    their own), then the error's detail lines, each one line, indented."""
    print(f"error: {' '.join(redact(message).splitlines())}", file=sys.stderr)
    for line in details:
        print(f"  {' '.join(redact(line).splitlines())}", file=sys.stderr)
    return code


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
    if code == EXIT_INTERRUPTED or interrupts.received():
        # Skip Ray's at-exit teardown: after a Ctrl-C its head processes may already be
        # gone and the teardown then waits on them or aborts (exit 134). The head is
        # fate-shared with this process and the workers watch it (factory.engine.watchdog).
        sys.stdout.flush()
        os._exit(code)
    raise SystemExit(code)
