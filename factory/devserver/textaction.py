"""The development server's answers to text-action prompts (AgentBench / OfficeBench style).

A text-action prompt (``prompts/amplify_actions.j2``, ``prefilter_actions.j2``,
``amplify_compose.j2``) carries its domain's action grammar as JSON under
``## Action grammar`` in its static block, so the server needs no domain code: it
reads the grammar back and answers

* a **judge** prompt with the verdict the factory's own validation gives the
  reference read with that grammar (keep when it has no issue);
* an **amplification** prompt with a new episode: the reference with one consistent
  renaming of what a real model would vary (people's names, numbers, dates, ids such
  as ``B07QX4M2ZL``) applied to every message, so the actions stay well-formed and the
  values an action uses still come from the task or an earlier observation;
* a **composition** prompt (``### Companion references``) with one episode that runs
  the references' episodes one after the other (the first ones without their final
  action) under one task, where a value the later app's task named is replaced by a
  value an earlier app's observation printed, and the task says "the ... from the
  <app> step" instead: the apps pass information, as the composition rules ask.

Defects (``--defects``) map onto text actions: ``unknown_tool`` renames an action to
one the grammar lacks, ``wrong_arg_type`` breaks an action's arguments,
``missing_observation`` drops an observation; ``malformed_json`` is the app's.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from collections.abc import Callable
from typing import Any

from factory.core.compose import CompositionRules
from factory.core.formats.textaction import parse as parse_text
from factory.core.grammar import ActionGrammar
from factory.core.trajectory import ToolCall
from factory.core.validate import validate
from factory.devserver.simulate import (
    AMPLIFY_MARKER,
    FIRST_NAMES,
    JUDGE_MARKER,
    LAST_NAMES,
    extract_block,
    last_user_text,
    vary_opening,
)
from factory.errors import ConfigError, SeedError

__all__ = [
    "COMPANIONS_MARKER",
    "GRAMMAR_MARKER",
    "RULES_MARKER",
    "amplify",
    "answer",
    "compose",
    "grammar_in",
    "inject_defect",
    "judge",
    "rules_in",
]

GRAMMAR_MARKER = "## Action grammar"
RULES_MARKER = "## Composition rules"
COMPANIONS_MARKER = "### Companion references"
_UNKNOWN_ACTIONS = ("python", "scroll", "navigate", "open_url", "submit_form", "run_query")
_NAMES = frozenset(FIRST_NAMES) | frozenset(LAST_NAMES)
# Lower-case forms (user names, e-mail addresses) of the names that are no English word.
_LOWER_NAMES = sorted((n.lower() for n in _NAMES if n not in ("Park",)), key=len, reverse=True)
# What a model varies, most specific first: dates, e-mail addresses (their names are
# renamed inside), ids with digits, people's names, numbers of two or more digits.
_ENTITY = re.compile(
    r"(?P<date>\b\d{4}-\d{2}-\d{2}\b)"
    r"|(?P<id>\b(?=[A-Z0-9]*\d)[A-Z][A-Z0-9]{5,}\b|\b[A-Za-z]+-\d{2,}\b(?!-))"
    r"|(?P<name>\b(?:" + "|".join(sorted(_NAMES, key=len, reverse=True)) + r")\b)"
    r"|(?P<lname>\b(?:" + "|".join(_LOWER_NAMES) + r")\b)"
    r"|(?P<time>\b\d{1,2}:\d{2}\b)"  # a clock time is kept (renaming it would break it)
    r"|(?P<num>(?<![\w.-])\d{2,}(?:\.\d+)?(?![\w]))"
)
# Shapes of values that can flow from one app's observation into another's action.
_SHAPES = (
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
    ("address", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    ("file", re.compile(r"(?<![\w/])/[\w./-]+\.\w+\b")),
    ("amount", re.compile(r"(?<![\w.:-])\d{2,}(?:\.\d+)?(?![\w:-])")),
)

Messages = list[dict[str, Any]]


# --- reading the prompt -----------------------------------------------------------------------
def grammar_in(messages: list[Any]) -> ActionGrammar | None:
    """The action grammar a prompt's system message carries, or None (not a text-action
    prompt, or a grammar that does not load)."""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "system":
            content = message.get("content")
            if isinstance(content, str) and GRAMMAR_MARKER in content.splitlines():
                block = extract_block(content, GRAMMAR_MARKER)
                return _grammar(block) if block is not None else None
    return None


@functools.lru_cache(maxsize=64)
def _grammar(block: str) -> ActionGrammar | None:
    try:
        return ActionGrammar.from_dict(json.loads(block))
    except (ValueError, ConfigError):
        return None


def _messages(block: str | None) -> Messages | None:
    try:
        value = json.loads(block) if block is not None else None
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("messages")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        return None
    return [dict(m) for m in value]


def _companions(text: str) -> list[Messages] | None:
    block = extract_block(text, COMPANIONS_MARKER)
    try:
        value = json.loads(block) if block is not None else None
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    refs = [_messages(json.dumps(item)) for item in value]
    return [r for r in refs if r]


# --- answers --------------------------------------------------------------------------------------
def answer(
    kind: str,
    messages: list[Any],
    grammar: ActionGrammar,
    rng: random.Random,
    defect: str | None = None,
    defect_rng: random.Random | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The answer to a text-action ``judge`` or ``amplify`` prompt.

    Returns:
        ``(value, applied defect)``; ``value`` is the verdict or ``{"messages": [...]}``,
        or None when the prompt's reference cannot be read.
    """
    text = last_user_text(messages)
    if kind == "judge":
        return judge(_messages(extract_block(text, JUDGE_MARKER)), grammar), None
    reference = _messages(extract_block(text, AMPLIFY_MARKER))
    if reference is None:
        return None, None
    companions = _companions(text) if COMPANIONS_MARKER in text.splitlines() else None
    if companions:
        episode = compose([reference, *companions], grammar, rng, rules_in(messages, grammar))
    else:
        episode = amplify(reference, rng)
    applied = None
    if defect is not None and inject_defect(episode, defect, grammar, defect_rng or rng):
        applied = defect
    return {"messages": episode}, applied


def rules_in(messages: list[Any], grammar: ActionGrammar) -> CompositionRules | None:
    """The composition rules a prompt's system message carries, or None."""
    system = next(
        (m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"),
        None,
    )
    if not isinstance(system, str) or RULES_MARKER not in system.splitlines():
        return None
    block = extract_block(system, RULES_MARKER)
    try:
        return CompositionRules.from_dict(json.loads(block or ""), grammar)
    except (ValueError, ConfigError):
        return None


def judge(reference: Messages | None, grammar: ActionGrammar) -> dict[str, Any]:
    """A pre-filter verdict: keep exactly when the factory's validation finds no issue."""
    if reference is None:
        issues = ["the trajectory is not a message list"]
    else:
        try:
            traj = parse_text({"messages": reference}, grammar=grammar)
            issues = [str(i) for i in validate(traj, grammar=grammar)]
        except SeedError as exc:
            issues = [f"{exc.reason}: {exc}"]
    score = 2 if issues else 5
    return {
        "keep": not issues,
        "scores": {"completeness": score, "consistency": 5, "format": score},
        "reasons": issues[:3] or ["every turn holds one well-formed action; the episode ends"],
    }


def amplify(reference: Messages, rng: random.Random) -> Messages:
    """A new episode: the reference with one consistent renaming and a reworded opening."""
    out = _rename(reference, rng)
    for message in out:
        if message.get("role") == "user":
            message["content"] = vary_opening(str(message.get("content") or ""), rng)
            break
    return out


def compose(
    references: list[Messages],
    grammar: ActionGrammar,
    rng: random.Random,
    rules: CompositionRules | None = None,
) -> Messages:
    """One multi-app episode from one-app references (see the module docstring).

    The references are tried in every order (shuffled by ``rng``) until one lets a
    value pass from an earlier app into a later app's action; without such an order
    the first one is returned as it is (the validator then says ``no_app_flow``).
    """
    orders = list(itertools.permutations(range(len(references))))
    rng.shuffle(orders)
    first: Messages | None = None
    for order in orders[:6]:
        episode, passed = _chain([references[i] for i in order], grammar, rng, rules)
        if passed:
            return amplify(episode, rng)
        first = first or episode
    assert first is not None
    return amplify(first, rng)


def _chain(
    references: list[Messages],
    grammar: ActionGrammar,
    rng: random.Random,
    rules: CompositionRules | None,
) -> tuple[Messages, bool]:
    """The references' episodes one after the other under one task; whether a value passed."""
    tasks: list[str] = []
    body: Messages = []
    seen: list[tuple[str, str]] = []  # (app, observation text) of the parts before
    dropped: Messages = []  # final actions of the parts before the last
    passed = False
    for n, ref in enumerate(references):
        ref = [dict(m) for m in ref]
        task = " ".join(str(m.get("content") or "") for m in ref if m.get("role") == "user")
        steps = [m for m in ref if m.get("role") != "user"]
        if seen:
            new_task = _pass_value(task, steps, seen, " ".join(tasks), grammar, rules, rng)
            passed = passed or new_task != task
            task = new_task
        if n < len(references) - 1 and steps and _is_final(steps[-1], grammar):
            dropped.append(steps.pop())  # the episode goes on with the next app
        app = _app(steps, grammar)
        seen += [(app, str(m.get("content") or "")) for m in steps if m.get("role") == "tool"]
        tasks.append(task.strip())
        body += steps
    if body and dropped:
        body[-1] = _last_answer(body[-1], dropped, grammar)
    joined = tasks[0] + "".join(f" Then, {t[:1].lower()}{t[1:]}" for t in tasks[1:])
    return [{"role": "user", "content": joined}, *body], passed


def _last_answer(last: dict[str, Any], dropped: Messages, grammar: ActionGrammar) -> dict[str, Any]:
    """The final turn answering every question of the chain: an earlier part's answer
    replaces a final action without arguments (``finish``), and answers of the same
    one-argument action are joined into one (``answer("2024-05-14; 3")``)."""
    for turn in dropped:
        earlier = grammar.parse_turn(str(turn.get("content") or "")).call
        final = grammar.parse_turn(str(last.get("content") or ""))
        call = final.call
        if earlier is None or not earlier.arguments or call is None:
            continue
        if not call.arguments:
            last = turn
        elif earlier.name == call.name and len(call.arguments) == 1 == len(earlier.arguments):
            key, value = next(iter(call.arguments.items()))
            before = next(iter(earlier.arguments.values()))
            merged = ToolCall(call.name, {key: f"{before}; {value}"})
            last = {**last, "content": final.text[: final.start] + grammar.render_action(merged)}
    return last


def _is_final(message: dict[str, Any], grammar: ActionGrammar) -> bool:
    if message.get("role") != "assistant":
        return False
    return grammar.parse_turn(str(message.get("content") or "")).final


def _app(steps: Messages, grammar: ActionGrammar) -> str:
    for m in steps:
        if m.get("role") == "assistant":
            call = grammar.parse_turn(str(m.get("content") or "")).call
            app = grammar.app_of(call.name) if call is not None else None
            if app is not None:
                return app
    return "the previous"


def _looked_up(steps: Messages, grammar: ActionGrammar, rules: CompositionRules | None) -> str:
    """The values this part's actions look up (not authored), as one text to search in."""
    values: list[str] = []
    for m in steps:
        if m.get("role") != "assistant":
            continue
        call = grammar.parse_turn(str(m.get("content") or "")).call
        if call is None:
            continue
        for arg, value in call.arguments.items():
            if rules is None or f"{call.name}.{arg}" not in rules.authored:
                values.append(json.dumps(value, ensure_ascii=False))
    return "\n".join(values)


def _pass_value(
    task: str,
    steps: Messages,
    seen: list[tuple[str, str]],
    earlier: str,
    grammar: ActionGrammar,
    rules: CompositionRules | None,
    rng: random.Random,
) -> str:
    """Make one value of this part's task come from an earlier part's observation.

    A value of the task that this part's actions look up (an argument the rules do not
    call authored) is replaced, everywhere in the part, by a value of the same shape an
    earlier app printed (and no task named); the task then points at it instead of
    naming it. Returns the new task (the same text when no value could pass).
    """
    looked_up = _looked_up(steps, grammar, rules)
    for noun, pattern in _SHAPES:
        wanted = [v for v in dict.fromkeys(pattern.findall(task)) if v in looked_up]
        offered = [
            (app, v)
            for app, obs in seen
            for v in dict.fromkeys(pattern.findall(obs))
            if v not in task and v not in earlier
        ]
        if wanted and offered:
            old = rng.choice(wanted)
            app, new = rng.choice(offered)
            alone = re.compile(rf"(?<![\w.@/:-]){re.escape(old)}(?![\w@:-])")
            for m in steps:
                m["content"] = alone.sub(new, str(m.get("content") or ""))
            return alone.sub(f"the {noun} from the {app} step", task)
    return task


# --- renaming -------------------------------------------------------------------------------------
def _rename(messages: Messages, rng: random.Random) -> Messages:
    """Every message with one consistent mapping of the entities they share."""
    texts = [str(m.get("content") or "") for m in messages]
    present = {m.group(0): m.lastgroup or "" for t in texts for m in _ENTITY.finditer(t)}
    used = set(present)
    mapping: dict[str, str] = {}
    names = [n for n in sorted(_NAMES) if n not in present and n.lower() not in present]
    rng.shuffle(names)
    factor = rng.uniform(0.6, 1.6)  # one scale for every number: their order is kept
    for value, kind in sorted(present.items()):
        if kind in ("name", "lname"):
            key = value.capitalize()
            if key not in mapping and names:
                mapping[key] = names.pop()
            new = mapping.get(key, value)
            mapping[value] = new if kind == "name" else new.lower()
            continue
        if kind == "time":
            continue
        make = _MAKERS[kind]
        new = _scaled(value, factor) if kind == "num" else make(value, rng)
        for _ in range(20):
            if new not in used:
                break
            new = make(value, rng)
        used.add(new)
        mapping[value] = new
    out = []
    for m, text in zip(messages, texts, strict=True):
        copy = dict(m)
        copy["content"] = _ENTITY.sub(lambda x: mapping.get(x.group(0), x.group(0)), text)
        out.append(copy)
    return out


def _scaled(value: str, factor: float) -> str:
    """A number times the request's factor, with as many decimals; a year stays a year.

    Why one factor for all: a price stays under the limit the task names, a part stays
    smaller than its total, so the episode still makes sense after the renaming.
    """
    whole, _, decimals = value.partition(".")
    if not decimals and 1900 <= int(whole) <= 2099:
        return value
    scaled = float(value) * factor
    return f"{scaled:.{len(decimals)}f}" if decimals else str(max(1, round(scaled)))


def _digits(value: str, rng: random.Random) -> str:
    return "".join(
        rng.choice("123456789" if i == 0 and c != "0" else "0123456789") if c.isdigit() else c
        for i, c in enumerate(value)
    )


def _ident(value: str, rng: random.Random) -> str:
    """Same shape: ``B07QX4M2ZL`` keeps its first letter, ``INV-2231`` its prefix."""
    if "-" in value:
        head, _, tail = value.rpartition("-")
        return f"{head}-{_digits(tail, rng)}"
    first = value[0]
    rest = "".join(
        rng.choice("0123456789")
        if c.isdigit()
        else rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ")
        if c.isupper()
        else c
        for c in value[1:]
    )
    return first + rest


def _date(value: str, rng: random.Random) -> str:
    year, month, _ = value.split("-")
    return f"{year}-{month}-{rng.randint(1, 28):02d}"


_MAKERS: dict[str, Callable[[str, random.Random], str]] = {
    "date": _date,
    "id": _ident,
    "num": _digits,
}


# --- defects --------------------------------------------------------------------------------------
def inject_defect(
    messages: Messages, defect: str, grammar: ActionGrammar, rng: random.Random
) -> bool:
    """Apply one content defect in place, in the grammar's terms.

    Returns:
        False when the episode has nothing the defect applies to, or the defect is not a
        content defect of actions (``malformed_json`` is applied to the rendered text).
    """
    turns = [
        (i, parsed)
        for i, m in enumerate(messages)
        if m.get("role") == "assistant"
        and (parsed := grammar.parse_turn(str(m.get("content") or ""))).call is not None
    ]
    if not turns:
        return False
    i, parsed = rng.choice(turns)
    assert parsed.call is not None
    head, action = parsed.text[: parsed.start], parsed.text[parsed.start :]
    if defect == "unknown_tool":
        known = {a.name for a in grammar.actions}
        new = next(n for n in _UNKNOWN_ACTIONS if n not in known)
        lead = f"{grammar.prefix}{grammar.separator}" if grammar.prefix else ""
        if not action.startswith(lead + parsed.call.name):
            return False  # a fence action without a prefix has no name to change
        messages[i]["content"] = head + lead + new + action[len(lead) + len(parsed.call.name) :]
        return True
    if defect == "wrong_arg_type":
        messages[i]["content"] = head + _broken(action, grammar, parsed.call.name)
        return True
    if defect == "missing_observation":
        answered = [j for j, _ in turns if j + 1 < len(messages)]
        observed = [j for j in answered if messages[j + 1].get("role") == "tool"]
        if not observed:
            return False
        del messages[rng.choice(observed) + 1]
        return True
    return False


def _broken(text: str, grammar: ActionGrammar, name: str) -> str:
    """An action's (canonical) text with malformed arguments: an empty block or bracket,
    an unclosed call, arguments given to a word."""
    action = grammar.action(name)
    assert action is not None
    if action.form == "fence":
        return re.sub(r"```(\w*)\n.*\n```\Z", r"```\1\n\n```", text, flags=re.S)
    if action.form == "bracket":
        return text[: text.index("[")] + "[]"
    if action.form == "call":
        return text[:-1]
    return text + "(1)"
