"""``python -m factory.domain init NAME --from-seeds FILE``: scaffold a data-only domain pack.

The command reads the seed file (any format ``factory.io.readers`` knows), asks
``factory.envs.scaffold`` for the pack's files, writes them under ``--root``
(default: the current folder) and prints what to review. Every guess and stub carries
an ``x-review`` mark, and a run refuses the pack until a person has deleted them all
(``--allow-unreviewed`` runs it as it is). It never overwrites a file unless ``--force``
is given.

Exit codes: 0 written, 2 a bad name or a file that exists, 3 no usable seed
(no record with a tools column).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from factory import packs
from factory.errors import EXIT_INPUT, ConfigError, FactoryError

__all__ = ["init_domain", "main"]


def _records(path: Path) -> Iterator[Any]:
    from factory.io.readers import iter_records

    for item in iter_records(path):
        if item.error is None:
            yield item.record


def init_domain(name: str, seeds: Path, root: Path, *, force: bool = False) -> Any:
    """Write the pack of domain ``name`` scaffolded from ``seeds`` under ``root``.

    Returns:
        The :class:`factory.envs.scaffold.Scaffold` (files written, review list).

    Raises:
        ConfigError: a bad name, a missing seed file, or a file that exists
            (without ``force``); ``exit_code`` 3 when no record has tools.
    """
    from factory.envs.scaffold import scaffold

    if not seeds.is_file():
        raise ConfigError(f"seed file {seeds} not found", key_path="--from-seeds")
    pipelines = (root / "pipelines").resolve()
    seeds_path = os.path.relpath(seeds.resolve(), pipelines)
    # the factory's own templates, wherever it is installed (factory.packs)
    templates = f"{packs.SCHEME}prompts"
    try:
        result = scaffold(name, _records(seeds), seeds_path=seeds_path, templates=templates)
    except ConfigError as exc:
        if exc.key_path == "--from-seeds":
            exc.exit_code = EXIT_INPUT
        raise
    existing = [rel for rel in result.files if (root / rel).exists()]
    if existing and not force:
        raise ConfigError(
            f"{', '.join(existing)} exist(s) under {root}; give --force to overwrite",
            key_path="NAME",
        )
    for rel, text in result.files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return result


def build_parser(prog: str = "python -m factory.domain") -> argparse.ArgumentParser:
    """The command's parser; ``prog`` is how it was called (``factory domain`` from the
    ``factory`` command), so usage and help name the command the user typed."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Domain tools: `init NAME --from-seeds FILE` scaffolds a "
        "data-only domain pack from seed trajectories.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="scaffold a data-only domain pack from seed trajectories")
    init.add_argument("name", help="the domain's name (lower case, digits, underscores)")
    init.add_argument("--from-seeds", required=True, help="seed file with a tools column")
    init.add_argument("--root", default=".", help="project folder to write into (default: .)")
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    return p


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m factory.domain") -> int:
    args = build_parser(prog).parse_args(argv)
    root = Path(args.root)
    try:
        result = init_domain(args.name, Path(args.from_seeds), root, force=args.force)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"domain {args.name}: {len(result.tools)} tools from {result.seeds} seed records")
    for rel in result.files:
        print(f"  wrote {root / rel}")
    print("review before a large run:")
    for line in result.review:
        print(f"  - {line}")
    run = "factory run" if prog.startswith("factory ") else "python -m factory.run"
    print(
        "a run refuses the pack while a file holds an x-review mark; once reviewed, try it "
        f"offline: {run} {root / 'pipelines' / (args.name + '.yaml')} "
        "--devserver --set amplify.target=50"
    )
    return 0
