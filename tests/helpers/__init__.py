"""The one helpers module of the suite: recipes and overrides for runs, output readers,
process and port helpers, and the data several test modules share (``browser``,
``lfcompat`` and ``reportfolder`` beside it are its parts)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import datasets
import polars as pl
import psutil
from pydantic import BaseModel

from factory.core.formats import parse_record
from factory.core.validate import validate
from factory.envs.pack import load_domain
from factory.recipe import AmplifyRecipe, Recipe, load_recipe
from tests.conftest import ROOT
from tests.helpers import lfcompat

if TYPE_CHECKING:
    from factory.simenv.runtime import Runtime
    from factory.simenv.tasks import Task


def readme_commands() -> list[str]:
    """The README's set-up commands, in order (install, test, the offline amplification
    run): the lines of its first ```bash block that are not comments."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md must give its set-up commands in a ```bash block"
    lines = (line.strip() for line in block.group(1).splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def model_field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field path of a pydantic model, nested models followed, written as the
    recipe reference writes them (``llm.endpoints[].base_url``, ``prices.<name>.x``)."""
    paths = set()
    for name, info in model.model_fields.items():
        path = prefix + name
        paths.add(path)
        nested = _nested_model(info.annotation)
        if nested is not None:
            origin = str(info.annotation)
            joint = "[]." if "list[" in origin else ".<name>." if "dict[" in origin else "."
            paths |= model_field_paths(nested, path + joint)
    return paths


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def recipe(name: str, out: Path, *overrides: str) -> Recipe:
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
        # These runs count paid answers exactly (nothing paid twice, a resume costs what an
        # uninterrupted run costs); a hedge whose two answers both arrive would be paid
        # twice, by design. Hedging is tested in tests/llm/test_deadline.py.
        "llm.deadline.hedge_share=0",
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


def assert_rows_valid(cfg: Recipe, rows: list[dict[str, Any]]) -> None:
    """Every written row parses back as a sharegpt seed and passes every rule (a text-action
    domain's rows: read with its grammar, checked against it and its composition rules)."""
    domain = load_domain(cfg.domain)
    for row in rows:
        record = {
            "conversations": row["conversations"],
            "system": row["system"],
            "tools": row["tools"] or json.dumps(domain.public_tools()),
        }
        traj = parse_record(record, source="output", grammar=domain.grammar)
        issues = validate(traj, rules=domain.rules, grammar=domain.grammar, compose=domain.compose)
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


def stage_settings(cfg: Recipe, stage: str = "amplify", model: str | None = None) -> Any:
    """The resolved settings of one LLM stage of ``cfg`` (another model if given)."""
    import dataclasses

    from factory.engine.settings import llm_stages

    settings = llm_stages(cfg)[stage]
    return dataclasses.replace(settings, model=model) if model else settings


def amplify_stage(cfg: AmplifyRecipe, kept: dict[str, str]) -> Any:
    """The real amplification stage of ``cfg`` over ``kept`` seeds, built as a worker does
    (from the spec the job sends it: settings and the domain)."""
    from factory.engine.settings import amplify_settings
    from factory.engine.stages.amplify import build_amplify, seed_order

    order = seed_order(list(kept), cfg.amplify.seed)
    domain = load_domain(cfg.domain)
    return build_amplify(stage_settings(cfg), amplify_settings(cfg), domain, kept, order)


def prefilter_stage(cfg: Recipe) -> Any:
    """The real judge stage of ``cfg``, built as a worker does."""
    from factory.engine.settings import prefilter_prompt
    from factory.engine.stages.prefilter import build_prefilter

    prompt = prefilter_prompt(cfg)
    return build_prefilter(stage_settings(cfg, "prefilter"), prompt, load_domain(cfg.domain))


def postprocess_stage(cfg: AmplifyRecipe, seeds: dict[str, str] | None = None) -> Any:
    """The real post-processing stage of ``cfg``, built as a worker does."""
    from factory.engine.settings import postprocess_settings
    from factory.engine.stages.postprocess import PostprocessStage, seed_systems

    domain = load_domain(cfg.domain)
    return PostprocessStage(postprocess_settings(cfg), domain, seed_systems(domain, seeds or {}))


def seed_check_stage(cfg: Recipe) -> Any:
    """The real seed checks of ``cfg``, built as a worker does."""
    from factory.engine.pipeline import build_seed_check
    from factory.engine.settings import seed_check_settings

    return build_seed_check(seed_check_settings(cfg), load_domain(cfg.domain))


def stop_head(head: subprocess.Popen[Any]) -> None:
    """End a Ray head started in a session of its own, and every process of that session.

    Ctrl-C to its process group first (what a person at its terminal does), SIGTERM when it
    has not ended after 5 s (a full-suite run once waited 60 s on a head that ignored the
    Ctrl-C; the serve tests' head took 30 s of 15 + 15 to end, 2026-11-26), SIGKILL after
    5 s more, SIGKILL again for whatever outlived it in its group,
    and last the processes it had started that left the group (Ray's workers): a test
    never leaves a process behind, whatever failed before.
    """
    tree: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = psutil.Process(head.pid).children(recursive=True)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if head.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5 if sig != signal.SIGKILL else None)
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


def check_alpaca(out: Path) -> list[dict]:
    """Every row goes through LLaMA-Factory's own alpaca converter with a target."""
    lf = lfcompat.load()
    info = json.loads((out / "dataset_info.json").read_text())
    ((_, entry),) = info.items()
    attr = lfcompat.DatasetAttr.from_info(entry)
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    conv = lf.converter.get_dataset_converter(attr.formatting, attr, lfcompat.DataArgs())
    rows = list(ds)
    for example in rows:
        aligned = conv(example)
        assert len(aligned["_prompt"]) == 1 and aligned["_prompt"][0]["content"]
        assert len(aligned["_response"]) == 1 and aligned["_response"][0]["content"]
        if entry["columns"].get("system"):  # the row's own system prompt, never the template's
            assert aligned["_system"] == example["system"]
    return rows


_TOKEN = re.compile(r"[A-Za-z0-9_:\-]+")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            inner = json.loads(value)
        except ValueError:
            return [value]
        return _strings(inner) if not isinstance(inner, str) else [inner]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def underivable(row: dict[str, str]) -> set[str]:
    """Tokens of the row's output that appear nowhere in its instruction or input."""
    context = row["instruction"] + "\n" + row["input"]
    found = set()
    for text in _strings(json.loads(row["output"])):
        for token in _TOKEN.findall(text):
            token = token.strip(":-")
            if len(token) < 3 or token.isdigit():
                continue
            if (re.search(r"\d", token) or token.isupper()) and token not in context:
                found.add(token)
    return found


AIRLINE_SEEDS = [
    parse_record(json.loads(line), source=f"s:{i}")
    for i, line in enumerate((ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines())
]


EPISODES = 64


def task_actions(task: Task, wrong: bool) -> list[dict[str, Any]]:
    actions = [
        {"name": a["name"], "arguments": copy.deepcopy(a["arguments"])} for a in task.actions
    ]
    if wrong:
        args = actions[-1]["arguments"]
        key = next(k for k, v in args.items() if isinstance(v, str))
        args[key] = args[key] + "_x"  # a different (failing or other) final call
    return actions


def episode_plan(rt: Runtime) -> list[tuple[Task, bool, int]]:
    writes = rt.spec.pack.write_tools()
    # tasks whose ground truth ends on a write and asks for no output: following it earns 1
    tasks = [t for t in rt.spec.tasks if t.actions and t.actions[-1]["name"] in writes]
    tasks = [t for t in tasks if not t.outputs][:8]
    return [(tasks[i % len(tasks)], i % 2 == 1, i) for i in range(EPISODES)]


async def play_remote(url: str, task: Task, wrong: bool, seed: int, barrier: asyncio.Barrier):
    from factory.simenv.server import SimAction, SimClient

    seen = []
    async with SimClient(base_url=url, connect_timeout_s=300, message_timeout_s=300) as env:
        r = await env.reset(task_id=task.task_id, seed=seed)
        seen.append((r.observation.role, r.observation.content, r.observation.task_id))
        await barrier.wait()  # every session is open at once before any step
        for a in task_actions(task, wrong):
            r = await env.step(SimAction(tool_name=a["name"], arguments=a["arguments"]))
            seen.append((r.observation.role, r.observation.content, r.observation.name))
        if not r.done:
            r = await env.step(SimAction(content="Everything is done."))
            seen.append((r.observation.role, r.observation.content, r.observation.name))
        state = await env.state()
    return seen, r.reward, r.done, state


def make_reference() -> dict[str, Any]:
    """A small airline episode in the amplification output format."""
    return {
        "messages": [
            {
                "role": "user",
                "content": "Hi! I'm looking to fly from New York to Seattle on May 20th.",
            },
            {"role": "assistant", "content": "Sure. What is your user id?"},
            {"role": "user", "content": "It's mia_li_3668, and my reservation is ZFA04Y."},
            {
                "role": "assistant",
                "reasoning": "Look up mia_li_3668 first.",
                "content": "",
                "tool_calls": [
                    {"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}
                ],
            },
            {"role": "tool", "name": "get_user_details", "content": json.dumps(PROFILE)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "name": "search_direct_flight",
                        "arguments": {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"},
                    }
                ],
            },
            {"role": "tool", "name": "search_direct_flight", "content": json.dumps(FLIGHTS)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "name": "book_reservation",
                        "arguments": {
                            "user_id": "mia_li_3668",
                            "flights": [{"flight_number": "HAT069", "date": "2024-05-20"}],
                            "payment_methods": [
                                {"payment_id": "credit_card_4421486", "amount": 121}
                            ],
                            "total_baggages": 1,
                            "insurance": "no",
                        },
                    }
                ],
            },
            {"role": "tool", "name": "book_reservation", "content": '{"reservation_id": "VAAOXJ"}'},
            {
                "role": "assistant",
                "content": "Booked VAAOXJ for Mia Li: HAT069 from JFK to SEA on 2024-05-20, "
                "paid with the card ending 7447; a receipt goes to mia.li3818@example.com.",
            },
        ]
    }


PROFILE = {
    "user_id": "mia_li_3668",
    "name": {"first_name": "Mia", "last_name": "Li"},
    "email": "mia.li3818@example.com",
    "dob": "1990-04-05",
    "payment_methods": {
        "credit_card_4421486": {
            "source": "credit_card",
            "last_four": "7447",
            "id": "credit_card_4421486",
        }
    },
    "saved_passengers": [{"first_name": "Amelia", "last_name": "Ahmed", "dob": "1957-03-21"}],
    "reservations": ["ZFA04Y", "VAAOXJ"],
}


FLIGHTS = [{"flight_number": "HAT069", "origin": "JFK", "destination": "SEA", "date": "2024-05-20"}]


def collect_rows(
    out_dir: Path, collector: Any, rows: list[dict[str, Any]], **sections: Any
) -> list:
    """File ``rows`` as the driver loop does (each counted on arrival and when used, in
    order), then close the collector and write the manifest; returns each row's fate."""
    from factory.engine.ledger import Ledger
    from factory.engine.loop import JobReport
    from factory.engine.result import write_manifest
    from factory.engine.work import ItemResult

    ledger = Ledger()
    kinds = []
    for i, row in enumerate(rows):
        ledger.arrived(ItemResult("rows", i, [row]))
        kind = collector.add(row)
        if kind not in (None, "unissued"):
            ledger.decided(row, kind)
        kinds.append(kind)
    collector.close()
    write_manifest(out_dir, collector.manifest, ledger, pipeline="test", report=JobReport(sections))
    return kinds


def drive_calls(
    cfg: AmplifyRecipe,
    kept: dict[str, str],
    n: int,
    ledger: Any,
    *,
    reserve: tuple[float, int] = (0.0, 0),
) -> list[dict[str, Any]]:
    """Calls ``0..n-1`` of ``cfg``'s amplification chain (amplify, postprocess) through the
    one driver loop on in-process workers, with ``ledger``'s caps; the rows, in order."""
    from factory.engine.loop import Bar, Declaration, drive
    from factory.engine.pool import LocalPool
    from factory.engine.rows import Fate, Status
    from factory.engine.settings import amplify_settings, postprocess_settings
    from factory.engine.stages.amplify import build_amplify, seed_order
    from factory.engine.stages.postprocess import build_postprocess, seed_systems
    from factory.engine.work import Item, ItemResult

    class Calls:
        def __init__(self) -> None:
            self.issued = 0
            self.used = 0

        @property
        def finished(self) -> bool:
            return self.used == n

        stopped_by = None

        def issue(self, room: int, llm_room: int) -> list[Item]:
            k = min(room, llm_room, n - self.issued)
            out = [
                Item("calls", i, "calls", {"call_index": i}, llm=True)
                for i in range(self.issued, self.issued + k)
            ]
            self.issued += k
            return out

        def wanted(self, result: ItemResult) -> bool:
            return True

        def observe(self, result: ItemResult) -> None:
            self.used += 1

        def bars(self) -> list[Bar]:
            return []

    rows: list[dict[str, Any]] = []

    class Keep:
        stop_reason = None

        def arrived(self, result: ItemResult) -> None:
            pass

        def add(self, row: dict[str, Any], stream: str) -> Fate:
            rows.append(row)
            return Fate.ACCEPTED if row["status"] == Status.OK else Fate.REJECTED

    order = seed_order(list(kept), cfg.amplify.seed)
    domain = load_domain(cfg.domain)  # once, as the job does: the specs carry it
    chain = [
        (build_amplify, (stage_settings(cfg), amplify_settings(cfg), domain, kept, order)),
        (build_postprocess, (postprocess_settings(cfg), domain, seed_systems(domain, kept))),
    ]
    pool = LocalPool({"calls": chain}, workers=1, capacity=max(1, n))
    try:
        drive(Declaration("calls", {}, Calls(), Keep(), reserve=reserve), pool, ledger, poll_s=0.05)
    finally:
        pool.close()
    return rows


def free_port_range(n: int) -> int:
    """The first of ``n`` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        first = free_port()
        if first + n > 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", first))
                b.bind(("127.0.0.1", first + n - 1))
            return first
        except OSError:
            continue
    raise RuntimeError("no free port range")


def ray_log_files() -> list[Path]:
    """Every file of the Ray sessions' logs under ``$RAY_TMPDIR`` (workers' stdout and
    stderr, raylet, GCS): where the secret scans look for a credential."""
    root = Path(os.environ.get("RAY_TMPDIR", "/tmp/ray"))
    return [p for logs in root.glob("session_*/logs") for p in logs.rglob("*") if p.is_file()]
