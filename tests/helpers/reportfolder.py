"""A small hand-built output folder (the layout a run writes) for the report, inspect
and dataset card tests: written with the factory's own writers, no Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info

TOOLS = [
    {"name": "get_user_details", "description": "a user", "parameters": {"type": "object"}},
    {"name": "cancel_reservation", "description": "cancel", "parameters": {"type": "object"}},
    {
        "name": "transfer_to_human_agents",
        "description": "hand off",
        "parameters": {"type": "object"},
    },
]


def conversation(i: int, outcome: str) -> list[dict[str, str]]:
    call = {"name": "get_user_details", "arguments": {"user_id": f"user_{i}"}}
    turns = [
        {"from": "human", "value": f"Hi, I am user_{i} and I want to cancel booking R{i:03d}."},
        {"from": "function_call", "value": json.dumps(call)},
        {"from": "observation", "value": json.dumps({"user_id": f"user_{i}", "name": "Ada"})},
    ]
    if outcome == "refused":
        turns.append({"from": "gpt", "value": "Sorry, this booking cannot be cancelled."})
    else:
        cancel = {"name": "cancel_reservation", "arguments": {"reservation_id": f"R{i:03d}"}}
        turns += [
            {"from": "gpt", "value": "Found you. Cancelling now."},
            {"from": "human", "value": "Yes please."},
            {"from": "function_call", "value": json.dumps(cancel)},
            {"from": "observation", "value": '{"status": "cancelled"}'},
            {"from": "gpt", "value": f"Booking R{i:03d} is cancelled."},
        ]
    return turns


def make_folder(out: Path, *, rows: int = 12, extra: dict[str, Any] | None = None) -> Path:
    """An amplify-like folder: ``rows`` accepted rows from 3 seeds (every third refused),
    two reject reasons, a manifest with the sections a run writes, and run.json;
    ``extra``: manifest sections added, or replacing these."""
    data = ShardWriter(out, shard_rows=5)
    for i in range(rows):
        outcome = "refused" if i % 3 == 0 else "completed"
        labels = {
            "kind": "trajectory",
            "outcome": outcome,
            "group": "Failure" if outcome == "refused" else "Simple",
            "arg_cardinality": 1,
            "calls": 1 if outcome == "refused" else 2,
            "write_calls": 0 if outcome == "refused" else 1,
        }
        meta = {"seed_id": f"seed-{i % 3}", "variation": i, "labels": labels}
        data.add(
            {
                "conversations": conversation(i, outcome),
                "system": "You are an airline agent.",
                "tools": json.dumps(TOOLS),
                "id": f"row-{i:03d}",
                "meta": json.dumps(meta),
            }
        )
    data.close()
    rejects = RejectWriter(out)
    for i, reason in enumerate(["malformed_json", "malformed_json", "unknown_tool"]):
        rejects.add(
            {
                "id": f"call-{i}",
                "seed_id": "seed-1",
                "stage": "postprocess",
                "reason": reason,
                "message": f"{reason}: the answer at call {i} could not be used",
                "raw": '{"messages": [oops',
            }
        )
    rejects.close()
    write_dataset_info(out, "factory_test")
    manifest = Manifest(recipe="airline-test", config_hash="abc123")
    manifest.add_files(data)  # rows and checksums, as a run lists them
    manifest.add_files(rejects)
    manifest.stages = {"export": {"accepted": rows}, "postprocess": {"rejected": 3}}
    manifest.reason("postprocess", "malformed_json", 2)
    manifest.reason("postprocess", "unknown_tool", 1)
    sections = dict(
        pipeline="amplify",
        model="factory-dev",
        generated_with_devserver=True,
        seeds={"total": 4, "kept": 3, "rejected": 1, "failed": 0, "unissued": 0,
               "reasons": {"seed_check:schema": 1}, "retries": {}},
        calls={"issued": rows + 3},
        tokens={"prompt_tokens": 9000, "completion_tokens": 3000, "cached_tokens": 1000},
        cost_usd=0.0421,
        cost_usd_paid_this_run=0.03,
        responses_from_cache=4,
        unissued=0,
        by_stage={
            "prefilter": {"tokens": {"prompt_tokens": 1000, "completion_tokens": 40},
                          "cost_usd": 0.0017, "retries": {}, "cache_read_share": 0.0,
                          "cache_saved_usd": 0.0},
            "amplify": {"tokens": {"prompt_tokens": 8000, "completion_tokens": 2960,
                                   "cached_tokens": 1000},
                        "cost_usd": 0.0404, "retries": {"rate_limit": 2},
                        "cache_read_share": 0.125, "cache_saved_usd": 0.001125},
        },
        cost_summary={"per_1k_accepted_usd": round(0.0421 * 1000 / rows, 6),
                      "accepted": rows, "priced": True, "unpriced_stages": [],
                      "cache_read_share": 0.1111, "cache_write_tokens": 0,
                      "cache_saved_usd": 0.001125, "batch_saved_usd": None},
        retries={"rate_limit": 2},
        target={"requested": rows, "reached": True, "stopped_by": None},
        prompt_cache={"static_prefix_tokens_per_call": 500, "static_prefix_share": 0.8,
                      "server_cached_share": 0.11},
        timeline={"columns": ["seconds", "total", "accepted", "cost_usd", "paid_usd",
                              "responses_from_cache"],
                  "points": [[0.5, 2, 1, 0.005, 0.004, 0], [1.5, 9, 7, 0.02, 0.015, 2],
                             [2.5, rows + 3, rows, 0.0421, 0.03, 4]]},
    )  # fmt: skip
    manifest.extra.update({**sections, **(extra or {})})
    manifest.write(out, total=rows + 3, accepted=rows, surplus=0, rejected=3, failed=0)
    state = {
        "status": "done",
        "updated": "2026-11-22T20:00:00Z",
        "recipe": {
            "name": "airline-test",
            "pipeline": "amplify",
            "seeds": {"path": "seeds/airline/seeds.jsonl"},
            "llm": {"model": "factory-dev", "endpoints": [{"base_url": "http://10.0.0.7:8000/v1"}]},
            "prefilter": {"enabled": True, "model": "factory-dev"},
            "output": {"dir": str(out)},
        },
    }
    (out / "run.json").write_text(json.dumps(state), encoding="utf-8")
    return out


def make_envsim_folder(out: Path, *, rows: int = 8) -> Path:
    """An envsim-like folder: alpaca step samples with step labels (|Δ|, arguments)."""
    from factory.engine.jobs.envsim import ALPACA_SCHEMA

    data = ShardWriter(out, schema=ALPACA_SCHEMA)
    for i in range(rows):
        delta = i % 4
        labels = {"kind": "step", "outcome": "change" if delta else "no_change",
                  "group": "Simple" if delta else "No-Change", "delta_size": delta,
                  "arg_cardinality": 1 + i % 3}  # fmt: skip
        meta = {"labels": labels, "env_id": "env-1", "step": i, "tool": "cancel_reservation"}
        data.add(
            {
                "system": "You simulate the back end of a tool-using environment.",
                "instruction": "### Tool\ncancel_reservation",
                "input": f'cancel_reservation({{"reservation_id": "R{i:03d}"}})',
                "output": f'{{"feedback": "cancelled R{i:03d}", "config_changes": []}}',
                "id": f"step-{i}",
                "meta": json.dumps(meta),
            }
        )
    data.close()
    manifest = Manifest(recipe="airline-envsim-test", config_hash="def456")
    manifest.files.update(data.files)
    manifest.stages = {"envsim": {"accepted": rows}}
    manifest.extra.update(
        pipeline="envsim",
        episodes=3,
        domain={"name": "airline",
                "tools": ["cancel_reservation", "get_user_details", "list_all_airports"]},
        mixture={"name": "balance", "wanted": {"simple": 6, "no_change": 2},
                 "selected": {"simple": 6, "no_change": 2}, "available": {"simple": 9},
                 "shortfall": {}, "excluded": 0},
    )  # fmt: skip
    manifest.write(out, total=rows, accepted=rows, surplus=0, rejected=0, failed=0)
    (out / "run.json").write_text(json.dumps({"status": "done", "recipe": {}}), encoding="utf-8")
    return out
