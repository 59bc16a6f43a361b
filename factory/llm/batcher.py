"""Feeding a batched backend: the requests of an actor's rows, sent in one ``run``.

Why: a batch API (or an in-process engine) is worth using only with many
requests per call, but the LLM stages render and record one row at a time. The
batcher sits between: each row submits its request and waits; once every row
the actor is working on is waiting for the backend (nothing more can arrive
before an answer does), the requests not yet sent go to ``backend.run`` in one
call, and each row gets its result as the backend yields it. A later request
of a row (the judge asked again) joins the next call. The rule needs no timer,
so a test sees the same calls on every run.

Online backends do not use it: the engine sends their requests one by one,
each inside a concurrency slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from factory.errors import LLMServerError
from factory.llm.backends.base import LLMResult

if TYPE_CHECKING:
    from factory.llm.backends.base import Backend, LLMRequest

__all__ = ["Batcher"]


class Batcher:
    """Collects requests for one batched backend (one per stage, in one event loop).

    Args:
        backend: a backend with ``batched = True``.
    """

    def __init__(self, backend: Backend):
        self._backend = backend
        self._active = 0  # rows at work in this stage
        self._blocked = 0  # rows waiting for a result (queued or sent)
        self._queue: list[LLMRequest] = []
        self._futures: dict[str, list[asyncio.Future[LLMResult]]] = {}
        self._runs: set[asyncio.Task[None]] = set()
        self.calls = 0  # ``run`` calls made, for tests and stats

    def enter(self, rows: int) -> None:
        """``rows`` more rows are at work (the stage started a batch)."""
        self._active += rows

    def leave(self) -> None:
        """A row is done with the backend; the rest may now all be waiting."""
        self._active -= 1
        self._maybe_send()

    async def submit(self, request: LLMRequest) -> LLMResult:
        """The result of ``request``, sent with every other request waiting by then."""
        future: asyncio.Future[LLMResult] = asyncio.get_running_loop().create_future()
        same = self._futures.setdefault(request.request_id, [])
        if not same:
            self._queue.append(request)
        same.append(future)
        self._blocked += 1
        try:
            self._maybe_send()
            return await future
        except BaseException:
            if not future.done():  # cancelled while waiting: no longer blocked
                future.cancel()
                self._blocked -= 1
            raise

    def _deliver(
        self, future: asyncio.Future[LLMResult], result: LLMResult | BaseException
    ) -> None:
        """Hand a row its result. It stops counting as blocked now, not when its task
        next runs: a row that asks again at once must wait for the others' next
        requests rather than go out alone."""
        if future.done():
            return
        if isinstance(result, asyncio.CancelledError):
            future.cancel()
        elif isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
        self._blocked -= 1

    def _maybe_send(self) -> None:
        if self._queue and self._blocked >= self._active:
            requests, self._queue = self._queue, []
            futures = {r.request_id: self._futures.pop(r.request_id) for r in requests}
            task = asyncio.ensure_future(self._run(requests, futures))
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)

    async def _run(
        self, requests: list[LLMRequest], futures: dict[str, list[asyncio.Future[LLMResult]]]
    ) -> None:
        self.calls += 1
        try:
            async for result in self._backend.run(requests):
                for future in futures.pop(result.request_id, []):
                    self._deliver(future, result)
        except BaseException as exc:  # a bug (or cancellation): every waiting row sees it
            for waiting in futures.values():
                for future in waiting:
                    self._deliver(future, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for rid, waiting in futures.items():  # the backend broke its contract for these
            err = LLMServerError(
                f"backend {type(self._backend).__name__} returned no result for this request",
                row_id=rid,
            )
            for future in waiting:
                self._deliver(future, LLMResult(rid, error=err))

    async def aclose(self) -> None:
        """Cancel the runs still going (their rows are cancelled with them)."""
        for task in list(self._runs):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
