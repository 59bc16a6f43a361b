"""The ``python -m factory.bench`` command line: one sub-command per benchmark."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from factory.bench import STORM_DEFECTS, bench_amplify, bench_storm, default_recipe
from factory.bench.postprocess import bench_postprocess
from factory.errors import ConfigError
from factory.recipe import resolve_recipe_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m factory.bench")
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("amplify", help="seeds -> devserver -> accepted trajectories")
    a.add_argument("--seeds", type=int, default=1500)
    a.add_argument("--target", type=int, default=90000)
    a.add_argument("--latency-ms", type=float, default=200.0, help="fixed latency, or median")
    a.add_argument(
        "--latency",
        choices=("fixed", "lognormal", "both"),
        default="fixed",
        help="latency distribution; both: a fixed and a heavy-tailed run, one report each",
    )
    a.add_argument("--latency-p99-ratio", type=float, default=10.0, help="lognormal: p99 / median")
    a.add_argument("--concurrency", type=int, default=64)
    a.add_argument(
        "--client-concurrency",
        type=int,
        default=None,
        help="requests the factory keeps open (default 1.25 x --concurrency)",
    )
    a.add_argument("--actors", type=int, default=2)
    a.add_argument("--batch-size", type=int, default=16)
    a.add_argument("--quiet", action="store_true")
    a.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a recipe value (YAML-parsed, as factory run's --set; applied before the "
        "benchmark's own), e.g. --set 'near_duplicates={threshold: 0.9}'; repeatable",
    )
    st = sub.add_parser("storm", help="fault storm vs clean run: wall-time ratio")
    pp = sub.add_parser("postprocess", help="parse + repair + validate + export per row")
    no = sub.add_parser("nodes", help="a 3-node Ray cluster that loses a node: wall ratio")
    no.add_argument("--target", type=int, default=600)
    no.add_argument("--latency-ms", type=float, default=300.0, help="median (lognormal)")
    no.add_argument("--seed", type=int, default=7)
    no.add_argument("--trials", type=int, default=0, help="runs killed at random points")
    no.add_argument(
        "--at-end", action="store_true", help="trials: kill while the run stops and writes"
    )
    no.add_argument(
        "--add-node-after",
        type=float,
        default=None,
        metavar="S",
        help="add a node S seconds after the kill (the lost worker comes back there)",
    )
    nd = sub.add_parser("neardup", help="near-duplicate signing and index: rows/s, peak RSS")
    nd.add_argument("--rows", type=int, default=90000, help="rows for rensa (the one used)")
    nd.add_argument("--datasketch-rows", type=int, default=9000, help="0: skip datasketch")
    nd.add_argument("--planted", type=float, default=0.1, help="share of planted near-copies")
    for command in (a, st, pp, no):
        command.add_argument(
            "--recipe",
            default=None,
            help="amplification recipe, a path or a name under pipelines/ (default: the one "
            "amplify recipe in pipelines/, today airline.yaml); its seeds seed the benchmark",
        )
    st.add_argument("--seeds", type=int, default=100)
    st.add_argument("--target", type=int, default=1400, help="with 100 seeds: ~1,500 calls")
    st.add_argument("--latency-ms", type=float, default=200.0)
    st.add_argument("--concurrency", type=int, default=64)
    st.add_argument("--actors", type=int, default=2)
    st.add_argument("--defects", default=STORM_DEFECTS)
    st.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="cap on each run; a capped run reports how many calls the server completed",
    )
    st.add_argument(
        "--request-log",
        metavar="DIR",
        help="keep each run's devserver request log (clean.jsonl, storm.jsonl) in DIR",
    )
    se = sub.add_parser("simenv", help="environment server steps/s vs the LLM's limit C/L")
    # The domain and its data are named on the command line (the engine names no domain),
    # e.g. --domain airline --tasks ../shared/data/taubench-airline/gpt-4o-airline.json
    # --db ../shared/data/taubench-airline (BENCHMARKS.md).
    se.add_argument("--domain", required=True, help="a registered domain with an executor")
    se.add_argument("--tasks", required=True, help="tau-bench-style task file")
    se.add_argument("--db", required=True, help="the domain's database folder")
    se.add_argument("--mode", default="hybrid", choices=("executor", "hybrid", "llm"))
    se.add_argument("--episodes", type=int, default=64, help="episodes in flight")
    se.add_argument("--duration", type=float, default=60.0, help="seconds of episodes")
    se.add_argument("--latency-ms", type=float, default=200.0, help="fixed; lognormal: median")
    se.add_argument("--latency", default="fixed", choices=("fixed", "lognormal"))
    se.add_argument("--latency-p99-ratio", type=float, default=10.0, help="lognormal: p99 / median")
    se.add_argument("--concurrency", type=int, default=64, help="devserver slots C")
    se.add_argument("--port", type=int, default=8765)
    se.set_defaults(recipe=None)
    pp.add_argument("--rows", type=int, default=4000)
    pp.add_argument("--repeat", type=int, default=3, help="passes; the best one counts")
    pp.add_argument("--rounds", type=int, default=2, help="old/new alternations; best counts")
    pp.add_argument("--procs", type=int, default=1, help="worker processes at once (cores)")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--defect-rate", type=float, default=0.0)
    pp.add_argument("--baseline", help="a checkout of older code to time on the same rows")
    args = p.parse_args(argv)
    if args.what == "neardup":  # synthetic rows: no recipe, no Ray
        from factory.bench.neardup import bench_neardup

        print(json.dumps(bench_neardup(args), indent=2))
        return 0
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        args.recipe = resolve_recipe_path(args.recipe) if args.recipe else default_recipe()
        report = _run(args)
    except ConfigError as exc:  # a bad recipe, --recipe or --set: named, nothing started
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report, indent=2))
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark ``args.what`` names, as its JSON report."""
    report: dict[str, Any]
    if args.what == "nodes":
        from factory.bench.nodes import bench_nodes

        args.recipe = str(args.recipe)
        report = bench_nodes(args)
    elif args.what == "simenv":
        from factory.bench.simenv import bench_simenv

        report = bench_simenv(args)
    elif args.what == "postprocess":
        report = bench_postprocess(args)
    elif args.what == "storm":
        report = bench_storm(args)
    elif args.latency == "both":
        fixed = bench_amplify(args, "fixed")
        heavy = bench_amplify(args, "lognormal")
        report = {
            "fixed": fixed,
            "lognormal": heavy,
            "ratio_to_limit": {
                "fixed": fixed["ratio_to_limit"],
                "lognormal": heavy["ratio_to_limit"],
            },
            "amplify_ratio_to_limit": {
                "fixed": fixed["amplify_ratio_to_limit"],
                "lognormal": heavy["amplify_ratio_to_limit"],
            },
        }
    else:
        report = bench_amplify(args, args.latency)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
