"""The gateway: one long-lived Ray Data execution per run, fed by every worker's requests.

Why an actor between the workers and Ray Data: a Ray Data LLM processor is a
``Dataset -> Dataset`` transformation whose engines live as long as one execution, and
the factory's LLM stages run in many worker actors, one request at a time. So a small
async actor, named after the run's output folder and the processor (the first worker to
need it creates it, ``get_if_exists=True``; the others find it), owns a request queue
and runs ``processor(ray.data.read_datasource(GatewaySource))`` once, in a thread: the
source's single read task pulls waiting requests from the gateway until it is closed,
and the thread consumes the processor's output rows as they come, resolving each
caller's future. A vLLM engine therefore loads its weights once per run and serves the
judge and the synthesis stage alike when they name the same model.

Streaming, not rounds: the gateway's Ray Data context emits every block at once
(``target_max_block_size`` of one byte: Ray otherwise holds a task's output until
128 MiB or the task's end) and does not preserve order. A pull returns a multiple of
the processor's batch size, padded with filler rows (``processors.filler_payload``),
because Ray bundles a batch only once it has ``batch_size`` rows: a last odd request
would otherwise wait forever.

The gateway is owned by the worker that created it, so it ends with that worker (the
end of the run, or the driver's death: the workers exit then). A worker that finds it
dead (its owner crashed) creates another one, which starts a new execution.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections import deque
from typing import Any

from factory.llm.backends.ray_data.processors import (
    TOKEN,
    ProcessorSpec,
    build_processor,
    filler_payload,
    processor_row,
    read_output,
)
from factory.llm.backends.ray_data.session import envelope

__all__ = ["Gateway", "GatewaySource", "pad"]

log = logging.getLogger(__name__)

PULL_WAIT_S = 0.5  # a pull with nothing to send returns after this long (the read loops)


def pad(rows: list[dict[str, Any]], batch_size: int, filler: str) -> list[dict[str, Any]]:
    """``rows`` padded with filler rows (token -1) to a multiple of ``batch_size`` (pure)."""
    missing = -len(rows) % batch_size
    return rows + [{TOKEN: -1, "payload": filler} for _ in range(missing)]


class Gateway:
    """The Ray actor (async): ``call`` a request, get its envelope when the processor is
    done with it. The read task of ``GatewaySource`` calls ``pull``."""

    def __init__(self, spec: ProcessorSpec, linger_s: float = 0.002):
        self._spec = spec
        self._linger_s = linger_s
        self._filler = filler_payload(spec.kind)
        self._queue: deque[tuple[int, str]] = deque()
        self._waiting: dict[int, asyncio.Future[str]] = {}
        self._arrived = asyncio.Event()
        self._next = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def call(self, payload: str) -> str:
        """The envelope of one request (``session.envelope``'s format)."""
        self._loop = asyncio.get_running_loop()
        self._start()
        token = self._next
        self._next += 1
        future = self._loop.create_future()
        self._waiting[token] = future
        self._queue.append((token, payload))
        self._arrived.set()
        try:
            return await future
        finally:  # answered, or the caller gave up (a cancelled call is never sent)
            self._waiting.pop(token, None)

    async def ready(self) -> str:
        """Start the execution if it is not running, and return once a filler row went
        through it (its actors started, a vLLM engine loaded): "" then, else the reason
        it failed. Callers wait for this before their first request, outside the
        request's deadline: an engine may take minutes to load."""
        answer = json.loads(await self.call(self._filler))
        error = answer.get("error")
        return str(error.get("message") or "failed") if error else ""

    async def pull(self) -> list[dict[str, Any]] | None:
        """The requests waiting now (a multiple of the batch size, padded), [] after
        ``PULL_WAIT_S`` with none, or None once the gateway is closed."""
        if self._closed:
            return None
        if not self._queue:
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), PULL_WAIT_S)
        if self._queue and self._linger_s > 0:
            await asyncio.sleep(self._linger_s)  # let the requests of one burst go together
        rows = []
        while self._queue:
            token, payload = self._queue.popleft()
            if token in self._waiting:  # its caller may have given up meanwhile
                rows.append({TOKEN: token, "payload": payload})
        if not rows:
            return []
        return pad(rows, self._spec.batch_size, self._filler)

    def close(self) -> None:
        """Let the read task end (the execution drains and stops)."""
        self._closed = True

    # -- the execution ---------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="ray-data-gateway", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import ray

        try:
            ctx = ray.data.DataContext.get_current()
            ctx.target_max_block_size = 1  # hand every block on at once
            ctx.execution_options.preserve_order = False
            ctx.enable_progress_bars = False
            ctx.print_on_execution_start = False
            # The read task runs for the whole execution; with per-operator reservations
            # it holds the CPU budget and the LLM stage gets none for a second task.
            ctx.op_resource_reservation_enabled = False
            # A task may yield 2 blocks ahead of the executor by default: the read (and
            # each LLM task) then waits on the executor's loop for every row (measured:
            # 19 calls/s against 67 without the cap, C = 64, L = 200 ms).
            ctx._max_num_blocks_in_streaming_gen_buffer = None
            me = ray.get_runtime_context().current_actor
            source = GatewaySource(me, self._spec.kind)
            data = ray.data.read_datasource(source, override_num_blocks=1, num_cpus=0.01)
            processor = build_processor(self._spec)
            column = processor.DATA_COLUMN
            for stage in processor.stages.values():  # Processor.__call__ less its row maps
                kwargs = stage.get_dataset_map_batches_kwargs(
                    batch_size=self._spec.batch_size, data_column=column
                )
                data = data.map_batches_internal(stage.fn, **kwargs)
            # prefetch_batches=0: with prefetching, a block is handed over only once the
            # next one exists, which at the end of a burst never comes.
            for batch in data.iter_batches(
                batch_size=None, batch_format="pyarrow", prefetch_batches=0
            ):
                for row in batch.column(column).to_pylist():
                    token, answer = read_output(row, self._spec.model)
                    if token >= 0:
                        self._deliver(token, answer)
            why = "the Ray Data execution ended"
        except Exception as exc:  # the whole execution failed: every waiting call hears it
            log.exception("the Ray Data execution failed")
            why = f"the Ray Data execution failed: {type(exc).__name__}: {exc}"
        if not self._closed:
            failure = envelope(error=("processor", why[:500]))
            for token in list(self._waiting):
                self._deliver(token, failure)

    def _deliver(self, token: int, answer: str) -> None:
        loop = self._loop
        if loop is None:
            return

        def resolve() -> None:
            future = self._waiting.get(token)
            if future is not None and not future.done():
                future.set_result(answer)

        loop.call_soon_threadsafe(resolve)


class GatewaySource:
    """A Ray Data datasource whose one read task pulls the gateway's requests until it is
    closed, yielding each pull as one block (built lazily: Ray Data is imported in the
    gateway only)."""

    def __new__(cls, gateway: Any, kind: str) -> Any:
        from ray.data.datasource import Datasource

        class _Source(Datasource):
            def get_read_tasks(
                self,
                parallelism: int,
                per_task_row_limit: int | None = None,
                data_context: Any = None,
            ) -> list[Any]:
                from ray.data.block import BlockMetadata
                from ray.data.datasource import ReadTask

                meta = BlockMetadata(
                    num_rows=None, size_bytes=None, exec_stats=None, input_files=None
                )
                return [ReadTask(lambda: _read(gateway, kind), meta)]

            def estimate_inmemory_data_size(self) -> int | None:
                return None

            def get_name(self) -> str:
                return "FactoryRequests"

        return _Source()


def _read(gateway: Any, kind: str) -> Any:
    import pyarrow as pa
    import ray

    while True:
        rows = ray.get(gateway.pull.remote())
        if rows is None:
            return
        if rows:
            column = [processor_row(kind, r[TOKEN], r["payload"]) for r in rows]
            yield pa.Table.from_pylist([{"__data": row} for row in column])
