"""The recipe's ``domain`` section: a domain's name and the files of its pack.

Why apart: a mixed recipe's parts each carry one (``parts[].domain``), and the pack
loader (``factory.envs.pack``) reads only this section, its paths already resolved.
"""

from __future__ import annotations

from pydantic import Field

from factory.recipe.section import Section

__all__ = ["DomainConfig"]


class DomainConfig(Section):
    """The domain: its name and its pack (tools, policy, rules; a grammar for text actions)."""

    name: str = Field(description="Domain name, e.g. 'airline'.")
    tools: str | None = Field(
        None,
        description="JSON file: list of OpenAI function specs with x-kind; default: the pack "
        "of the domain's plug-in (then policy and rules default to the pack's too).",
    )
    policy: str | None = Field(None, description="Markdown policy shown to models and agents.")
    rules: str | None = Field(None, description="filters/<domain>.yaml with domain rules.")
    grammar: str | None = Field(
        None,
        description="Action grammar YAML of a text-action domain (the agent's action is text "
        "in its turn: AgentBench style); replaces tools. See docs/text-actions.md.",
    )
    compose: str | None = Field(
        None,
        description="Multi-app composition rules YAML (needs grammar): amplification shows "
        "one-app seeds of several apps and validates the composed trajectories.",
    )
