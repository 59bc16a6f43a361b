"""Resumable runs: what an output folder holds, and whether a run may continue it.

``OUT/run.json`` records the recipe a folder was produced with and the run's
status (running, stopped by a cap, done). Starting a run on a folder:

* empty folder: a new run;
* same recipe (up to the settings below that never change a request or a row):
  the run is resumed. Every output file is rebuilt from the response cache,
  which holds every completed LLM response, so no completed call is paid for
  twice, and since a run is deterministic for a fixed recipe (seed order,
  request ids, Ray Data's preserved order) the rebuilt dataset equals what an
  uninterrupted run writes;
* a different recipe: refused, naming the keys that changed (mixing two
  recipes in one output would make the dataset meaningless); ``--fresh``
  starts over instead;
* a run that finished: nothing to do, unless ``--retry-failed`` asks to retry
  the calls that failed (they are never cached, so they are issued again).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from factory.config import RecipeConfig
from factory.errors import ConfigError
from factory.writer import atomic_write_text

__all__ = ["RESUMABLE", "changed_keys", "finish_run", "prepare_output"]

STATE_FILE = "run.json"
GENERATED = (
    "data",
    "surplus",
    "rejects",
    "failed",
    "candidates",
    "manifest.json",
    "dataset_info.json",
    ".tmp",
)
# Settings that change neither a request nor a row: a resumed run may change them
# (raise a cap, use other servers, tune concurrency).
RESUMABLE = (
    "output.dir",
    "amplify.max_cost_usd",
    "amplify.max_tokens",
    "amplify.max_calls",
    "amplify.target",
    "llm.endpoints",
    "llm.transport",
    "llm.concurrency",
    "llm.per_actor_concurrency",
    "llm.timeout_s",
    "llm.retry",
    "llm.deadline",
    "ray",
    "cache",
    "envsim.max_episodes",
    "envsim.episodes_per_round",
)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Key paths whose values differ, other than the resumable ones."""
    a, b = _flatten(old), _flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return [k for k in keys if not any(k == r or k.startswith(r + ".") for r in RESUMABLE)]


def prepare_output(cfg: RecipeConfig, out_dir: Path, *, fresh: bool, retry_failed: bool) -> str:
    """Get ``out_dir`` ready; returns ``new``, ``resume`` or ``done`` (nothing to do).

    Raises:
        ConfigError: the folder holds a run of a different recipe (keys listed).
    """
    state_path = out_dir / STATE_FILE
    recipe = cfg.model_dump(mode="json")
    mode = "new"
    if fresh and out_dir.exists():
        for child in out_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    elif state_path.is_file():
        state = json.loads(state_path.read_text(encoding="utf-8"))
        changed = changed_keys(state.get("recipe", {}), recipe)
        if changed:
            raise ConfigError(
                f"{out_dir} holds a run of a different recipe (changed: {', '.join(changed)}); "
                "use --fresh to start over or another --output",
                key_path=changed[0],
            )
        if state.get("status") == "done" and not retry_failed:
            return "done"
        mode = "resume"
    for name in GENERATED:  # rebuilt from the cache; the cache itself is kept
        target = out_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir, recipe, "running")
    return mode


def _write(out_dir: Path, recipe: dict[str, Any], status: str, **extra: Any) -> None:
    body = {
        "status": status,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": recipe,
        **extra,
    }
    atomic_write_text(out_dir / STATE_FILE, json.dumps(body, indent=2) + "\n", out_dir)


def finish_run(cfg: RecipeConfig, out_dir: Path, *, stopped_by: str | None) -> None:
    """Record that the run ended (``done``, or ``stopped`` by a cap and resumable)."""
    _write(
        out_dir,
        cfg.model_dump(mode="json"),
        "stopped" if stopped_by else "done",
        stopped_by=stopped_by,
    )
