"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import psutil

from factory.config import RecipeConfig, load_recipe
from factory.core.formats import parse_record
from factory.core.validate import validate
from factory.envs.pack import load_domain

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


def cli_args(out: Path, *overrides: str, name: str = "airline.yaml") -> list[str]:
    """``python -m factory.run`` on a shipped recipe into ``out``, no bar, each override
    as a ``--set``: the command the subprocess tests run (kill, lock, resume)."""
    import sys

    sets = [x for o in overrides for x in ("--set", o)]
    recipe_path = str(ROOT / "pipelines" / name)
    command = [sys.executable, "-m", "factory.run", recipe_path, "-o", str(out)]
    return [*command, "--no-progress", *sets]


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


def booking_args(
    state: dict[str, Any],
    *,
    user_id: str | None = None,
    flight_number: str | None = None,
    date: str | None = None,
    cabin: str = "economy",
    passengers: list[dict[str, Any]] | None = None,
    payments: list[dict[str, Any]] | None = None,
    **over: Any,
) -> dict[str, Any]:
    """Arguments of a valid one-way airline booking in ``state``.

    The user (default: the first with a credit card) books the first flight with
    enough free seats in ``cabin`` (``flight_number`` and ``date`` if given) for ``passengers``
    (default: one), paid in full by their first credit card unless ``payments``
    is given; ``over`` replaces any argument.
    """
    people = passengers or [{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}]
    if user_id is None:
        user_id = next(
            u
            for u, user in state["users"].items()
            if any(m["source"] == "credit_card" for m in user["payment_methods"].values())
        )
    methods = state["users"][user_id]["payment_methods"]
    card = next((p for p, m in methods.items() if m["source"] == "credit_card"), None)
    number, day, price = next(
        (n, d, on["prices"][cabin])
        for n, flight in state["flights"].items()
        for d, on in flight["dates"].items()
        if flight_number in (None, n)
        and date in (None, d)
        and on.get("status") == "available"
        and on["available_seats"][cabin] >= len(people)
    )
    flight = state["flights"][number]
    args = {
        "user_id": user_id,
        "origin": flight["origin"],
        "destination": flight["destination"],
        "flight_type": "one_way",
        "cabin": cabin,
        "flights": [{"flight_number": number, "date": day}],
        "passengers": people,
        "payment_methods": payments
        if payments is not None
        else [{"payment_id": card, "amount": price * len(people)}],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    return {**args, **over}


class _Remote:
    """``actor.method.remote(...)`` for a plain object, awaitable like an ObjectRef."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args)

        return call()


class LocalBudget:
    """A ``BudgetActor`` handle without Ray: its methods over a ``BudgetState``, awaited
    through ``.remote`` as an LLM stage awaits them; ``asked`` records each reservation."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.asked: list[float] = []
        self.try_start = _Remote(self._try_start)
        self.finish = _Remote(state.finish)
        self.release = _Remote(state.release)

    def _try_start(self, cost_usd: float = 0.0, tokens: int = 0) -> bool:
        self.asked.append(cost_usd)
        return bool(self.state.try_start(cost_usd, tokens))


def stop_head(head: subprocess.Popen[Any]) -> None:
    """End a Ray head started in a session of its own, and every process of that session.

    Ctrl-C to its process group first (what a person at its terminal does), SIGKILL when
    it does not end within a minute, SIGKILL again for whatever outlived it in its group,
    and last the processes it had started that left the group (Ray's workers): a test
    never leaves a process behind, whatever failed before.
    """
    tree: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = psutil.Process(head.pid).children(recursive=True)
    if head.poll() is None:
        os.killpg(head.pid, signal.SIGINT)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(tree, timeout=30)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0
