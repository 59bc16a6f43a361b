"""Action grammars: which text in an agent's turn is an action, and what its arguments are.

Why a grammar as data: AgentBench/AgentTuning agents (and Simia's AgentBench seeds,
arXiv 2511.01824) do not emit structured ``tool_calls``; the action is text inside
the agent's turn (``Act: bash`` and a fenced ``bash`` block, ``search[...]``,
``click[...]``, ``Act: answer(...)``) and the environment's observation is the next
turn. A domain pack declares its actions in ``grammar.yaml``; this module turns one
agent turn into at most one call of the canonical model (``ToolCall``: name and
arguments), so dedup, labels, rules and mixtures work on text agents unchanged.

File format (``prompts/<domain>/grammar.yaml``)::

    name: os                     # the grammar's name (the default app of its actions)
    prefix: "Act:"               # optional: every action starts a line with this text
    separator: " "               # between prefix and action in the canonical form (" " or "\\n")
    preamble_replies: false      # true: agent turns without an action are allowed before the
                                 # first action (AgentInstruct's "OK" after the instructions)
    actions:
      - name: bash
        form: fence              # fence: a fenced code block of `language`
        language: bash
        aliases: [sh, shell]     # other fence languages, rewritten to `language` (a repair)
        arguments: [{name: script}]
        description: run a shell script; its output is the next turn
        example: "Act: bash\\n\\n```bash\\nls /etc\\n```"
      - name: search
        form: bracket            # search[<one argument>]
        arguments: [{name: query, schema: {type: string, maxLength: 200}}]
      - name: click
        form: bracket
        arguments: [{name: target}]
        final_when: {target: "(?i)^buy now$"}   # ends the episode when the arguments match
      - name: answer
        form: call               # answer(<literal>, key=<literal>, ...); one argument may be bare
        arguments: [{name: value}]
        final: true              # ends the episode: no observation follows it
      - name: finish
        form: word               # the bare name
        final: true
    observations:
      error: ["(?m)^bash: ", "No such file or directory"]   # error observations (outcome)
    give_up:                     # final actions that give up (outcome gave_up)
      - {action: answer, arguments: {value: "(?i)^(unknown|cannot)"}}
    directions: ["..."]          # optional: variation directions for amplification prompts

An argument is required unless it says ``required: false``; ``schema`` is a JSON-Schema
fragment its value must satisfy. ``app`` on an action names the application it belongs
to (default: the part of a dotted name before the dot, ``calendar.add_event``; else the
grammar's name; final actions belong to no app).

Parsing a turn (:meth:`ActionGrammar.parse_turn`) finds every action candidate (with a
prefix: every line that starts with it), parses the one there should be, and applies
only lossless repairs, each reported as a note: ``action_whitespace`` (spacing and
blank lines around the action rewritten to the canonical form), ``fence_language`` (a
fence without a language, or an alias, given the action's language), ``close_fence``
(a fence left open at the end of the turn closed), ``unwrap_action`` (backticks or a
code fence around a non-fence action removed). Problems are reason codes of
``factory.core.reasons``: ``no_action``, ``unknown_action``, ``malformed_action``,
``multiple_actions``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonschema import SchemaError

from factory.core.schema import compile_schema
from factory.core.trajectory import ToolCall
from factory.core.yamlfile import known_keys as _known
from factory.core.yamlfile import mapping_items, read_yaml
from factory.errors import ConfigError, short

__all__ = ["FORMS", "Action", "ActionGrammar", "Argument", "TurnParse"]

Form = Literal["fence", "bracket", "call", "word"]
FORMS: tuple[str, ...] = ("fence", "bracket", "call", "word")

NOTE_WHITESPACE = "action_whitespace"
NOTE_FENCE_LANGUAGE = "fence_language"
NOTE_CLOSE_FENCE = "close_fence"
NOTE_UNWRAP = "unwrap_action"

_TOP_KEYS = (
    "name", "prefix", "separator", "preamble_replies", "actions", "observations", "give_up",
    "directions", "description",
)  # fmt: skip
_ACTION_KEYS = (
    "name", "form", "language", "aliases", "arguments", "final", "final_when", "app",
    "description", "example",
)  # fmt: skip
_ARGUMENT_KEYS = ("name", "schema", "required", "description")
_GIVE_UP_KEYS = ("action", "arguments")
_OBSERVATION_KEYS = ("error",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ACTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.-]*")
# A closing fence: a line holding only ``` (spaces around allowed).
_CLOSE = re.compile(r"\n[ \t]*```[ \t]*(?=\n|\Z)")
_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]*)[ \t]*(?:\n|\Z)")
_LITERALS = (str, int, float, bool, type(None), list, dict)


@dataclass(frozen=True)
class Argument:
    """One argument of an action; ``schema`` is a JSON-Schema fragment for its value."""

    name: str
    schema: Mapping[str, Any] | None = None
    required: bool = True
    description: str = ""


@dataclass(frozen=True)
class Action:
    """One action of a grammar (see the module docstring for the forms)."""

    name: str
    form: Form
    arguments: tuple[Argument, ...] = ()
    language: str = ""
    aliases: tuple[str, ...] = ()
    final: bool = False
    final_when: Mapping[str, str] = field(default_factory=dict)
    app: str | None = None
    description: str = ""
    example: str = ""

    def ends_episode(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call of this action with ``arguments`` ends the episode."""
        if self.final:
            return True
        if not self.final_when:
            return False
        return all(
            re.search(pattern, _text(arguments.get(name))) is not None
            for name, pattern in self.final_when.items()
        )


@dataclass
class TurnParse:
    """What one agent turn holds: its repaired text, its call, and what is wrong with it.

    ``found`` says whether the turn holds anything that looks like an action (a
    prefix line, a known action's opening), even a broken one: a reader then knows
    the environment's next turn is an observation. ``start``: where the action's text
    (its prefix, if any) begins in ``text`` when ``call`` is set; it runs to the end.
    """

    text: str
    call: ToolCall | None = None
    final: bool = False
    found: bool = False
    start: int = -1
    issues: list[tuple[str, str]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    start: int  # where the action's text (the prefix, if any) begins
    body: int  # where the action itself begins (after the prefix and whitespace)
    end: int  # end of the region the action may occupy


class _Bad(Exception):
    """A candidate that does not parse: a reason code and a message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class ActionGrammar:
    """A domain's action grammar (load it with :meth:`load` or :meth:`from_dict`)."""

    name: str
    actions: tuple[Action, ...]
    prefix: str = ""
    separator: str = " "
    preamble_replies: bool = False
    error_observations: tuple[str, ...] = ()
    give_up: tuple[tuple[str, Mapping[str, str]], ...] = ()
    directions: tuple[str, ...] = ()
    description: str = ""
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # --- loading --------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> ActionGrammar:
        """Read a grammar file.

        Raises:
            ConfigError: unreadable file, bad YAML, or a malformed grammar; the message
                names the file and the key path inside it (``actions[2].form``).
        """
        raw = read_yaml(path, "action grammar", key_path="domain.grammar")
        try:
            return cls.from_dict(raw)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}", key_path="domain.grammar") from exc

    @classmethod
    def from_dict(cls, raw: Any) -> ActionGrammar:
        """Build a grammar from its parsed mapping.

        Raises:
            ConfigError: an unknown key, a wrong type, a bad regex or schema, a duplicate
                action name; ``key_path`` names the spot (``actions[1].final_when.target``).
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("an action grammar must be a mapping with actions", key_path="")
        _known(raw, _TOP_KEYS, "")
        name = _string(raw, "name", "", required=True)
        prefix = _string(raw, "prefix", "")
        separator = raw.get("separator", " ")
        if separator not in (" ", "\n"):
            raise ConfigError('must be " " or "\\n"', key_path="separator")
        preamble = _flag(raw, "preamble_replies", "", default=False)
        raw_actions = raw.get("actions")
        if not isinstance(raw_actions, list) or not raw_actions:
            raise ConfigError("must be a non-empty list of actions", key_path="actions")
        actions: list[Action] = []
        for n, item in enumerate(raw_actions):
            action = _parse_action(item, f"actions[{n}]", name)
            if any(a.name == action.name for a in actions):
                raise ConfigError(
                    f"a second action named {action.name!r}", key_path=f"actions[{n}].name"
                )
            actions.append(action)
        fences = [a for a in actions if a.form == "fence"]
        if not prefix and len(fences) > 1:
            raise ConfigError(
                "without a prefix, fence actions are told apart by nothing but their "
                "language: declare at most one, or set a prefix",
                key_path="actions",
            )
        observations = raw.get("observations") or {}
        if not isinstance(observations, Mapping):
            raise ConfigError("must be a mapping", key_path="observations")
        _known(observations, _OBSERVATION_KEYS, "observations")
        errors = _regexes(observations.get("error") or [], "observations.error")
        give_up = _parse_give_up(raw.get("give_up") or [], {a.name: a for a in actions})
        directions = raw.get("directions") or []
        if not isinstance(directions, list) or not all(
            isinstance(d, str) and d.strip() for d in directions
        ):
            raise ConfigError("must be a list of non-empty strings", key_path="directions")
        return cls(
            name=name,
            actions=tuple(actions),
            prefix=prefix,
            separator=separator,
            preamble_replies=preamble,
            error_observations=errors,
            give_up=give_up,
            directions=tuple(directions),
            description=_string(raw, "description", ""),
            source=json.loads(json.dumps(raw, default=str)),
        )

    # --- lookups --------------------------------------------------------------------------
    def action(self, name: str) -> Action | None:
        """The action called ``name``, or None."""
        return next((a for a in self.actions if a.name == name), None)

    def app_of(self, name: str) -> str | None:
        """The application an action belongs to (None for final actions and unknown names)."""
        action = self.action(name)
        return action.app if action is not None else None

    def is_error(self, observation: str) -> bool:
        """Whether an observation reports a failed action (``observations.error``)."""
        return any(re.search(p, observation) for p in self.error_observations)

    def gives_up(self, call: ToolCall) -> bool:
        """Whether a (final) call gives the task up (``give_up``)."""
        for name, arguments in self.give_up:
            if call.name == name and all(
                re.search(pattern, _text(call.arguments.get(arg)))
                for arg, pattern in arguments.items()
            ):
                return True
        return False

    def to_json(self) -> str:
        """The grammar as one JSON object (what prompts show and the devserver reads back)."""
        return json.dumps(self.source, ensure_ascii=False, indent=1)

    def describe(self) -> str:
        """A human description of the actions, for system prompts (one line per action)."""
        lines = []
        if self.prefix:
            lines.append(
                f"Every agent turn ends with exactly one action on a line starting with "
                f"{self.prefix!r}; the environment's answer is the next turn."
            )
        else:
            lines.append(
                "Every agent turn holds exactly one action; the environment's answer is the "
                "next turn."
            )
        for a in self.actions:
            args = ", ".join(arg.name for arg in a.arguments)
            ends = " Ends the episode." if a.final else ""
            if a.final_when:
                ends = (
                    " Ends the episode when "
                    + ", ".join(f"{k} matches {v!r}" for k, v in a.final_when.items())
                    + "."
                )
            head = f"- {a.name} ({a.form}{': ' + args if args else ''})"
            about = f": {a.description.rstrip('.')}" if a.description else ""
            text = f"{head}{about}.{ends}"
            lines.append(text)
            if a.example:
                lines.append("  Example: " + json.dumps(a.example, ensure_ascii=False))
        return "\n".join(lines)

    # --- rendering ------------------------------------------------------------------------
    def render_action(self, call: ToolCall) -> str:
        """The canonical text of a call (what :meth:`parse_turn` reads back as ``call``).

        Raises:
            ValueError: the call names no action of the grammar.
        """
        action = self.action(call.name)
        if action is None:
            raise ValueError(f"{call.name!r} is not an action of grammar {self.name!r}")
        values = [call.arguments.get(a.name) for a in action.arguments]
        if action.form == "fence":
            body = _text(values[0]) if values else ""
            return self._canonical(action, body)
        if action.form == "bracket":
            return self._canonical(action, _text(values[0]) if values else "")
        if action.form == "call":
            inner = ", ".join(
                json.dumps(v, ensure_ascii=False)
                for v, a in zip(values, action.arguments, strict=True)
                if v is not None or a.required
            )
            return self._canonical(action, inner)
        return self._canonical(action, "")

    def _canonical(self, action: Action, body: str) -> str:
        lead = f"{self.prefix}{self.separator}" if self.prefix else ""
        if action.form == "fence":
            fence = f"```{action.language}\n{body}\n```"
            return f"{lead}{action.name}\n\n{fence}" if self.prefix else fence
        if action.form == "bracket":
            return f"{lead}{action.name}[{body}]"
        if action.form == "call":
            return f"{lead}{action.name}({body})"
        return f"{lead}{action.name}"

    # --- parsing --------------------------------------------------------------------------
    def parse_turn(self, text: str) -> TurnParse:
        """Find, parse and canonicalise the action of one agent turn.

        Returns:
            A ``TurnParse``: with one well-formed action, its ``call`` and the repaired
            ``text``; otherwise ``issues`` (``no_action``, ``unknown_action``,
            ``malformed_action``, ``multiple_actions``) and the text unchanged.
        """
        candidates = self._candidates(text)
        if not candidates:
            return TurnParse(text, issues=[("no_action", "the turn holds no action")])
        if len(candidates) > 1:
            shown = "; ".join(
                short(text[c.body : c.end].strip().split("\n", 1)[0], 40) for c in candidates
            )
            return TurnParse(
                text,
                found=True,
                issues=[("multiple_actions", f"{len(candidates)} actions in one turn: {shown}")],
            )
        cand = candidates[0]
        try:
            action, arguments, end, canonical, notes = self._parse_at(text, cand)
        except _Bad as bad:
            return TurnParse(text, found=True, issues=[(bad.code, str(bad))])
        rest = text[end : cand.end]
        if rest.strip():
            message = f"{action.name}: text after the action: {short(rest.strip(), 60)!r}"
            return TurnParse(text, found=True, issues=[("malformed_action", message)])
        problem = _argument_problem(action, arguments)
        if problem is not None:
            return TurnParse(text, found=True, issues=[("malformed_action", problem)])
        repaired = text[: cand.start] + canonical
        if repaired != text and _whitespace_changed(text[cand.start :], canonical, notes):
            notes.append(NOTE_WHITESPACE)
        return TurnParse(
            repaired,
            call=ToolCall(name=action.name, arguments=arguments),
            final=action.ends_episode(arguments),
            found=True,
            start=cand.start,
            repairs=notes,
        )

    def _candidates(self, text: str) -> list[_Candidate]:
        if self.prefix:
            starts = [
                m
                for m in re.finditer(rf"(?m)^[ \t]*{re.escape(self.prefix)}[ \t\n]*", text)
                if m.start() == 0 or text[m.start() - 1] == "\n"
            ]
            if not starts:
                return []
            bounds = [m.start() for m in starts[1:]] + [len(text)]
            return [
                _Candidate(m.start() + (len(m.group(0)) - len(m.group(0).lstrip())), m.end(), end)
                for m, end in zip(starts, bounds, strict=True)
            ]
        found: list[int] = []
        for action in self.actions:
            found.extend(m.start() for m in self._openings(action, text))
        known = {a.name for a in self.actions}
        for m in re.finditer(r"(?m)^[ \t]*([a-z_][\w.]*)[\[(]", text):
            if m.group(1) not in known:
                found.append(m.start(1))
        found = sorted(set(found))
        return [_Candidate(s, s, len(text)) for s in found]

    def _openings(self, action: Action, text: str) -> list[re.Match[str]]:
        name = re.escape(action.name)
        if action.form == "fence":  # fence lines pair up: every second one closes a block
            fences = list(re.finditer(r"(?m)^[ \t]*```[ \t]*([A-Za-z0-9_+#.-]*)[ \t]*$", text))
            langs = {"", action.language, *action.aliases}
            return [m for m in fences[::2] if m.group(1) in langs]
        opener = {"bracket": r"[ \t]*\[", "call": r"[ \t]*\(", "word": r"[ \t]*$"}[action.form]
        return list(re.finditer(rf"(?m)^[ \t]*{name}{opener}", text))

    def _parse_at(
        self, text: str, cand: _Candidate
    ) -> tuple[Action, dict[str, Any], int, str, list[str]]:
        """(action, arguments, end of the action, canonical text, repair notes)."""
        notes: list[str] = []
        region = text[: cand.end]
        pos = cand.body
        if not self.prefix:
            pos += len(region[pos:]) - len(region[pos:].lstrip(" \t"))
            fence = next((a for a in self.actions if a.form == "fence"), None)
            if fence is not None and region.startswith("```", pos):
                return self._fence(region, pos, fence, notes)
        unwrapped = _unwrap(region, pos) if self.prefix else None
        if unwrapped is not None:
            inner, inner_end = unwrapped
            sub = ActionGrammar(self.name, self.actions)  # no prefix: parse the inner text
            inner_cand = _Candidate(0, 0, len(inner))
            try:
                action, args, end, canonical, inner_notes = sub._parse_at(inner, inner_cand)
            except _Bad:
                action = None
            if action is not None and action.form != "fence" and not inner[end:].strip():
                lead = f"{self.prefix}{self.separator}"
                return action, args, inner_end, lead + canonical, [NOTE_UNWRAP, *inner_notes]
        m = _ACTION_NAME.match(region, pos)
        if m is None:
            seen = short(region[pos:].strip().split("\n", 1)[0], 40)
            raise _Bad("unknown_action", f"no action name after {self.prefix!r}: {seen!r}")
        action = self.action(m.group(0))
        if action is None:
            known = ", ".join(a.name for a in self.actions)
            raise _Bad(
                "unknown_action", f"{short(m.group(0), 40)!r} is not an action (known: {known})"
            )
        after = m.end()
        if action.form == "fence":
            gap = re.match(r"[ \t]*\n\s*", region[after:])
            start = after + (gap.end() if gap else 0)
            if not region.startswith("```", start):
                raise _Bad("malformed_action", f"{action.name}: no ``` code block after the name")
            _, args, end, canonical, fence_notes = self._fence(region, start, action, notes)
            return (
                action,
                args,
                end,
                f"{self.prefix}{self.separator}{action.name}\n\n" + (canonical),
                fence_notes,
            )
        spaces = re.match(r"[ \t]*", region[after:])
        opener = after + (spaces.end() if spaces else 0)
        if action.form == "word":
            if region[opener : opener + 1] in ("[", "("):
                raise _Bad("malformed_action", f"{action.name} takes no arguments")
            return action, {}, after, self._canonical(action, ""), notes
        want = "[" if action.form == "bracket" else "("
        if region[opener : opener + 1] != want:
            raise _Bad("malformed_action", f"{action.name}: expected {want!r} after the name")
        close = _closing(region, opener, want)
        if close is None:
            raise _Bad("malformed_action", f"{action.name}: {want!r} is never closed")
        inner = region[opener + 1 : close]
        if action.form == "bracket":
            args = {action.arguments[0].name: inner} if action.arguments else {}
            if not action.arguments and inner.strip():
                raise _Bad("malformed_action", f"{action.name} takes no arguments")
            return action, args, close + 1, self._canonical(action, inner), notes
        args = _call_arguments(action, inner)
        return action, args, close + 1, self._canonical(action, inner.strip()), notes

    def _fence(
        self, region: str, start: int, action: Action, notes: list[str]
    ) -> tuple[Action, dict[str, Any], int, str, list[str]]:
        opening = _OPEN.match(region, start)
        if opening is None:
            raise _Bad(
                "malformed_action", f"{action.name}: a code block must start on its own line"
            )
        language = opening.group(1)
        if language != action.language:
            if language and language not in action.aliases:
                raise _Bad(
                    "malformed_action",
                    f"{action.name}: a ```{short(language, 20)} block, expected "
                    f"```{action.language}",
                )
            notes.append(NOTE_FENCE_LANGUAGE)
        body_start = opening.end()
        # search from the opening's own newline, so an empty block's closing line is found
        close = (
            _CLOSE.search(region, body_start - 1) if region.endswith("\n", 0, body_start) else None
        )
        if close is None:
            body, end = region[body_start:], len(region)
            notes.append(NOTE_CLOSE_FENCE)
        else:
            body, end = region[body_start : max(body_start, close.start())], close.end()
        code = body.strip("\n").rstrip()
        if not code.strip():
            raise _Bad("malformed_action", f"{action.name}: the code block is empty")
        args = {action.arguments[0].name: code} if action.arguments else {}
        return action, args, end, f"```{action.language}\n{code}\n```", notes


def _layout(text: str) -> str:
    return re.sub(r"\S+", "x", text)


def _whitespace_changed(original: str, canonical: str, notes: list[str]) -> bool:
    """Whether the canonical action differs from the original in its spacing (beyond what
    the other notes already say: an unwrapped fence, a closing fence added)."""
    if NOTE_UNWRAP in notes:
        return False
    if NOTE_CLOSE_FENCE in notes:
        canonical = canonical[: -len("\n```")]
    return _layout(original) != _layout(canonical)


def _unwrap(region: str, pos: int) -> tuple[str, int] | None:
    """Inner text and end of an action wrapped in backticks or a code fence, or None."""
    if region.startswith("```", pos):
        opening = _OPEN.match(region, pos)
        if opening is None:
            return None
        close = _CLOSE.search(region, opening.end() - 1)
        if close is None:
            return None
        return region[opening.end() : close.start()].strip(), close.end()
    m = re.match(r"(`+)([^`\n]+)\1", region[pos:])
    if m is None:
        return None
    return m.group(2).strip(), pos + m.end()


def _closing(text: str, opener: int, kind: str) -> int | None:
    """Index of the bracket closing ``text[opener]``. ``(``: nested brackets and quoted
    strings are skipped. ``[``: only square brackets nest, and an unbalanced inner one
    falls back to the last ``]`` of the region (``click[Size [L]`` is rare but real)."""
    close = "]" if kind == "[" else ")"
    nesting = "[]" if kind == "[" else "()[]{}"
    depth = 0
    quote = ""
    i = opener
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif kind == "(" and c in "\"'":
            quote = c
        elif c in "([{" and c in nesting:
            depth += 1
        elif c in ")]}" and c in nesting:
            depth -= 1
            if depth == 0:
                return i if c == close else None
        i += 1
    if kind == "[":
        last = text.rfind("]", opener)
        return last if last > opener else None
    return None


def _call_arguments(action: Action, inner: str) -> dict[str, Any]:
    """``name(...)`` arguments: Python literals, positional then keyword; a single-argument
    action also takes bare text (``answer(/home/user)``)."""
    stripped = inner.strip()
    if not action.arguments:
        if stripped:
            raise _Bad("malformed_action", f"{action.name} takes no arguments")
        return {}
    try:
        node = ast.parse(f"_({stripped})", mode="eval").body
        assert isinstance(node, ast.Call)
        positional = [_literal(a) for a in node.args]
        keywords = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**arguments")
            keywords[kw.arg] = _literal(kw.value)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        if len(action.arguments) == 1 and stripped:
            return {action.arguments[0].name: stripped}
        raise _Bad(
            "malformed_action",
            f"{action.name}: arguments are not literals ({short(str(exc), 60)}): "
            f"{short(stripped, 60)!r}",
        ) from exc
    names = [a.name for a in action.arguments]
    if len(positional) > len(names):
        raise _Bad(
            "malformed_action",
            f"{action.name} takes {len(names)} argument(s), got {len(positional)}",
        )
    args = dict(zip(names, positional, strict=False))
    for key, value in keywords.items():
        if key not in names:
            raise _Bad("malformed_action", f"{action.name}: no argument named {key!r}")
        if key in args:
            raise _Bad("malformed_action", f"{action.name}: {key!r} given twice")
        args[key] = value
    return args


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name):  # a bare word is not a literal
        raise ValueError(f"bare name {node.id!r}")
    value = ast.literal_eval(node)
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, _LITERALS):
        raise ValueError(f"a {type(value).__name__} is not a JSON value")
    json.dumps(value)  # nested sets, bytes ... raise TypeError
    return value


def _argument_problem(action: Action, arguments: Mapping[str, Any]) -> str | None:
    for arg in action.arguments:
        value = arguments.get(arg.name)
        if value is None or (isinstance(value, str) and not value.strip()):
            if arg.required:
                return f"{action.name}: argument {arg.name!r} is missing or empty"
            continue
        if arg.schema is not None:
            errors = list(compile_schema(dict(arg.schema)).iter_errors(value))
            if errors:
                return f"{action.name}: {arg.name}: {short(errors[0].message, 100)}"
    return None


# --- loading helpers ------------------------------------------------------------------------------
def _string(data: Mapping[str, Any], key: str, at: str, *, required: bool = False) -> str:
    where = f"{at}.{key}" if at else key
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError("missing required value", key_path=where)
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"must be a string, got {type(value).__name__}", key_path=where)
    return value


def _flag(data: Mapping[str, Any], key: str, at: str, *, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError("must be true or false", key_path=f"{at}.{key}" if at else key)
    return value


def _regexes(raw: Any, at: str) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise ConfigError("must be a list of regular expressions", key_path=at)
    for n, pattern in enumerate(raw):
        _regex(pattern, f"{at}[{n}]")
    return tuple(raw)


def _regex(pattern: Any, at: str) -> str:
    if not isinstance(pattern, str):
        raise ConfigError("must be a regular expression (a string)", key_path=at)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"not a regular expression: {exc}", key_path=at) from exc
    return pattern


def _parse_action(raw: Any, at: str, grammar_name: str) -> Action:
    if not isinstance(raw, Mapping):
        raise ConfigError("an action must be a mapping with name and form", key_path=at)
    _known(raw, _ACTION_KEYS, at)
    name = _string(raw, "name", at, required=True)
    if not _ACTION_NAME.fullmatch(name):
        raise ConfigError(
            "must be letters, digits and _ (dots between parts: calendar.add_event)",
            key_path=f"{at}.name",
        )
    form = raw.get("form")
    if form not in FORMS:
        raise ConfigError(
            f"expected one of {', '.join(FORMS)}, got {form!r}", key_path=f"{at}.form"
        )
    language = _string(raw, "language", at)
    aliases = raw.get("aliases") or []
    if form == "fence":
        if not language or not _LANGUAGE.fullmatch(language):
            raise ConfigError(
                "a fence action needs its code block's language", key_path=f"{at}.language"
            )
        if not isinstance(aliases, list) or not all(
            isinstance(x, str) and x and _LANGUAGE.fullmatch(x) for x in aliases
        ):
            raise ConfigError("must be a list of fence languages", key_path=f"{at}.aliases")
    elif language or aliases:
        raise ConfigError("only fence actions have a language", key_path=f"{at}.language")
    arguments = _parse_arguments(raw.get("arguments") or [], f"{at}.arguments")
    if form in ("fence", "bracket") and len(arguments) > 1:
        raise ConfigError(f"a {form} action takes at most one argument", key_path=f"{at}.arguments")
    if form == "word" and arguments:
        raise ConfigError("a word action takes no arguments", key_path=f"{at}.arguments")
    final = _flag(raw, "final", at, default=False)
    final_when = raw.get("final_when") or {}
    if not isinstance(final_when, Mapping):
        raise ConfigError(
            "must map argument names to regular expressions", key_path=f"{at}.final_when"
        )
    for key, pattern in final_when.items():
        if key not in {a.name for a in arguments}:
            raise ConfigError(f"{name} has no argument {key!r}", key_path=f"{at}.final_when.{key}")
        _regex(pattern, f"{at}.final_when.{key}")
    app = raw.get("app")
    if app is not None and (not isinstance(app, str) or not app):
        raise ConfigError("must be a non-empty string", key_path=f"{at}.app")
    if app is None and not final:
        app = name.split(".", 1)[0] if "." in name else grammar_name
    return Action(
        name=name,
        form=form,
        arguments=arguments,
        language=language,
        aliases=tuple(aliases),
        final=final,
        final_when=dict(final_when),
        app=app,
        description=_string(raw, "description", at),
        example=_string(raw, "example", at),
    )


def _parse_arguments(raw: Any, at: str) -> tuple[Argument, ...]:
    out: list[Argument] = []
    for where, item in mapping_items(raw, at, _ARGUMENT_KEYS, "a mapping {name, schema?}"):
        name = _string(item, "name", where, required=True)
        if not _NAME.fullmatch(name) or any(a.name == name for a in out):
            raise ConfigError(f"a bad or repeated argument name {name!r}", key_path=f"{where}.name")
        schema = item.get("schema")
        if schema is not None:
            if not isinstance(schema, Mapping):
                raise ConfigError("must be a JSON-Schema object", key_path=f"{where}.schema")
            try:
                compile_schema(dict(schema))
            except (SchemaError, TypeError) as exc:
                raise ConfigError(
                    f"invalid JSON Schema: {short(str(exc).splitlines()[0], 120)}",
                    key_path=f"{where}.schema",
                ) from exc
        required = _flag(item, "required", where, default=True)
        out.append(
            Argument(
                name=name,
                schema=dict(schema) if schema is not None else None,
                required=required,
                description=_string(item, "description", where),
            )
        )
    return tuple(out)


def _parse_give_up(
    raw: Any, actions: Mapping[str, Action]
) -> tuple[tuple[str, Mapping[str, str]], ...]:
    out: list[tuple[str, Mapping[str, str]]] = []
    for where, item in mapping_items(raw, "give_up", _GIVE_UP_KEYS, "a mapping {action}"):
        name = _string(item, "action", where, required=True)
        action = actions.get(name)
        if action is None:
            raise ConfigError(f"no action named {name!r}", key_path=f"{where}.action")
        arguments = item.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise ConfigError(
                "must map argument names to regular expressions", key_path=f"{where}.arguments"
            )
        for key, pattern in arguments.items():
            if key not in {a.name for a in action.arguments}:
                raise ConfigError(
                    f"{name} has no argument {key!r}", key_path=f"{where}.arguments.{key}"
                )
            _regex(pattern, f"{where}.arguments.{key}")
        out.append((name, dict(arguments)))
    return tuple(out)
