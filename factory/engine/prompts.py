"""Prompt rendering: Jinja templates in ``prompts/`` turned into chat messages.

Each template has two blocks. ``system`` depends only on the domain (tools,
policy, output format), so it is byte-identical across every call of a run and
comes first: OpenAI prompt caching and vLLM prefix caching reuse it. ``user``
holds what changes per call (variation, reference trajectory). ``Prompt``
keeps the length of the static prefix so the manifest can report its share.

A text-action domain's templates (``prompts/amplify_actions.j2``) get its action
grammar in the static block (``grammar_json``, and ``actions``: one line per action)
and, for a composition recipe, its composition rules (``compose_json``); references
are shown as they are written (``render_messages``), the grammar's ``directions``
replace the customer-service ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from factory.core.formats.completion import render_output
from factory.core.formats.textaction import render_messages
from factory.core.trajectory import Trajectory, canonical_json
from factory.envs.pack import Domain, load_domain
from factory.errors import ConfigError, FactoryError
from factory.recipe import AmplifyRecipe, Recipe

__all__ = ["DIRECTIONS", "Prompt", "PromptTemplate", "estimate_tokens", "prompt_fingerprints"]

# Variation directions cycled by sample index: diversity without randomness, so a
# request is a pure function of (seed, index) and can be cached and resumed.
DIRECTIONS: tuple[str, ...] = (
    "keep the reference's kind of request, with a different user and different details.",
    "the user asks for something the policy does not allow; the agent refuses politely.",
    "the user changes their mind once during the conversation.",
    "a tool call fails first (wrong identifier or unavailable option) and the agent recovers.",
    "the user gives their details in pieces and the agent has to ask for what is missing.",
    "the request involves more of what it is about (people, items, trips or orders) than the "
    "reference.",
    "the user is in a hurry and terse; the agent stays precise and still confirms changes.",
    "the request cannot be handled with the tools and ends with a transfer to a human agent.",
)


def estimate_tokens(text: str) -> int:
    """Rough token count (4 characters a token), used for planning and by the devserver.

    Why not a tokenizer: planning must work offline for any model; the estimate
    is calibrated against real runs by the --dry-run accuracy test.
    """
    return math.ceil(len(text) / 4) if text else 0


@dataclass(frozen=True)
class Prompt:
    """Rendered chat messages plus the static-prefix size for cache reporting."""

    messages: list[dict[str, str]]
    static_chars: int

    @property
    def text(self) -> str:
        return "".join(m["content"] for m in self.messages)

    def input_tokens(self) -> int:
        return estimate_tokens(self.text)

    def static_tokens(self) -> int:
        return estimate_tokens(self.messages[0]["content"][: self.static_chars])


_LINE_BREAKS = (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085"))
_REFERENCES_KEPT = 8192  # references whose rendering a template remembers (a 1.5k-seed run: all)


@lru_cache(maxsize=32)
def _environment(folder: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )


class PromptTemplate:
    """A template file with ``system`` and ``user`` blocks, bound to one domain."""

    def __init__(self, path: Path, domain: Domain, *, key_path: str = "prompt"):
        if not path.is_file():
            raise ConfigError(f"prompt template {path} not found", key_path=key_path)
        try:
            self.template = _environment(str(path.parent)).get_template(path.name)
        except (jinja2.TemplateError, UnicodeDecodeError) as exc:
            raise ConfigError(f"template {path.name}: {exc}", key_path=key_path) from exc
        for block in ("system", "user"):
            if block not in self.template.blocks:
                raise ConfigError(f"template {path.name} lacks block {block!r}", key_path=key_path)
        self.domain = domain
        self._references: dict[int, tuple[Trajectory, str]] = {}
        tools_json = json.dumps(domain.public_tools(), indent=1, ensure_ascii=False)
        grammar, compose = domain.grammar, domain.compose
        self.directions = grammar.directions if grammar and grammar.directions else DIRECTIONS
        self.static = self._block(
            "system",
            tools_json=tools_json,
            policy=domain.policy.strip(),
            grammar_json=grammar.to_json() if grammar else "",
            actions=grammar.describe() if grammar else "",
            compose_json=compose.to_json() if compose else "",
        )

    def output_form(self, reference: Trajectory) -> dict[str, Any]:
        """A trajectory in the output format of this domain's prompts (text-action domains:
        the agent's text as written, observations as ``tool`` messages)."""
        shown = render_messages if self.domain.grammar is not None else render_output
        return shown(reference)

    def reference_json(self, reference: Trajectory) -> str:
        """A trajectory as the prompts show it (one JSON object, line breaks escaped).

        Remembered per reference object: a run cycles its few thousand seeds through
        every call, and rendering one was the largest single cost of a worker's event
        loop after the HTTP exchange (py-spy, the peer benchmark's S1).
        """
        known = self._references.get(id(reference))
        if known is not None and known[0] is reference:
            return known[1]
        text = json.dumps(self.output_form(reference), indent=1, ensure_ascii=False)
        # json.dumps leaves these raw; str.splitlines() would read them as line breaks,
        # letting a seed start a line of its own inside the prompt.
        for raw, escaped in _LINE_BREAKS:
            text = text.replace(raw, escaped)
        if len(self._references) >= _REFERENCES_KEPT:
            self._references.clear()
        self._references[id(reference)] = (reference, text)  # holding it keeps its id unique
        return text

    def _block(self, name: str, **ctx: Any) -> str:
        context = self.template.new_context(ctx)
        return "".join(self.template.blocks[name](context)).strip()

    def render(self, reference: Trajectory, *, variation: int = 0, **extra: str) -> Prompt:
        """Messages for one call: the static system block, then the per-call user block.

        ``extra`` adds per-call variables of the user block (``scenario_json`` for the
        grounded template, ``companions_json`` for a composition template).
        """
        user = self._block(
            "user",
            variation=variation + 1,
            direction=self.directions[variation % len(self.directions)],
            reference_json=self.reference_json(reference),
            **extra,
        )
        messages = [
            {"role": "system", "content": self.static},
            {"role": "user", "content": user},
        ]
        return Prompt(messages=messages, static_chars=len(self.static))


def prompt_fingerprints(cfg: Recipe) -> dict[str, str]:
    """Per LLM stage of a single-domain recipe, a hash of what all its requests share: the
    model, the sampling parameters, the template's text and the static block it renders
    (the pack's policy and tools).

    Why: a request id hashes the whole prompt (``llm_stage.request_id``), so editing the
    policy gives every request a new id and none of the folder's cached answers of that
    stage is asked for again. Comparing these with the folder's last run
    (``factory.io.runstate.note_prompt_changes``) says so before the calls are paid.
    Returns {} for a recipe without LLM stages, a mixed one, or one whose pack or
    templates do not load (the job then reports that).
    """
    if not isinstance(cfg, AmplifyRecipe):  # no LLM stage, or a mixed recipe
        return {}
    stages: list[tuple[str, str, str]] = []
    if cfg.prefilter.enabled:
        stages.append(("prefilter", cfg.prefilter.prompt, cfg.prefilter.model or cfg.llm.model))
    grounding = cfg.amplify.grounding
    path = grounding.prompt if grounding is not None else cfg.amplify.prompt
    stages.append(("amplify", path, cfg.llm.model))
    out: dict[str, str] = {}
    try:
        domain = load_domain(cfg.domain)
        for stage, path, model in stages:
            file = Path(path)
            template = PromptTemplate(file, domain, key_path=stage)
            body = {
                "model": model,
                "sampling": cfg.llm.sampling,
                "template": hashlib.sha256(file.read_bytes()).hexdigest(),
                "static": template.static,
            }
            out[stage] = hashlib.sha256(canonical_json(body).encode()).hexdigest()[:16]
    except (FactoryError, OSError):
        return {}
    return out
