"""Reason codes: why a row was rejected or failed.

One registry so the manifest, the rejects files and the tests agree on the
vocabulary. A code is a short snake_case string; domain rules add codes of
the form ``domain:<rule id>`` declared in ``filters/<domain>.yaml``.
``tests/core/test_reasons.py`` checks that every code here is reachable from a
crafted bad input.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REASONS", "Issue", "describe"]


@dataclass(frozen=True)
class Issue:
    """One broken rule on one trajectory. ``turn`` is the canonical turn index, if any."""

    code: str
    message: str
    turn: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        where = f" (turn {self.turn})" if self.turn is not None else ""
        return f"{self.code}{where}: {self.message}"


REASONS: dict[str, str] = {
    # --- reading seeds (factory.io.readers / factory.convert) ---
    "unreadable_bytes": "the record is not valid UTF-8 text",
    "invalid_json": "the record is not parseable JSON",
    "not_an_object": "the record is JSON but not an object",
    "unknown_format": "no conversations / messages / traj field in a known layout",
    "bad_role": "a turn has a role / from value the format does not define",
    "bad_field_type": "a field has the wrong type (e.g. a non-string message value)",
    "bad_tools": "the tools field is not a list of function specs",
    "empty_trajectory": "no user or assistant turns",
    "too_large": "the record exceeds the configured size or nesting limits",
    "unreadable_file": "the file is not a readable .jsonl/.json/.parquet container",
    # --- JSON repair (factory.core.repair) ---
    "malformed_arguments": "tool-call arguments could not be recovered without guessing",
    "arguments_not_object": "tool-call arguments are valid JSON but not an object",
    "malformed_observation": "a JSON-looking observation could not be recovered",
    # --- tool-call schema (factory.core.validate) ---
    "unknown_tool": "a call names a tool that is not in the tool list",
    "missing_argument": "a required argument is missing",
    "unknown_argument": "an argument is not declared by the tool's schema",
    "wrong_type": "an argument has the wrong JSON type",
    "enum_violation": "an argument is not one of the allowed values",
    "schema_violation": "an argument breaks another JSON-Schema keyword",
    # --- structure, as LLaMA-Factory's sharegpt converter checks it ---
    "bad_turn_order": "roles do not alternate user/observation with assistant/function_call",
    "no_assistant_ending": "the conversation does not end with an assistant turn",
    "unanswered_call": "a tool call is not followed by its observation",
    "orphan_observation": "an observation does not answer any call",
    "empty_turn": "a user or assistant turn has no content",
    "bad_function_call": "a function_call value is not JSON that LLaMA-Factory can parse",
    "stray_think_tag": "a <think> tag is left in assistant text once its reasoning span is cut",
    # --- text actions (factory.core.actions, with the domain's action grammar) ---
    "no_action": "an agent turn holds no action of the grammar",
    "unknown_action": "an agent turn's action is not one the grammar declares",
    "malformed_action": "an action's arguments or syntax are malformed (unclosed, wrong count, "
    "bad value, text after the action)",
    "multiple_actions": "an agent turn holds more than one action",
    "answer_not_last": "a final action (an answer) is followed by more turns",
    "action_without_observation": "an action is not followed by the environment's observation",
    "observation_without_action": "an observation does not follow an action",
    # --- multi-app composition (factory.core.compose) ---
    "too_few_apps": "a composed trajectory uses fewer apps than the composition rules ask",
    "invalid_path": "a file path argument does not match the composition rules' path pattern",
    "ungrounded_value": "an action uses a value from neither the task nor an earlier observation",
    "no_app_flow": "no value read in one app's observation is used by another app's action",
    # --- dedup ---
    "duplicate": "exact duplicate of an earlier trajectory (same content hash)",
    "near_duplicate": "MinHash near-duplicate of a kept trajectory (this run's or an index's)",
    "contaminated": "holds a benchmark text's n-grams, or an excluded task id",
    # --- LLM stages (pre-filter, amplification) ---
    "reward_below_min": "the seed's recorded reward is below the recipe's minimum",
    "prefilter_rejected": "the LLM judge decided not to keep the seed",
    "unparsable_completion": "the model's output holds no recoverable trajectory",
    "llm_failed": "the LLM call failed after all retries",
    "llm_timeout": "every attempt of the LLM call timed out",
    "llm_rate_limited": "the provider kept answering 429 until the retries ran out",
    "llm_server_error": "5xx or connection failures until the retries ran out",
    "llm_bad_request": "the provider refused the request (4xx); retrying cannot help",
    "internal_error": "an unexpected error in a stage (a bug: please report it)",
    # --- grounding against an executable world ---
    "contradicts_executor": "a simulated observation contradicts the executed one",
    "bad_step_sample": "a record is not a step sample (field missing or mistyped, Δ inconsistent)",
}


def describe(code: str) -> str:
    """Human description of ``code``; domain codes describe themselves."""
    if code.startswith("domain:"):
        return f"domain rule {code.split(':', 1)[1]} violated"
    return REASONS.get(code, code)
