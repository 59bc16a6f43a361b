"""A row waiting to retry lends its concurrency slot (issue 8: under a fault storm half
of an actor's slots were held by rows asleep in a backoff)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from factory.engine.stages import llm_stage
from factory.engine.stages.llm_stage import _ROW_SLOT, _Slot, wait_without_slot
from factory.recipe import load_recipe
from tests.conftest import ROOT


def test_a_waiting_row_lends_its_slot_and_takes_one_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> list[str]:
        semaphore = asyncio.Semaphore(1)
        wake = asyncio.Event()
        events: list[str] = []

        async def sleep(_delay: float) -> None:  # the backoff, held open by the test
            events.append("asleep")
            await wake.wait()

        monkeypatch.setattr(llm_stage.watchdog, "sleep", sleep)

        async def waiting_row() -> None:
            slot = _Slot(semaphore)
            _ROW_SLOT.set(slot)
            await slot.take()
            await wait_without_slot(1.0)
            events.append(f"retrying, slot held: {slot.held}")
            slot.give_back()

        async def other_row() -> None:
            async with semaphore:  # gets the only slot while the first row sleeps
                events.append("other row sent")
                wake.set()
                await asyncio.sleep(0)
            events.append("other row done")

        first = asyncio.create_task(waiting_row())
        while "asleep" not in events:
            await asyncio.sleep(0)
        await asyncio.wait_for(other_row(), timeout=10)
        await asyncio.wait_for(first, timeout=10)
        assert semaphore._value == 1  # every slot given back exactly once
        return events

    events = asyncio.run(scenario())
    assert events == ["asleep", "other row sent", "other row done", "retrying, slot held: True"]


def test_outside_a_row_it_is_a_plain_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(llm_stage.watchdog, "sleep", sleep)
    asyncio.run(wait_without_slot(0.5))
    assert slept == [0.5]


def test_a_cancelled_wait_never_gives_a_slot_back_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> int:
        semaphore = asyncio.Semaphore(1)
        asleep = asyncio.Event()

        async def sleep(_delay: float) -> None:
            asleep.set()
            await asyncio.Event().wait()  # never wakes: cancelled by the test

        monkeypatch.setattr(llm_stage.watchdog, "sleep", sleep)

        async def row() -> None:
            slot = _Slot(semaphore)
            _ROW_SLOT.set(slot)
            await slot.take()
            try:
                await wait_without_slot(1.0)
            finally:
                slot.give_back()

        task = asyncio.create_task(row())
        await asyncio.wait_for(asleep.wait(), timeout=10)
        await semaphore.acquire()  # another row takes the lent slot
        task.cancel()  # the run stops: the row, cancelled asleep, waits to take a slot back
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()  # ... and is cancelled again while it waits
        with pytest.raises(asyncio.CancelledError):
            await task
        semaphore.release()
        return semaphore._value

    assert asyncio.run(scenario()) == 1


def test_request_ids_are_stable_and_change_only_with_their_template(tmp_path) -> None:
    import shutil

    from factory.core.formats import parse_record
    from factory.engine.prompts import PromptTemplate
    from factory.engine.stages.llm_stage import request_id
    from factory.envs.pack import load_domain

    cfg = load_recipe(ROOT / "pipelines/airline.yaml")
    domain = load_domain(cfg.domain)
    seed = parse_record(
        __import__("json").loads((ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[0]),
        source="s:0",
    )

    def ids(folder) -> tuple[str, str]:
        amp = PromptTemplate(folder / "amplify.j2", domain).render(seed, variation=3)
        judge = PromptTemplate(folder / "prefilter.j2", domain).render(seed)
        return (
            request_id("amplify", "m", {"t": 1}, amp.messages, seed=seed.id, variation=3),
            request_id("prefilter", "m", {"t": 1}, judge.messages, seed=seed.id),
        )

    shutil.copy(ROOT / "prompts/amplify.j2", tmp_path / "amplify.j2")
    shutil.copy(ROOT / "prompts/prefilter.j2", tmp_path / "prefilter.j2")
    first = ids(tmp_path)
    assert ids(tmp_path) == first  # same content, same ids
    text = (tmp_path / "amplify.j2").read_text().replace("ONE new", "one new")
    (tmp_path / "amplify.j2").write_text(text)
    changed = ids(tmp_path)
    assert changed[0] != first[0] and changed[1] == first[1]  # only the amplify ids moved


def test_a_row_waiting_to_retry_gives_up_as_soon_as_the_run_stops() -> None:
    """A request asleep in a backoff (or waiting for a circuit breaker) does not wait out
    its deadline once the driver stops issuing: it wakes and ends ``unissued``."""
    import time

    from factory.engine.stages.llm_stage import _ROW_HALT, Halt, _pause
    from factory.errors import LLMUnavailable

    async def scenario() -> tuple[float, BaseException | None]:
        stopped: list[str] = []
        event = asyncio.Event()
        _ROW_HALT.set(Halt(event, lambda: stopped[0] if stopped else None))
        task = asyncio.ensure_future(_pause(60.0))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        stopped.append("unreachable")
        event.set()
        try:
            await task
        except LLMUnavailable as exc:
            return time.monotonic() - started, exc
        return time.monotonic() - started, None

    took, error = asyncio.run(scenario())
    assert isinstance(error, LLMUnavailable) and "unreachable" in str(error)
    assert took < 5.0


def test_without_a_stop_a_pause_is_the_backoff() -> None:
    from factory.engine.stages.llm_stage import _ROW_HALT, Halt, _pause

    async def scenario() -> None:
        _ROW_HALT.set(Halt(asyncio.Event(), lambda: None))
        await _pause(0.01)  # sleeps and returns: nothing stopped

    asyncio.run(scenario())


def test_a_hurried_row_waits_only_what_the_server_asked_for() -> None:
    """The driver hurries the row that later rows wait for: its backoff's jitter goes,
    a server's ``Retry-After`` (``must_wait``) stays; an unhurried row waits it all."""
    import time

    from factory.engine.stages.base import HURRY
    from factory.engine.stages.llm_stage import _ROW_HALT, HURRIED_RETRY_S, Halt, _pause
    from factory.llm.retry import must_wait

    async def pause(delay: float, server_wait: float, hurry_after: float | None) -> float:
        _ROW_HALT.set(Halt(asyncio.Event(), lambda: None))
        hurry = asyncio.Event()
        HURRY.set(hurry)
        started = time.monotonic()
        with must_wait(server_wait):
            task = asyncio.ensure_future(_pause(delay))
            if hurry_after is not None:
                await asyncio.sleep(hurry_after)
                hurry.set()
            await asyncio.wait_for(task, timeout=30.0)  # a 60 s backoff must not run out
        return time.monotonic() - started

    assert asyncio.run(pause(60.0, 0.0, hurry_after=0.05)) < 30.0  # cut when hurried
    assert asyncio.run(pause(0.3, 0.0, hurry_after=None)) >= 0.3  # not hurried: all of it
    # hurried before the wait and mid-wait: what the server asked for is still waited
    assert asyncio.run(pause(60.0, 0.4, hurry_after=0.0)) >= 0.4
    assert asyncio.run(pause(60.0, 0.4, hurry_after=0.1)) >= 0.4
    assert HURRIED_RETRY_S < 0.4


def test_a_hurried_row_still_gives_up_when_the_run_stops() -> None:
    from factory.engine.stages.base import HURRY
    from factory.engine.stages.llm_stage import _ROW_HALT, Halt, _pause
    from factory.errors import LLMUnavailable
    from factory.llm.retry import must_wait

    async def scenario() -> None:
        stop = asyncio.Event()
        _ROW_HALT.set(Halt(stop, lambda: "max_cost_usd" if stop.is_set() else None))
        hurry = asyncio.Event()
        hurry.set()
        HURRY.set(hurry)
        with must_wait(60.0):  # the server asked for a minute: hurried, it still waits
            task = asyncio.ensure_future(_pause(60.0))
        await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=30.0)

    with pytest.raises(LLMUnavailable, match="max_cost_usd"):
        asyncio.run(scenario())


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "static ✓ \u2028 block"}, {"role": "user", "content": "a"}],
        [{"content": "keys in any order", "role": "system"}, {"role": "user", "content": "b"}],
        [{"role": "system", "content": "s", "name": "x"}, {"role": "user", "content": "c"}],
        [{"role": "user", "content": "no system"}, {"role": "assistant", "content": "d"}],
        [{"role": "system", "content": "only one"}],
        [],
    ],
    ids=["system-first", "key-order", "extra-key", "no-system", "alone", "empty"],
)
def test_the_request_digest_is_the_hash_of_the_canonical_messages(
    messages: list[dict[str, str]],
) -> None:
    """The remembered system block must not change a single request id (the cache is
    keyed by them): the digest equals hashing the canonical JSON of all messages."""
    import hashlib

    from factory.core.trajectory import canonical_json
    from factory.engine.stages.llm_stage import messages_digest

    expected = hashlib.sha256(canonical_json(messages).encode()).hexdigest()
    assert messages_digest(messages) == expected
    assert messages_digest(messages) == expected  # remembered: the same again
    if messages and messages[0].get("role") == "system" and len(messages) > 1:
        other = [messages[0], {"role": "user", "content": "another call"}]
        assert messages_digest(other) == hashlib.sha256(canonical_json(other).encode()).hexdigest()


def test_a_reference_renders_once_per_template_and_the_same_every_time() -> None:
    from factory.core.trajectory import Trajectory, Turn
    from factory.engine.prompts import PromptTemplate
    from factory.envs.pack import load_domain

    cfg = load_recipe(ROOT / "pipelines/airline.yaml")
    template = PromptTemplate(ROOT / "prompts/amplify.j2", load_domain(cfg.domain))
    ref = Trajectory(turns=[Turn(role="user", content="hi \u2028 there")])
    calls: list[int] = []
    shown = template.output_form

    def counting(reference: Trajectory) -> Any:
        calls.append(1)
        return shown(reference)

    template.output_form = counting  # type: ignore[method-assign]
    first = template.reference_json(ref)
    assert template.reference_json(ref) == first and len(calls) == 1
    assert "\\u2028" in first and "\u2028" not in first
    twin = Trajectory(turns=[Turn(role="user", content="hi \u2028 there")])
    assert template.reference_json(twin) == first and len(calls) == 2  # by object, not value
