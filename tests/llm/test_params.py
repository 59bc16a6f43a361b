from __future__ import annotations

import logging
from typing import Any

import pytest

from factory.errors import ConfigError
from factory.llm.params import build_request, model_family, resolve_params

MESSAGES = [{"role": "user", "content": "hi"}]
FULL = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512, "seed": 7}


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("gpt-5", "reasoning"),
        ("gpt-5-mini", "reasoning"),
        ("gpt-5-nano-2025-08-07", "reasoning"),
        ("gpt-5.1", "reasoning"),
        ("o1", "reasoning"),
        ("o1-mini", "reasoning"),
        ("o3", "reasoning"),
        ("o4-mini", "reasoning"),
        ("openai/o3-mini", "reasoning"),
        ("gpt-5-chat-latest", "standard"),
        ("gpt-4o", "standard"),
        ("gpt-4o-mini-2024-07-18", "standard"),
        ("gpt-4.1", "standard"),
        ("Qwen/Qwen3-8B", "standard"),
        ("meta-llama/Llama-3.1-8B-Instruct", "standard"),
        ("olmo-2", "standard"),
        ("openai/gpt-oss-20b", "standard"),
    ],
)
def test_model_family(model: str, family: str) -> None:
    assert model_family(model) == family


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "o1", "o3", "o4-mini"])
def test_reasoning_models_get_completion_tokens_and_drop_sampling(model: str) -> None:
    req = build_request(model, MESSAGES, {**FULL, "reasoning_effort": "low"})
    assert req == {
        "model": model,
        "messages": MESSAGES,
        "max_completion_tokens": 512,
        "reasoning_effort": "low",
    }
    resolved = resolve_params(model, {**FULL, "reasoning_effort": "low"})
    assert set(resolved.dropped) == {"temperature", "top_p", "seed"}


@pytest.mark.parametrize("temperature", [1, 1.0])
def test_reasoning_models_keep_default_temperature(temperature: float) -> None:
    resolved = resolve_params("o4-mini", {"temperature": temperature})
    assert resolved.params == {"temperature": 1}
    assert resolved.dropped == {}


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4.1", "Qwen/Qwen3-8B", "gpt-5-chat-latest"])
def test_standard_models_take_sampling_parameters(model: str) -> None:
    req = build_request(model, MESSAGES, FULL)
    assert req == {"model": model, "messages": MESSAGES, **FULL}
    assert "max_completion_tokens" not in req


def test_max_completion_tokens_is_an_alias() -> None:
    assert resolve_params("gpt-4o", {"max_completion_tokens": 64}).params == {"max_tokens": 64}
    assert resolve_params("o3", {"max_completion_tokens": 64}).params == {
        "max_completion_tokens": 64
    }


def test_reasoning_effort_dropped_for_chat_models_but_kept_for_gpt_oss() -> None:
    dropped = resolve_params("gpt-4o", {"reasoning_effort": "high"})
    assert dropped.params == {} and "reasoning_effort" in dropped.dropped
    kept = resolve_params("openai/gpt-oss-120b", {"reasoning_effort": "high", "temperature": 0.6})
    assert kept.params == {"reasoning_effort": "high", "temperature": 0.6}


def test_null_means_server_default() -> None:
    assert resolve_params("gpt-4o", {"temperature": None, "seed": 1}).params == {"seed": 1}


def test_dropped_keys_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="factory.llm.params"):
        build_request("o1-preview", MESSAGES, {"top_p": 0.5})
        build_request("o1-preview", MESSAGES, {"top_p": 0.5})
    assert [r.getMessage() for r in caplog.records].count(
        "sampling option top_p dropped: o1-preview does not accept top_p"
    ) == 1


@pytest.mark.parametrize(
    ("sampling", "key"),
    [
        ({"temprature": 0.5}, "temprature"),
        ({"stop": ["\n"]}, "stop"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10.5}, "max_tokens"),
        ({"seed": "7"}, "seed"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
    ],
)
@pytest.mark.parametrize("model", ["gpt-4o", "o3"])
def test_bad_sampling_is_a_config_error_naming_the_key(
    sampling: dict[str, Any], key: str, model: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build_request(model, MESSAGES, sampling)
    assert info.value.key_path == f"llm.sampling.{key}"
    assert key in str(info.value)


def test_empty_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"llm\.model"):
        resolve_params(" ", {})
