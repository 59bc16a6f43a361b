"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from factory.config import RecipeConfig, load_recipe
from factory.domain import load_domain
from factory.formats import parse_record
from factory.validate import validate

from .conftest import ROOT


def recipe(name: str, out: Path, *overrides: str) -> RecipeConfig:
    return load_recipe(ROOT / "pipelines" / name, [f"output.dir={out}", *overrides])


def dev_overrides(*urls: str, target: int, **extra: Any) -> list[str]:
    """Point the airline recipe at local devservers with fast retries."""
    items = [
        "llm.model=factory-dev",
        "prefilter.model=factory-dev",
        f"amplify.target={target}",
        "llm.retry.base_delay_s=0.05",
        "llm.retry.max_delay_s=0.5",
        "llm.timeout_s=10",
        "amplify.max_cost_usd=null",
    ]
    items.append("llm.endpoints=" + json.dumps([{"base_url": u} for u in urls]))
    items += [f"{k.replace('__', '.')}={v}" for k, v in extra.items()]
    return items


def read_rows(out: Path, sub: str = "data") -> list[dict[str, Any]]:
    files = sorted((out / sub).glob("*.parquet"))
    if not files:
        return []
    return pl.concat([pl.read_parquet(f) for f in files]).to_dicts()


def read_jsonl(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(folder.glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line]
    return rows


def assert_rows_valid(cfg: RecipeConfig, rows: list[dict[str, Any]]) -> None:
    """Every written row parses back as a sharegpt seed and passes every rule."""
    domain = load_domain(cfg)
    for row in rows:
        record = {
            "conversations": row["conversations"],
            "system": row["system"],
            "tools": row["tools"] or json.dumps(domain.public_tools()),
        }
        traj = parse_record(record, source="output")
        issues = validate(traj, rules=domain.rules)
        assert not issues, (row["id"], issues)
