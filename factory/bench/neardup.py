"""``python -m factory.bench neardup``: the cost of near-duplicate removal at 90k rows.

Each library runs in its own process (so its peak RSS is its own): signing (shingles ->
MinHash, the per-row work the postprocess actors do) and the index (query + insert,
the driver's work), in rows/s, and the peak RSS growth over the process holding only
the rows' shingles. Rows: distinct user texts drawn from the seeds' vocabulary, plus a
share of planted copies with words replaced, whose recall is reported too.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from typing import Any

from factory.core.neardup import NearDupIndex, NearDupParams, view_shingles
from factory.core.trajectory import Trajectory, Turn

__all__ = ["bench_neardup", "make_rows"]


def make_rows(n: int, planted: float, seed: int = 0) -> tuple[list[list[str]], set[int]]:
    """``n`` rows of user-view shingles; the indexes of the planted near-copies."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"  # no digits: the view folds them to 0
    vocab = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(20000)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(vocab))]  # Zipf-like, as words are
    texts: list[list[str]] = []
    copies: set[int] = set()
    originals: list[list[str]] = []
    for i in range(n):
        if originals and rng.random() < planted:  # a copy of a distinct row, never of a copy
            words = list(rng.choice(originals))
            for k in rng.sample(range(len(words)), len(words) // 10):  # names changed
                words[k] = "".join(rng.choices(letters, k=7))
            copies.add(i)
        else:
            words = rng.choices(vocab, weights, k=rng.randint(30, 90))
            originals.append(words)
        texts.append(words)
    rows = [view_shingles(Trajectory(turns=[Turn("user", " ".join(w))]), "user", 2) for w in texts]
    return rows, copies


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _one(library: str, n: int, planted: float) -> dict[str, Any]:
    rows, copies = make_rows(n, planted)
    base = _rss_mb()
    params = NearDupParams()
    removed: set[int] = set()
    if library == "rensa":
        from rensa import RMinHash

        t0 = time.perf_counter()
        sigs = []
        for shingles in rows:
            m = RMinHash(num_perm=params.num_perm, seed=params.seed)
            m.update(shingles)
            sigs.append(bytes(m.__getstate__()))
        t1 = time.perf_counter()
        index = NearDupIndex(params)
        for i, sig in enumerate(sigs):
            if index.check(str(i), sig) is not None:
                removed.add(i)
        t2 = time.perf_counter()
    else:
        from datasketch import MinHash, MinHashLSH

        t0 = time.perf_counter()
        hashed = MinHash.bulk([[s.encode() for s in r] for r in rows], num_perm=params.num_perm)
        t1 = time.perf_counter()
        lsh = MinHashLSH(threshold=params.threshold, num_perm=params.num_perm)
        kept: list[Any] = []
        for i, m in enumerate(hashed):
            if any(m.jaccard(kept[int(k)]) >= params.threshold for k in lsh.query(m)):
                removed.add(i)
                continue
            lsh.insert(str(len(kept)), m)
            kept.append(m)
        t2 = time.perf_counter()
    return {
        "library": library,
        "rows": n,
        "sign_rows_per_s": round(n / (t1 - t0)),
        "index_rows_per_s": round(n / (t2 - t1)),
        "end_to_end_rows_per_s": round(n / (t2 - t0)),
        "peak_rss_growth_mb": round(_rss_mb() - base, 1),
        "planted": len(copies),
        "recall": round(len(removed & copies) / len(copies), 4) if copies else None,
        "false_removals": len(removed - copies),
    }


def bench_neardup(args: argparse.Namespace) -> dict[str, Any]:
    """Run each library in a child process; datasketch on ``--datasketch-rows`` (its
    pure-Python hashing takes minutes at 90k)."""
    out: dict[str, Any] = {}
    for library, n in (("rensa", args.rows), ("datasketch", args.datasketch_rows)):
        if not n:
            continue
        code = (
            "import json,sys; from factory.bench.neardup import _one; "
            f"print(json.dumps(_one({library!r}, {n}, {args.planted})))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode:
            out[library] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            out[library] = json.loads(done.stdout.strip().splitlines()[-1])
    return out
