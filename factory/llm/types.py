"""The LLM layer's wire-neutral edge: a request, a completion and its token usage.

Why: the stages, the ledger, the cache, pricing and the report used to read OpenAI's
wire shape (its response's choice list and usage keys) wherever they touched an answer, so a
provider with another wire format had to impersonate the OpenAI SDK (issue 34, point
5). Now a backend (``factory.llm.backends``) maps its provider's wire shape to these
types in one place, and everything above reads them: ``Usage.input``, never a
provider's key. Only backends make a :class:`Completion` or a :class:`Usage` from a
provider's answer (the response cache rebuilds the ones it stored).

Token counts follow one convention whatever the provider reports:

- ``input`` is every input token, cached and cache-written ones included (what OpenAI
  counts as the prompt's; Anthropic reports them apart and its backend adds them up);
- ``cached_input`` and ``cache_write`` are parts of ``input`` (read from, written to the
  provider's prompt cache), priced at their own rates where the price table has them;
- ``output`` is every output token, hidden reasoning included (billed as output);
  ``reasoning`` is the part of it that was reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Completion",
    "Message",
    "RateLimits",
    "Request",
    "Role",
    "Tool",
    "ToolCall",
    "Usage",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one or more completions used (see the module docstring for what each
    counts). Usages add: ``a + b`` is what two answers to one request cost together."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.input + other.input,
            self.cached_input + other.cached_input,
            self.cache_write + other.cache_write,
            self.output + other.output,
            self.reasoning + other.reasoning,
        )

    @property
    def total(self) -> int:
        """Input and output tokens together (what a ``max_tokens`` cap counts)."""
        return self.input + self.output

    @property
    def uncached_input(self) -> int:
        """Input tokens billed at the full input rate (neither read from nor written to a
        cache)."""
        return max(self.input - self.cached_input - self.cache_write, 0)

    def as_dict(self) -> dict[str, int]:
        """The five counts by field name (the response cache stores this form)."""
        return {
            "input": self.input,
            "cached_input": self.cached_input,
            "cache_write": self.cache_write,
            "output": self.output,
            "reasoning": self.reasoning,
        }

    @classmethod
    def from_dict(cls, counts: Mapping[str, Any]) -> Usage:
        """The inverse of :meth:`as_dict` (a missing count is 0)."""
        return cls(*(int(counts.get(name) or 0) for name in _FIELDS))


_FIELDS = ("input", "cached_input", "cache_write", "output", "reasoning")


@dataclass(frozen=True, slots=True)
class RateLimits:
    """What a provider said, with an answer, about its rate-limit budget (issue 35, point 5).

    Wire-neutral: each backend reads its provider's headers (OpenAI's
    ``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``) into this, and the client's
    pacer reads only this. ``None`` means the provider did not say (a vLLM server sends
    no budget: the adaptive limiter alone then paces). Reset times are seconds from when
    the answer arrived until the budget is full again (a provider's absolute time or a
    duration such as ``6m0s`` is converted by its backend).
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_s: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float | None = None

    @property
    def known(self) -> bool:
        """Whether the provider said anything about its budget."""
        return self.requests_remaining is not None or self.tokens_remaining is not None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call an assistant message makes: ``arguments`` is the JSON text the model
    wrote (not parsed: a malformed call is the row's to reject, not the backend's)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool offered to the model: its name, description and JSON schema of parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message in the factory's own model.

    Attributes:
        role: who speaks; ``tool`` carries a tool's result for ``tool_call_id``.
        content: the text.
        tool_calls: the calls an assistant message makes.
        tool_call_id: the call a ``tool`` message answers.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @classmethod
    def of(cls, message: Message | Mapping[str, Any]) -> Message:
        """A message from the ``{"role", "content"}`` mapping the factory's prompts render
        (``tool_call_id``, and ``tool_calls`` as ``ToolCall``s, when present)."""
        if isinstance(message, Message):
            return message
        calls = message.get("tool_calls")
        return cls(
            message["role"],
            message["content"],
            tuple(calls) if calls else (),
            message.get("tool_call_id"),
        )


@dataclass(frozen=True, slots=True)
class Request:
    """One completion to make.

    Attributes:
        request_id: content-derived id (``factory.engine.stages.llm_stage.request_id``):
            the cache key, a batch's ``custom_id``, the ``X-Client-Request-Id`` header.
        messages: the conversation so far.
        tools: tools offered to the model (none: the prompt describes them in text).
        sampling: the recipe's sampling options for this request, or None: the backend's
            own (``llm.sampling``), mapped per model family by the backend.
        static_prefix: how many leading messages are the same for every request of the
            stage (the domain's policy, tools and instructions): a provider may cache
            them (Anthropic's ``cache_control`` marks the last of them).
    """

    request_id: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    sampling: Mapping[str, Any] | None = None
    static_prefix: int = 0

    @classmethod
    def of(
        cls,
        request_id: str,
        messages: Sequence[Message | Mapping[str, Any]],
        *,
        sampling: Mapping[str, Any] | None = None,
        static_prefix: int = 0,
    ) -> Request:
        """A request of rendered messages (``Message.of`` each)."""
        return cls(
            request_id,
            tuple(Message.of(m) for m in messages),
            sampling=sampling,
            static_prefix=static_prefix,
        )

    @property
    def static(self) -> tuple[Message, ...]:
        """The messages every request of the stage starts with."""
        return self.messages[: self.static_prefix]


@dataclass(frozen=True)
class Completion:
    """One successful completion, whatever the provider.

    Attributes:
        text: the assistant message content ("" when the model returned none).
        reasoning: reasoning text when the server returns it (vLLM / SGLang
            ``reasoning_content``, an Anthropic thinking block), else ``None``.
        usage: the tokens it used (two answers of a hedge: both).
        cost_usd: priced with the backend's ``Price``; 0.0 for unpriced models.
        endpoint: name of the endpoint that answered.
        attempts: attempts used, the successful one included.
        latency_s: wall time of the request (queueing and backoff included).
        model: the model id the server reports.
        system_fingerprint: backend configuration id, when the server sends one.
        finish_reason: ``stop``, ``length`` ... (``length`` means truncated output),
            in OpenAI's words (a backend maps its provider's stop reasons to them).
        retries: retried attempts of this request by reason (``llm_rate_limited`` ...).
        tool_calls: the tool calls the answer makes (native tool use), else empty.
        rate_limits: the provider's rate-limit budget as its answer's headers stated it
            (``None``: it stated none).
    """

    text: str
    reasoning: str | None
    usage: Usage
    cost_usd: float
    endpoint: str
    attempts: int
    latency_s: float
    model: str
    system_fingerprint: str | None
    finish_reason: str | None = None
    retries: Mapping[str, int] = field(default_factory=dict)
    tool_calls: tuple[ToolCall, ...] = ()
    rate_limits: RateLimits | None = None
