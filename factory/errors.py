"""The one exception hierarchy of the factory.

Every error the factory raises on purpose is a ``FactoryError``; a caller that
wants "anything the factory decided to refuse" catches that one class. The
tree (kept in step with the classes below)::

    FactoryError
    ├── ConfigError                 recipe/CLI problem; .key_path names the field
    ├── SeedError                   one seed cannot become a trajectory; .reason code
    │   └── SeedFormatError         unreadable bytes, unknown layout, bad roles ...
    ├── RepairError                 JSON could not be recovered without guessing
    ├── ValidationError             a trajectory breaks a rule; .issues lists them
    ├── LLMError                    transport or model failure, after translation
    │   ├── LLMTimeout              request timed out (retryable)
    │   ├── LLMRateLimited          429; .retry_after seconds if the server said
    │   ├── LLMServerError          5xx / connection problems (retryable)
    │   ├── LLMUnavailable          no endpoint took it before its deadline (never sent)
    │   └── LLMBadRequest           4xx other than 408/429 (not retryable)
    ├── BudgetExceeded              a cost / token / call cap was reached
    ├── OutputLocked                another run holds the output folder (.lock)
    ├── OutputWriteError            a file of the output or cache could not be written
    │   └── OutputDamaged           a finished folder's file is not what its manifest says
    ├── Interrupted                 Ctrl-C / SIGTERM, or a worker whose driver is gone
    ├── ServeError                  a pool replica (llm.serve) never became healthy
    ├── WorkersLost                 no worker of the run can run (lost, no room to start)
    ├── UnreachableError            a service (an LLM endpoint, the Hub) refused or failed
    └── EnvironmentError_           executable world refused an action (tool error)

Messages say what to do next and never carry a secret or a whole payload:
``short()`` truncates any input echoed into a message.

Exit codes of ``python -m factory.run`` are attached to the top-level classes
(``exit_code``) so the CLI maps errors to documented codes in one place.
"""

from __future__ import annotations

import errno
from typing import Any

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "EnvironmentError_",
    "FactoryError",
    "Interrupted",
    "LLMBadRequest",
    "LLMError",
    "LLMRateLimited",
    "LLMServerError",
    "LLMStopped",
    "LLMTimeout",
    "LLMUnavailable",
    "OutputDamaged",
    "OutputLocked",
    "OutputWriteError",
    "RepairError",
    "SeedError",
    "SeedFormatError",
    "ServeError",
    "UnreachableError",
    "ValidationError",
    "WorkersLost",
    "describe_os_error",
    "short",
]

# Documented in docs/cli.md ("Exit codes"; tests/test_docs.py checks the table).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_INPUT = 3
EXIT_BUDGET = 4
EXIT_INCOMPLETE = 5  # stopped before the target for another reason (no progress, calls failing)
EXIT_LOCKED = 6  # another run holds the output folder
EXIT_WRITE = 7  # an output or cache write failed (disk full, read-only): the message names the path
# an LLM endpoint (none answering before the run, or for llm.stall_s), or the Hub (push)
EXIT_UNREACHABLE = 8
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: the folder is left resumable


def short(value: Any, limit: int = 200) -> str:
    """Render ``value`` for an error message, truncated so payloads never flood logs."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        return text[:limit] + f"... [{len(text) - limit} more chars]"
    return text


class FactoryError(Exception):
    """Root of every error the factory raises on purpose."""

    exit_code = EXIT_INTERNAL
    reason = "error"
    details: tuple[str, ...] = ()  # lines the CLI prints under the one-line message

    def __init__(self, message: str, *, row_id: str | None = None, stage: str | None = None):
        super().__init__(message)
        self.row_id = row_id
        self.stage = stage

    def describe(self) -> str:
        """``Type: message`` as stored in the error fields of reject/failed rows."""
        return f"{type(self).__name__}: {self}"


class ConfigError(FactoryError):
    """The recipe or a CLI override is wrong; ``key_path`` names the field (``llm.model``)."""

    exit_code = EXIT_CONFIG
    reason = "config"

    def __init__(self, message: str, *, key_path: str = "", **kw: Any):
        prefix = f"{key_path}: " if key_path else ""
        super().__init__(prefix + message, **kw)
        self.key_path = key_path


class SeedError(FactoryError):
    """One seed record cannot be used; ``reason`` is a machine-readable code."""

    exit_code = EXIT_INPUT

    def __init__(self, reason: str, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.reason = reason


class SeedFormatError(SeedError):
    """The seed's bytes or layout cannot be read as any supported format."""


class RepairError(FactoryError):
    """Malformed JSON that cannot be recovered without changing its meaning."""

    def __init__(self, reason: str, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.reason = reason


class ValidationError(FactoryError):
    """A trajectory breaks one or more rules; ``issues`` holds them (first = reason)."""

    def __init__(self, issues: list[Any], **kw: Any):
        first = issues[0] if issues else None
        super().__init__(str(first) if first is not None else "invalid trajectory", **kw)
        self.issues = issues
        self.reason = getattr(first, "code", "invalid")


class LLMError(FactoryError):
    """An LLM call failed; subclasses say whether a retry can help."""

    retryable = False
    reason = "llm_error"

    def __init__(
        self, message: str, *, endpoint: str | None = None, status: int | None = None, **kw: Any
    ):
        super().__init__(message, **kw)
        self.endpoint = endpoint
        self.status = status


class LLMTimeout(LLMError):
    """The request did not complete within the configured timeout."""

    retryable = True
    reason = "llm_timeout"


class LLMRateLimited(LLMError):
    """HTTP 429; ``retry_after`` is the server's hint in seconds, if it gave one;
    ``rate_limits`` the budget the refusal stated (a ``factory.llm.types.RateLimits``),
    if it stated one: the client's pacer re-bases on it."""

    retryable = True
    reason = "llm_rate_limited"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        rate_limits: Any = None,
        **kw: Any,
    ):
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.rate_limits = rate_limits


class LLMServerError(LLMError):
    """5xx, 408, or a connection failure: the server may succeed on a retry."""

    retryable = True
    reason = "llm_server_error"


class LLMUnavailable(LLMError):
    """Every endpoint's breaker stayed open until the request's deadline: nothing was sent,
    so the row is ``unissued`` (a resume sends it), never ``failed``."""

    reason = "llm_unavailable"


class LLMStopped(LLMUnavailable):
    """The run stopped issuing calls (a cap, the target reached, an endpoint silent for
    ``llm.stall_s``, an interrupt) while this request waited for its next attempt: the
    row is ``unissued`` and a resume sends it, whatever its earlier attempts did. A row
    is ``failed`` only once its own retries are spent; these were cut by the run."""

    reason = "stopped"


class LLMBadRequest(LLMError):
    """A 4xx the server will repeat however often we ask (bad model name, bad key ...)."""

    reason = "llm_bad_request"


class BudgetExceeded(FactoryError):
    """A configured cap (``max_cost_usd``, ``max_tokens``, ``max_calls``) was reached."""

    exit_code = EXIT_BUDGET
    reason = "budget"

    def __init__(self, cap: str, message: str, **kw: Any):
        super().__init__(message, **kw)
        self.cap = cap


class Interrupted(FactoryError):
    """The run was stopped from outside (Ctrl-C, SIGTERM, its driver died); the output
    folder is left resumable."""

    exit_code = EXIT_INTERRUPTED
    reason = "interrupted"


class ServeError(FactoryError):
    """A replica of the run's own LLM pool (``llm.serve``) exited or stayed unhealthy
    while starting; the message names the replica and ends with its engine's last lines."""

    exit_code = EXIT_INCOMPLETE
    reason = "serve_failed"


class WorkersLost(FactoryError):
    """No worker of the run runs or can start: every one was lost and the run may make no
    new one (``ray.max_restarts``), or the cluster had no room for any for the pool's
    start timeout. The output folder is resumable."""

    exit_code = EXIT_INCOMPLETE
    reason = "workers_lost"


class UnreachableError(FactoryError):
    """A service the command needs could not be reached or refused it: an LLM endpoint
    nothing listens on, checked before Ray starts (``factory.preflight``), or the Hugging
    Face Hub during ``factory push`` (``factory.io.report.hub``). Nothing was started or
    published; the message names the service and what to check."""

    exit_code = EXIT_UNREACHABLE
    reason = "unreachable"


class EnvironmentError_(FactoryError):
    """An executable world refused an action; its text becomes an ``Error: ...`` observation."""

    reason = "env_error"


class OutputLocked(FactoryError):
    """Another live run holds the output folder's lock; nothing was touched."""

    exit_code = EXIT_LOCKED
    reason = "locked"


class OutputWriteError(FactoryError):
    """Writing a file of the output (shard, manifest, rejects) or of the cache failed.

    Why a class of its own: a full disk or a read-only mount is not a bug of the
    factory (exit 1 said "internal error" without the path); the message names the
    path and the OS error, and the folder stays resumable.
    """

    exit_code = EXIT_WRITE
    reason = "write_failed"

    def __init__(
        self, path: Any, error: BaseException | str, *, hint: str | None = None, **kw: Any
    ):
        self.path = str(path)
        detail = describe_os_error(error) if isinstance(error, BaseException) else error
        text = f"cannot write {self.path}: {detail}"
        text += (
            f"; {hint}"
            if hint
            else ("; free space (or fix the permissions) and run the same command again to resume")
        )
        super().__init__(text, **kw)


class OutputDamaged(OutputWriteError):
    """A file of a finished output folder is not what its manifest says (missing,
    damaged, other rows, unlisted): found before the folder is trusted."""

    reason = "output_damaged"

    def __init__(self, path: Any, problem: str, *, hint: str | None = None, **kw: Any):
        self.path = str(path)
        self.problem = problem
        text = f"{self.path}: {problem}" + (f"; {hint}" if hint else "")
        FactoryError.__init__(self, text, **kw)


def describe_os_error(error: BaseException) -> str:
    """``[Errno 28] No space left on device (ENOSPC)`` for an OSError, else ``Type: text``."""
    if isinstance(error, OSError) and error.errno is not None:
        name = errno.errorcode.get(error.errno, "")
        text = f"[Errno {error.errno}] {error.strerror or error}"
        return f"{text} ({name})" if name else text
    return f"{type(error).__name__}: {short(str(error), 300)}"
