"""``factory``: the one command line (``factory run | inspect | report | ...``).

Why a dispatcher and not one parser: ``run``, ``evaluate``, ``fidelity``,
``devserver`` and ``bench`` keep their own ``python -m`` entry points and their
own arguments; ``factory CMD ARGS`` hands ``ARGS`` to the same ``main`` the
module runs, so both spellings are one command. ``inspect``, ``report`` and
``push`` are new and parsed here; each calls one library function
(``factory.io.report``). Expected errors are one line and a documented exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from factory.errors import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_WRITE, FactoryError
from factory.secrets import redact

__all__ = ["COMMANDS", "build_parser", "entry", "main"]

# name -> (one line of help, the module whose ``main(argv)`` runs it, or None: parsed here)
COMMANDS: dict[str, tuple[str, str | None]] = {
    "run": ("run a recipe (python -m factory.run)", "factory.run"),
    "inspect": ("show rows of an output folder as conversations", None),
    "report": ("write OUT/report.html and the dataset card OUT/README.md", None),
    "push": ("upload an output folder to the Hugging Face Hub as a dataset", None),
    "evaluate": ("score a simulator model on step samples (python -m factory.evaluate)",
                 "factory.evaluate"),
    "fidelity": ("replay recorded trajectories in a domain's world (python -m factory.fidelity)",
                 "factory.envsim.fidelity"),
    "devserver": ("the development LLM server (python -m factory.devserver)",
                  "factory.devserver.__main__"),
    "bench": ("benchmarks: amplify, storm (python -m factory.bench)", "factory.bench.__main__"),
    "domain": ("domain tools (python -m factory.domain, when installed)", "factory.domain"),
}  # fmt: skip


def _formatter(prog: str) -> argparse.HelpFormatter:
    # A fixed width: the help is the same in every terminal, so docs/cli.md can quote it.
    return argparse.RawDescriptionHelpFormatter(prog, width=100)


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS)) + 2
    table = "\n".join(f"  {name:<{width}}{summary}" for name, (summary, _) in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog="factory",
        description="A Ray-distributed synthetic data factory for tool-using LLM agents.\n\n"
        f"commands:\n{table}",
        epilog="`factory COMMAND --help` shows a command's options.",
        formatter_class=_formatter,
    )
    sub = p.add_subparsers(
        dest="command", metavar="COMMAND", required=True, help="one of the commands above"
    )
    for name, (_, module) in COMMANDS.items():
        if module is not None:  # dispatched before parsing (main); listed in the description
            sub.add_parser(name, add_help=False)
    insp = sub.add_parser(
        "inspect", formatter_class=_formatter,
        description="Show rows of an output folder as conversations (accepted rows by "
        "default; --rejects REASON shows rejected and failed rows).",
    )  # fmt: skip
    insp.add_argument("out", metavar="OUT", help="a run's output folder (or s3:// URI)")
    insp.add_argument("--n", type=int, default=5, help="rows to show (default 5)")
    insp.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE",
        help="only rows whose meta (or meta.labels) KEY equals VALUE, e.g. outcome=refused; "
        "repeatable",
    )  # fmt: skip
    insp.add_argument(
        "--rejects", metavar="REASON", help="show rejected/failed rows of this reason (all: any)"
    )
    rep = sub.add_parser(
        "report", formatter_class=_formatter,
        description="Write the run report (OUT/report.html, one self-contained file), the "
        "LLaMA-Factory training config (OUT/llamafactory/sft.yaml) and the Hugging Face "
        "dataset card (OUT/README.md); a run writes them when it ends.",
    )  # fmt: skip
    rep.add_argument("out", metavar="OUT", help="a run's output folder (or s3:// URI)")
    rep.add_argument(
        "--license",
        help="the card's license id, kept for later cards of this folder (default: the one "
        "given before, else other)",
    )
    push = sub.add_parser(
        "push", formatter_class=_formatter,
        description="Upload the card, report, manifest and data/ of OUT to the dataset "
        "repository REPO_ID (token: HF_TOKEN or `hf auth login`). The folder and the token "
        "are checked before anything is sent; a Hub or network failure is one line and "
        "exit code 8.",
    )  # fmt: skip
    push.add_argument("out", metavar="OUT", help="a finished run's output folder (or s3:// URI)")
    push.add_argument("repo_id", metavar="REPO_ID", help="OWNER/NAME on the Hub")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--license", help="rewrite the card with this license id first")
    return p


def _delegate(name: str, argv: list[str]) -> int:
    module_name = COMMANDS[name][1]
    assert module_name is not None
    if importlib.util.find_spec(module_name) is None:
        print(
            f"error: `factory {name}` is not available in this install ({module_name} is "
            "missing); update factory",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    module = importlib.import_module(module_name)
    run: Callable[..., Any] | None = getattr(module, "main", None)
    if run is None:  # a module run only as a script: run it as `python -m` would
        import runpy

        saved = sys.argv
        sys.argv = [f"factory {name}", *argv]
        try:
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved
        return 0
    # A module whose main takes ``prog`` names itself as called: `factory domain --help`
    # says `factory domain`, not `python -m factory.domain`.
    takes_prog = "prog" in inspect.signature(run).parameters
    code = run(argv, prog=f"factory {name}") if takes_prog else run(argv)
    return int(code or 0)


@contextlib.contextmanager
def _folder(out: str, *, write_back: bool = False) -> Iterator[str]:
    """``OUT`` as a local folder: itself, or a copy of an ``s3://`` output
    (``factory.io.mirror.reading_remote``; ``write_back`` uploads what the command wrote)."""
    from factory.io.objectstore import is_uri, output_location

    if not is_uri(out):
        yield out
        return
    from factory.io.mirror import reading_remote

    uri = output_location(out)
    assert isinstance(uri, str)
    with reading_remote(uri, write_back=write_back) as local:
        yield str(local)


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from factory.io.report.folder import OutputFolder, parse_where
    from factory.io.report.terminal import inspect_folder

    where = parse_where(args.where)
    with _folder(args.out) as out:
        folder = OutputFolder(out)
        damage = folder.damage()  # named, then read around: the other files' rows are shown
        for problem in damage:
            print(f"warning: {' '.join(str(problem).splitlines())}", file=sys.stderr)
        folder.skip(damage)
        inspect_folder(folder, Console(), n=args.n, where=where, rejects=args.rejects)
    return EXIT_WRITE if damage else 0


def _report(args: argparse.Namespace) -> int:
    from factory.io.report import write_documents
    from factory.io.report.folder import OutputFolder

    with _folder(args.out, write_back=True) as out:
        OutputFolder(out).check()  # a report of the rows a damaged file still yields: no
        for path in write_documents(out, license_id=args.license):
            print(path.replace(out, args.out.rstrip("/"), 1))
    return 0


def _push(args: argparse.Namespace) -> int:
    from factory.io.report.hub import push, push_warnings

    with _folder(args.out) as out:
        for line in push_warnings(out, args.license):
            print(f"warning: {line}", file=sys.stderr)
        commit = push(out, args.repo_id, private=args.private, license_id=args.license)
    print(f"pushed {args.out} to https://huggingface.co/datasets/{args.repo_id}: {commit}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS and COMMANDS[argv[0]][1] is not None:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    handler = {"inspect": _inspect, "report": _report, "push": _push}[args.command]
    try:
        return handler(args)
    except FactoryError as exc:
        print(f"error: {' '.join(redact(str(exc)).splitlines())}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # piped into `head`
        sys.stderr.close()
        return 0


def entry() -> None:
    """The ``factory`` console script."""
    code = main()
    from factory.engine import interrupts

    # as `python -m factory.run`: after a signal, skip Ray's at-exit teardown
    if code == EXIT_INTERRUPTED or interrupts.received():
        sys.stdout.flush()
        os._exit(code)
    raise SystemExit(code)
