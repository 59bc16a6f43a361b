"""The LLM layer's edge is wire-neutral (issue 34, point 5).

Only ``factory/llm/backends/`` (which maps each provider's wire shape to
``factory.llm.types``) and ``factory/devserver/`` (which speaks OpenAI on purpose) may
read OpenAI's response shape; and a response cache filled by the factory before the
neutral edge is still replayed, never paid again.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from factory.engine.stages.base import make_row
from factory.engine.stages.llm_stage import record_completion
from factory.io.cache import ResponseCache, completion_from_record, completion_to_record
from factory.llm.types import Completion, ToolCall, Usage
from tests.conftest import ROOT

ALLOWED = ("factory/llm/backends/", "factory/devserver/")
# OpenAI's usage keys in any form (key, attribute, field), a response's choice list read
# as a key or an attribute (``rng.choices(...)`` and argparse's ``choices=`` are not),
# and a usage block read by key.
WIRE = re.compile(
    r"\b(prompt_tokens|completion_tokens|total_tokens)(_details)?\b"
    r"|[\"']choices[\"']|\.choices\b(?!\()"
    r"|\busage\s*\[|\busage\.get\("
)
OLD_CACHE = ROOT / "tests/fixtures/cache_a771dbb"  # written by factory at a771dbb
OLD_ID = "amplify-0123456789abcdef0123456789abcdef"


def _hits(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for m in WIRE.finditer(text)
    ]


def test_no_module_outside_the_backends_reads_openais_wire_shape() -> None:
    hits = [
        hit
        for path in sorted((ROOT / "factory").rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(ALLOWED)
        for hit in _hits(path)
    ]
    assert hits == []


def test_the_pattern_finds_what_the_backends_read() -> None:
    """The grep is not vacuous: the OpenAI mapping itself matches it."""
    found = " ".join(_hits(ROOT / "factory/llm/backends/openai_wire.py"))
    assert "prompt_tokens" in found and "choices" in found and "total_tokens" in found
    assert not WIRE.search("rng.choices(weights)") and not WIRE.search("p.add_argument(choices=x)")


def test_a_cache_entry_written_before_the_neutral_edge_is_replayed(tmp_path: Path) -> None:
    shutil.copytree(OLD_CACHE, tmp_path / "cache")
    cache = ResponseCache(str(tmp_path / "cache"))
    record = cache.get(OLD_ID)
    assert record is not None and "prompt_tokens" in record["usage"]  # the old form
    c = completion_from_record(record)
    cache.close()
    assert c.usage == Usage(input=1200, cached_input=1000, output=300, reasoning=100)
    assert (c.text, c.reasoning, c.cost_usd, c.attempts) == (
        "an answer paid for by an older factory",
        "thinking",
        0.0029,
        2,
    )
    assert (c.finish_reason, c.retries, c.tool_calls) == ("stop", {"llm_rate_limited": 1}, ())
    row = make_row()
    record_completion(row, c, cached=True, stage="amplify")
    # the row reads as it did: the same usage column, no spend, no call
    assert json.loads(row["usage"]) == {
        "prompt_tokens": 1200,
        "completion_tokens": 300,
        "cached_tokens": 1000,
    }
    assert (row["cost_usd"], row["paid_usd"], row["calls"], row["cached_responses"]) == (
        0.0029,
        0.0,
        0,
        1,
    )


def test_a_new_entry_stores_the_neutral_counts_and_reads_back(tmp_path: Path) -> None:
    c = Completion(
        text="t", reasoning=None, usage=Usage(10, 4, 2, 5, 1), cost_usd=0.1, endpoint="e",
        attempts=1, latency_s=0.5, model="m", system_fingerprint=None, finish_reason="tool_calls",
        tool_calls=(ToolCall("call_1", "search", '{"q": "x"}'),),
    )  # fmt: skip
    with ResponseCache(str(tmp_path / "c")) as cache:
        cache.put("k", completion_to_record(c))
    with ResponseCache(str(tmp_path / "c")) as cache:
        record = cache.get("k")
    assert record is not None
    assert record["usage"] == {
        "input": 10,
        "cached_input": 4,
        "cache_write": 2,
        "output": 5,
        "reasoning": 1,
    }
    assert completion_from_record(record) == c
