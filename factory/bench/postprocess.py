"""``python -m factory.bench postprocess``: post-processing of one completion (parse,
repair, validate, labels, export), timed for this code and an older checkout in the same
run on the same completions.

The worker harness (``_postprocess_worker``) is loaded by file path into a process whose
``factory`` is the tree being timed, so this module imports only the standard library at
its top: an older checkout has none of the helpers below.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_postprocess", "postprocess_completions"]

POSTPROCESS_DEFECTS = ("malformed_json", "unknown_tool", "wrong_arg_type", "missing_observation")


def postprocess_completions(
    n: int, *, recipe: Path, seed: int = 0, defect_rate: float = 0.0
) -> list[str]:
    """``n`` completions as the devserver answers amplification prompts for the recipe's
    seeds.

    The devserver's own functions (renamed variants of each seed, 20% in a code
    fence); ``defect_rate`` gives that share one of ``POSTPROCESS_DEFECTS`` (broken
    JSON goes through json-repair, the others are rejected by validation).
    """
    from factory.bench import recipe_seed_files
    from factory.core.formats import parse_record
    from factory.core.formats.completion import render_output
    from factory.devserver.simulate import (
        amplify,
        break_json,
        compile_reference,
        inject_defect,
        render_json,
    )

    lines = [
        line
        for path in recipe_seed_files(recipe)
        for line in Path(path).read_text().splitlines()
        if line.strip()
    ]
    refs = [
        compile_reference(render_output(parse_record(json.loads(line), source=f"seed:{i}")))
        for i, line in enumerate(lines)
    ]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        answer = amplify(refs[i % len(refs)], rng)
        defect = rng.choice(POSTPROCESS_DEFECTS) if rng.random() < defect_rate else None
        if defect not in (None, "malformed_json"):
            inject_defect(answer, defect, rng, avoid="")
        text = render_json(answer, rng, 0.2)
        if defect == "malformed_json":
            text, _ = break_json(text, rng)
        out.append(text)
    return out


def _postprocess_worker(path: str, repeat: int, recipe: str) -> dict[str, Any]:
    """Time ``PostprocessStage.process`` over the completions in ``path`` (one per line).

    Runs against whichever ``factory`` is first on ``sys.path`` (this branch, or an
    older checkout put there by ``PYTHONPATH``, from before or after the layer
    subpackages), with the benchmark's recipe, so the old and the new code are timed
    on the same rows by the same harness.
    Returns the best of ``repeat`` passes and a digest of every output row.
    """
    import hashlib
    import importlib

    import factory

    # Ask the tree itself: an editable install's finder would serve ``factory.engine``
    # from the installed tree even when ``factory`` comes from an older checkout.
    layered = (Path(factory.__file__).parent / "engine").is_dir()
    stages = "factory.engine.stages" if layered else "factory.stages"  # before the layers
    make_row = importlib.import_module(f"{stages}.base").make_row
    stage = _postprocess_stage(importlib.import_module(f"{stages}.postprocess"), recipe)
    completions: list[str] = json.loads(Path(path).read_text())
    columns = ("status", "stage", "reason", "message", "id", "output", "labels", "raw")
    best, digest, accepted = float("inf"), "", 0
    for _ in range(max(1, repeat)):
        rows = [
            make_row(completion=c, seed_id=f"s{i % 41}", source=f"s#{i}", call_index=i)
            for i, c in enumerate(completions)
        ]
        start = time.perf_counter()
        out = [stage.run_one(row) for row in rows]
        best = min(best, time.perf_counter() - start)
        h = hashlib.sha256()
        for row in out:
            h.update(json.dumps([row.get(k) for k in columns]).encode())
        digest, accepted = h.hexdigest(), sum(r["status"] == "ok" for r in out)
    return {
        "code": str(Path(factory.__file__).resolve().parents[1]),
        "rows": len(completions),
        "accepted": accepted,
        "best_s": round(best, 4),
        "trajectories_per_s": round(len(completions) / best, 1),
        "outputs_sha256": digest,
    }


# Loads this file's harness by path, so an older checkout (without it) is timed by the
# same code; ``factory`` itself is imported from the tree on PYTHONPATH and the cwd.
_WORKER_BOOT = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('_postprocess_harness', sys.argv[1])\n"
    "mod = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(mod)\n"
    "print(json.dumps(mod._postprocess_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])))\n"
)


def _run_postprocess_worker(
    src: Path, path: Path, repeat: int, procs: int, recipe: Path
) -> dict[str, Any]:
    """``procs`` workers at once on the code in ``src``; per-process and summed rates."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-c", _WORKER_BOOT, str(Path(__file__).resolve()), str(path)]
    cmd += [str(repeat), str(recipe)]
    running = [
        subprocess.Popen(cmd, env=env, cwd=src, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    reports = []
    for proc in running:
        stdout, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"postprocess worker on {src} exited {proc.returncode}")
        reports.append(json.loads(stdout))
    return {
        **reports[0],
        "per_process_per_s": [r["trajectories_per_s"] for r in reports],
        "total_per_s": round(sum(r["trajectories_per_s"] for r in reports), 1),
    }


def bench_postprocess(args: argparse.Namespace) -> dict[str, Any]:
    """The post-processing of one completion (parse, repair, validate, labels, export),
    timed on the same completions for this code and, with ``--baseline DIR``, for an
    older checkout in the same run; their output digests must agree."""
    completions = postprocess_completions(
        args.rows, recipe=args.recipe, seed=args.seed, defect_rate=args.defect_rate
    )
    report: dict[str, Any] = {
        "rows": args.rows,
        "defect_rate": args.defect_rate,
        "procs": args.procs,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="pp-bench-") as tmp:
        path = Path(tmp) / "completions.json"
        path.write_text(json.dumps(completions))
        trees = {"new": Path(__file__).resolve().parents[2]}
        if args.baseline:
            trees = {"old": Path(args.baseline).resolve(), **trees}
        for _ in range(args.rounds):  # alternate, so a change of load hits both alike
            for name, src in trees.items():
                result = _run_postprocess_worker(src, path, args.repeat, args.procs, args.recipe)
                if name not in report or result["total_per_s"] > report[name]["total_per_s"]:
                    report[name] = result
    if "old" in report:
        old, new = report["old"], report["new"]
        report["speedup"] = round(new["trajectories_per_s"] / old["trajectories_per_s"], 2)
        report["same_outputs"] = old["outputs_sha256"] == new["outputs_sha256"]
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return report


def _postprocess_stage(module: Any, recipe: str | Path) -> Any:
    """The post-processing stage of ``recipe`` as the ``factory`` on ``sys.path`` builds it:
    from typed settings and the loaded domain (the recipe package), or, in an older
    checkout, from the recipe itself (``factory.config``)."""
    import importlib
    import importlib.util

    typed = importlib.util.find_spec("factory.recipe") is not None
    cfg = importlib.import_module("factory.recipe" if typed else "factory.config").load_recipe(
        recipe
    )
    if not typed:
        return module.PostprocessStage(cfg)
    settings = importlib.import_module("factory.engine.settings").postprocess_settings(cfg)
    domain = importlib.import_module("factory.envs.pack").load_domain(cfg.domain)
    return module.PostprocessStage(settings, domain)
