"""Issue 13's must-hold, on Ray against the development server: planted near-duplicates
(the server repeats itself on request) are removed, rows built to be distinct are kept,
and a second run that loads the first run's index adds nothing the first one has."""

from __future__ import annotations

import json
import re
from pathlib import Path

from factory.engine.runner import run
from tests.conftest import ROOT
from tests.helpers import dev_overrides, read_jsonl, read_rows, recipe

SEEDS = [json.loads(x) for x in (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()]
N = len(SEEDS)  # every authored seed is distinct (tests/core/test_neardup.py checks it)


def _grams(texts: list[str]) -> set[str]:
    """User-turn word 2-grams, digits folded: an exact measure, independent of MinHash."""
    out: set[str] = set()
    for text in texts:
        words = re.findall(r"\w+", re.sub(r"\d", "0", text.lower()))
        out.update(" ".join(words[i : i + 2]) for i in range(len(words) - 1))
    return out


SEED_GRAMS = [
    _grams([m["value"] for m in s["conversations"] if m["from"] == "human"]) for s in SEEDS
]


def origin(row: dict) -> int:
    """The authored seed an output row is a renamed copy of (renamed copies share >= 0.4
    of their user 2-grams with their seed, distinct seeds <= 0.2)."""
    grams = _grams([m["value"] for m in row["conversations"] if m["from"] == "human"])
    sims = [len(grams & g) / len(grams | g) for g in SEED_GRAMS]
    best = max(range(N), key=sims.__getitem__)
    assert sims[best] >= 0.3 and sorted(sims)[-2] < 0.3, sorted(sims)[-2:]
    return best


def _run(server_url: str, out: Path, *extra: str):
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server_url, target=N),
        "prefilter.enabled=false",
        f"amplify.max_calls={N}",  # one round, one call per seed
        *extra,
    )
    result = run(cfg, out, progress=False)
    return result, json.loads((out / "manifest.json").read_text())


def test_planted_near_duplicates_are_removed_and_distinct_rows_kept(
    ray_session, devserver, tmp_path
) -> None:
    server = devserver(seed=5, repeat=0.3)
    out = tmp_path / "one"
    result, manifest = _run(server.url, out, "near_duplicates={}")
    repeated = server.stats()["repeated_answers"]
    assert repeated >= 5  # the run really holds planted near-duplicates
    rows = read_rows(out)
    origins = [origin(r) for r in rows]
    rejects = [r for r in read_jsonl(out / "rejects") if r["reason"] == "near_duplicate"]
    assert result.totals["failed"] == 0 and len(rows) + len(rejects) == N
    # Each answer is its own seed's (N - repeated of them, distinct seeds) or a renamed
    # copy of an earlier one. Kept rows with the same origin are missed near-duplicates;
    # an origin with no kept row would be a false removal of a distinct row.
    missed = len(origins) - len(set(origins))
    assert (repeated - missed) / repeated >= 0.95
    assert len(set(origins)) == N - repeated  # no distinct row removed
    assert all(r["stage"] == "neardup" and "near-duplicate of" in r["message"] for r in rejects)
    nd = manifest["near_duplicates"]
    assert nd["rejected"] == len(rejects) and nd["index_rows"] == len(rows)
    assert manifest["reasons"]["neardup"]["near_duplicate"] == len(rejects)
    assert (out / "neardup.index").is_file()
    div = manifest["diversity"]
    assert div["rows"] == len(rows) and div["per_seed"]["seeds"] == N

    # A second run (answers all original: another server) loading the first run's
    # index re-adds none of the origins the first run kept.
    server2 = devserver(seed=6)
    out2 = tmp_path / "two"
    index = json.dumps([str(out / "neardup.index")])
    _, manifest2 = _run(server2.url, out2, f"near_duplicates={{index: {index}}}")
    rows2 = read_rows(out2)
    assert not {origin(r) for r in rows2} & set(origins)
    assert len({origin(r) for r in rows2}) == len(rows2) == N - len(set(origins))
    assert manifest2["near_duplicates"]["loaded_from_earlier_runs"] == len(rows)
