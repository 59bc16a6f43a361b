"""Chat-completions request parameters per model family.

OpenAI's reasoning models (the o-series and gpt-5) take a different parameter
set from the chat models and open models served by vLLM / SGLang:

* they need ``max_completion_tokens`` (``max_tokens`` is rejected: "Unsupported
  parameter: 'max_tokens' is not supported with this model. Use
  'max_completion_tokens' instead."), which also bounds the hidden reasoning
  tokens;
* they accept ``reasoning_effort`` (minimal / low / medium / high);
* ``temperature`` is accepted only at its default 1 ("Only the default (1) value
  is supported"), and ``top_p`` is rejected.

A recipe is written once and may be pointed at either family, so options the
target rejects are dropped and *reported* (``RequestParams.dropped``) instead of
turning every request into a 400. A key no family knows is a recipe typo and
raises ``ConfigError``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from factory.errors import ConfigError, short

__all__ = [
    "REASONING_EFFORTS",
    "SAMPLING_KEYS",
    "RequestParams",
    "build_request",
    "model_family",
    "resolve_params",
]

log = logging.getLogger(__name__)

Family = Literal["reasoning", "standard"]

REASONING_EFFORTS = ("minimal", "low", "medium", "high")

# Every key a recipe's ``llm.sampling`` may hold; ``max_completion_tokens`` is an
# alias of ``max_tokens`` so a recipe written for one family reads naturally.
SAMPLING_KEYS = (
    "max_completion_tokens",
    "max_tokens",
    "reasoning_effort",
    "seed",
    "temperature",
    "top_p",
)

_KEY_PATH = "llm.sampling"

# o1, o1-mini, o3, o3-pro, o4-mini, ... and gpt-5, gpt-5-mini, gpt-5.1 ...; a
# provider prefix ("openai/o3") is allowed. gpt-5-chat* is the non-reasoning chat
# model and takes the standard parameters.
_REASONING_RE = re.compile(r"^(?:[\w.-]+/)?(?:o\d+(?:[-.].*)?|gpt-5(?!-chat)(?:[-.].*)?)$", re.I)
# Open reasoning models on vLLM that honour reasoning_effort alongside sampling.
_EFFORT_AWARE_OPEN_RE = re.compile(r"gpt-oss", re.I)


def model_family(model: str) -> Family:
    """``"reasoning"`` for OpenAI o-series / gpt-5 models, else ``"standard"``."""
    return "reasoning" if _REASONING_RE.match(model.strip()) else "standard"


@dataclass(frozen=True)
class RequestParams:
    """Resolved sampling parameters for one model.

    Attributes:
        family: the parameter family the model belongs to.
        params: keyword arguments for ``chat.completions.create`` (no model/messages).
        dropped: recipe keys left out for this model, mapped to why.
    """

    family: Family
    params: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)


def _number(key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(
            f"expected a number, got {short(value, 40)}", key_path=f"{_KEY_PATH}.{key}"
        )
    if value > hi or value < lo or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise ConfigError(f"{value} is outside {bound}", key_path=f"{_KEY_PATH}.{key}")
    return float(value)


def _integer(key: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"expected an integer, got {short(value, 40)}", key_path=f"{_KEY_PATH}.{key}"
        )
    if value < minimum:
        raise ConfigError(f"must be at least {minimum}, got {value}", key_path=f"{_KEY_PATH}.{key}")
    return value


def _validate(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Type- and range-check every key; unknown keys are a ConfigError naming the key."""
    for key in sampling:
        if key not in SAMPLING_KEYS:
            raise ConfigError(
                f"unknown sampling option {key!r}; expected one of {', '.join(SAMPLING_KEYS)}",
                key_path=f"{_KEY_PATH}.{key}",
            )
    if "max_tokens" in sampling and "max_completion_tokens" in sampling:
        raise ConfigError(
            "give max_tokens or max_completion_tokens, not both (they mean the same here)",
            key_path=f"{_KEY_PATH}.max_completion_tokens",
        )
    out: dict[str, Any] = {}
    for key, value in sampling.items():
        if value is None:  # an explicit null means "server default"
            continue
        if key == "temperature":
            out[key] = _number(key, value, 0.0, 2.0)
        elif key == "top_p":
            out[key] = _number(key, value, 0.0, 1.0, lo_open=True)
        elif key in ("max_tokens", "max_completion_tokens"):
            out["max_tokens"] = _integer(key, value, minimum=1)
        elif key == "seed":
            out[key] = _integer(key, value, minimum=-(2**63))
        elif key == "reasoning_effort":
            if value not in REASONING_EFFORTS:
                raise ConfigError(
                    f"{short(value, 40)} is not one of {', '.join(REASONING_EFFORTS)}",
                    key_path=f"{_KEY_PATH}.{key}",
                )
            out[key] = value
    return out


def resolve_params(model: str, sampling: Mapping[str, Any]) -> RequestParams:
    """Map recipe sampling options onto the parameters ``model`` accepts.

    Args:
        model: model id as sent to the server (``gpt-5-mini``, ``o4-mini``, ``Qwen/Qwen3-8B``).
        sampling: the recipe's ``llm.sampling`` mapping.

    Returns:
        The family, the request keyword arguments, and the dropped keys with reasons.

    Raises:
        ConfigError: an unknown key, a wrong type or an out-of-range value.
    """
    if not model or not model.strip():
        raise ConfigError("model id is empty", key_path="llm.model")
    opts = _validate(sampling)
    family = model_family(model)
    params: dict[str, Any] = {}
    dropped: dict[str, str] = {}
    if family == "reasoning":
        for key, value in opts.items():
            if key == "max_tokens":
                params["max_completion_tokens"] = value
            elif key == "reasoning_effort":
                params[key] = value
            elif key == "temperature":
                if value == 1.0:
                    params[key] = 1
                else:
                    dropped[key] = f"{model} accepts only the default temperature 1"
            elif key == "top_p":
                dropped[key] = f"{model} does not accept top_p"
            elif key == "seed":
                dropped[key] = f"{model} does not take a sampling seed"
    else:
        for key, value in opts.items():
            if key == "reasoning_effort" and not _EFFORT_AWARE_OPEN_RE.search(model):
                dropped[key] = f"{model} is not a reasoning model"
            else:
                params[key] = value
    return RequestParams(family=family, params=params, dropped=dropped)


_warned: set[tuple[str, str]] = set()


def build_request(model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> dict:
    """Keyword arguments for ``chat.completions.create`` for this model family.

    Dropped options are logged once per (model, key); callers that must record
    them (the run manifest) use ``resolve_params`` and read ``dropped``.

    Args:
        model: model id as sent to the server.
        messages: OpenAI chat messages.
        sampling: the recipe's ``llm.sampling`` mapping.

    Returns:
        ``{"model": ..., "messages": ..., <family parameters>}``.

    Raises:
        ConfigError: an unknown sampling key or an invalid value.
    """
    resolved = resolve_params(model, sampling)
    for key, why in resolved.dropped.items():
        if (model, key) not in _warned:
            _warned.add((model, key))
            log.warning("sampling option %s dropped: %s", key, why)
    return {"model": model, "messages": messages, **resolved.params}
