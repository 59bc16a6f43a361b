"""Grounded answers for any executable domain: the reference's plot replayed on the prompt's
state, every call executed.

Why replay the reference: a grounded amplification prompt shows a real slice of a world and
a reference conversation of the same domain (a seed). The reference already has a plot a
policy allows - identify the user, read, confirm, write - and the domain's ``Environment``
can run any call; what a generic oracle needs is the step in between: the reference's
entities (its user, ids, prices) translated into the state's. So no domain writes episodes
for the devserver, and a domain installed from another package is answered the moment it
is registered.

How a conversation is built (:func:`replay_on`):

1. **Candidates** per argument key come from the state (:class:`Candidates`): every value
   found under that key, each table's keys under the table's id name (``reservations`` ->
   ``reservation_id``), the keys of nested mappings under their singular (``dates`` ->
   ``date``), and those of related keys (``payment_id``, ``payment_methods``); the
   scenario's subject (the first record of its first table) comes first.
2. **The reference's calls, in order.** A call the reference saw refused (its observation
   is ``Error: ...``) is left out, and so is a read without arguments (a "list all": an
   answer about the whole world, which a slice is not). The others keep their arguments,
   completed from the tool's schema where the reference left a required one out, with every
   entity (a string under a key the state has candidates for) translated: through the
   mapping learnt so far, else to what the conversation last showed under that key, else to
   the first candidate not yet used. The call runs on a fork of the world. One the world
   refuses, or answers with nothing (``[]``, ``{}``), is tried again with other values one
   argument at a time, the arguments the refusal names first; a change that gets the call
   past the check that refused it (a refusal not seen before, not about the value just
   tried) is kept, amounts come from what the refusal states and the conversation showed.
   A call no variant gets accepted is dropped.
3. **Alignment.** An accepted observation is walked beside the reference's observation of
   that call (same key, same position), which extends the mapping: the profile's
   reservation ids, a search's flight numbers and prices, an id a lookup returned. Later
   calls then name what earlier ones returned.
4. **Texts.** User and agent messages and reasoning are the reference's with every mapped
   entity replaced; a write (``x-kind: write``) always follows the user's yes. When no call
   of the reference runs on the state, the answer looks the subject up instead
   (:func:`_lookup`).

Every observation is therefore the world's own, and with the scenario a slice that answers
its calls as the full world does, the answer replays faithfully (``factory.envsim.grounding``).
Measured on the domains' own sampled episodes as references (``tests/devserver/test_oracle.py``):
every answer replays with fidelity 1.0 and validates; the reference's write is played where
the state allows it (44 of 50 airline, 38 of 54 retail references).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from factory.core.labels import is_error_observation
from factory.envs.base import Environment

__all__ = ["Candidates", "replay_on", "subject_of"]

Message = dict[str, Any]
State = dict[str, Any]
Path = tuple[Any, ...]

_MAX_TRIES = 160  # executions spent on one call before it is dropped
_MIN_MAPPED_NUMBER = 10  # smaller numbers are counts (bags, passengers): kept as they are
_ASK = "Shall I go ahead (yes/no)?"
_YES = ("Yes, please.", "Yes.", "Yes, go ahead.", "Yes, that's right.")
_ARITHMETIC = frozenset("0123456789+-*/(). ")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")


def subject_of(state: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(key, record)`` of the scenario's subject: the first record of its first table,
    which must be a JSON object; None when there is none."""
    for table in state.values():
        if not isinstance(table, dict):
            return None
        for key, record in table.items():
            return (key, record) if isinstance(key, str) and isinstance(record, dict) else None
        return None
    return None


def _singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _stem(key: str) -> str:
    for suffix in ("_ids", "_id", "_numbers", "_number"):
        if key.endswith(suffix) and len(key) > len(suffix):
            return _singular(key[: -len(suffix)])
    return _singular(key)


def _related(key: str, other: str) -> bool:
    """Whether two keys name the same kind of thing (``payment_id`` and ``payment_methods``,
    ``new_item_ids`` and ``item_id``)."""
    a, b = _stem(key), _stem(other)
    return a == b or any(x.startswith(y + "_") or x.endswith("_" + y) for x, y in ((a, b), (b, a)))


class Candidates:
    """Values a call on ``state`` may name, per key, the subject's first."""

    def __init__(self, state: State) -> None:
        self._by_key: dict[str, list[str]] = {}
        subject = subject_of(state)
        if subject is not None:
            first_table = next(iter(state))
            self._add(self._id_name(first_table, *subject), subject[0])
            self._walk(subject[1], "")
        for table, records in state.items():
            if not isinstance(records, dict):
                continue
            for key, record in records.items():
                if isinstance(key, str):
                    self._add(self._id_name(table, key, record), key)
                self._walk(record, "")

    @staticmethod
    def _id_name(table: str, key: str, record: Any) -> str:
        """The key a table's ids go by: the record's field holding its own key, else
        ``<singular>_id``."""
        if isinstance(record, dict):
            for name, value in record.items():
                if value == key and isinstance(name, str):
                    return name
        return f"{_singular(table)}_id"

    def _add(self, key: str, value: str) -> None:
        values = self._by_key.setdefault(key, [])
        if value not in values:
            values.append(value)

    def _walk(self, value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and isinstance(v, dict) and key:
                    self._add(_singular(key), k)  # a mapping keyed by ids or dates
                self._walk(v, str(k))
        elif isinstance(value, list):
            for item in value:
                self._walk(item, key)
        elif isinstance(value, str) and key and value:
            self._add(key, value)

    def of(self, key: str) -> list[str]:
        """Candidates for an argument named ``key``: its own, then those of keys with its stem."""
        out = list(self._by_key.get(key, ()))
        for other, values in self._by_key.items():
            if other != key and _related(key, other):
                out += [v for v in values if v not in out]
        return out


@dataclass
class _Slot:
    """One scalar of a call's arguments: where it is, what the reference had there."""

    path: Path
    key: str
    value: Any


@dataclass
class _Replay:
    """The mapping learnt so far and what the conversation has shown."""

    env: Environment
    candidates: Candidates
    schemas: Mapping[str, Any]  # tool -> its parameters' JSON Schema
    kinds: Mapping[str, str]
    enums: Mapping[str, Sequence[str]]
    rng: random.Random
    mapping: dict[str, str] = field(default_factory=dict)
    numbers: dict[float, Any] = field(default_factory=dict)
    #: per key, the strings this conversation's calls and observations showed, latest first
    seen: dict[str, list[str]] = field(default_factory=dict)
    shown: list[Any] = field(default_factory=list)  # numbers they showed, in order

    def images(self) -> set[str]:
        return set(self.mapping.values())

    def show(self, value: Any) -> None:
        """Remember what a call or an observation showed (what an agent may act on next)."""
        for slot in _slots(value):
            if _is_number(slot.value):
                self.shown.append(slot.value)
            elif isinstance(slot.value, str) and slot.key and slot.value:
                values = self.seen.setdefault(slot.key, [])
                if slot.value in values:
                    values.remove(slot.value)
                values.insert(0, slot.value)

    def shown_under(self, key: str) -> list[str]:
        """What the conversation showed under ``key`` (or a key of its stem), latest first."""
        out = list(self.seen.get(key, ()))
        for other, values in self.seen.items():
            if other != key and _related(key, other):
                out += [v for v in values if v not in out]
        return out

    def options(self, key: str) -> list[str]:
        """Values for an argument named ``key``: what the conversation showed, then the
        state's candidates."""
        out = self.shown_under(key)
        return out + [v for v in self.candidates.of(key) if v not in out]


def _slots(value: Any, path: Path = (), key: str = "") -> Iterator[_Slot]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _slots(v, (*path, k), str(k))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _slots(item, (*path, i), key)
    else:
        yield _Slot(path, key, value)


def _put(value: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _put(value[head], rest, new)}
    copy = list(value)
    copy[head] = _put(copy[head], rest, new)
    return copy


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _arithmetic(text: str) -> bool:
    """An arithmetic expression (``(70) * 1 + 50``), not a date or a code."""
    operator = any(op in text for op in ("+", "*", "/", " - "))
    return operator and set(text) <= _ARITHMETIC and bool(_NUMBER.search(text))


def _translate_slot(rp: _Replay, slot: _Slot, fresh: dict[str, str]) -> Any:
    """The reference's value at ``slot`` in the state's terms (``fresh``: new assignments)."""
    value = slot.value
    if _is_number(value):
        return rp.numbers.get(float(value), value)
    if not isinstance(value, str):
        return value
    if value in rp.mapping:
        return rp.mapping[value]
    if value in fresh:
        return fresh[value]
    if _arithmetic(value):  # an expression of the reference's numbers (calculate)
        return _NUMBER.sub(lambda m: _number_text(rp.numbers.get(float(m[0])), m[0]), value)
    if value in rp.enums.get(slot.key, ()):
        return value
    shown = rp.shown_under(slot.key)
    pool = rp.candidates.of(slot.key)
    if value in pool or not (shown or pool):
        return value
    # What the conversation just showed first (the reference acted on its own results),
    # else a candidate of the state no other entity of the reference took.
    used = rp.images() | set(fresh.values())
    choice = shown[0] if shown else next((c for c in pool if c not in used), pool[0])
    fresh[value] = choice
    return choice


def _number_text(new: Any, old: str) -> str:
    if new is None:
        return old
    return str(int(new)) if float(new).is_integer() and "." not in old else str(new)


def _lists(value: Any) -> Iterator[int]:
    """Lengths of the lists in a call's arguments (how many passengers, items ...)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _lists(v)
    elif isinstance(value, list):
        yield len(value)
        for v in value:
            yield from _lists(v)


def _alternatives(
    rp: _Replay, slot: _Slot, current: Any, counts: Sequence[int], refusal: str, rest: float
) -> list[Any]:
    """Other values to try at ``slot``: enum values, what the conversation showed, the
    state's candidates. For a count (a small number), the other small numbers; for an
    amount, those the refusal states (less ``rest``, what other arguments of the same key
    already hold: a total split over several entries), the amounts shown and totals of
    them (a price times a count the call holds)."""
    if _is_number(slot.value):
        if abs(current) < _MIN_MAPPED_NUMBER:
            return [n for n in range(_MIN_MAPPED_NUMBER) if n != current]
        stated = [_number(m) for m in _NUMBER.findall(refusal)]
        split = [n - rest for n in stated if rest and n > rest]
        shown = [n for n in dict.fromkeys(reversed(rp.shown)) if abs(n) >= _MIN_MAPPED_NUMBER]
        totals = [n * k for k in sorted(set(counts) - {0, 1}) for n in shown[:30]]
        options = [*stated, *split, *shown[:30], *totals]
        return [n for n in dict.fromkeys(options) if n != current][:80]
    if not isinstance(slot.value, str):
        return []
    options = list(rp.enums.get(slot.key, ())) or rp.options(slot.key)
    return [o for o in options if o != current][:30]


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def _usable(observation: str) -> bool:
    return not is_error_observation(observation) and observation.strip() not in ("[]", "{}")


def _shape(observation: str) -> str:
    """A refusal without its particulars (ids, amounts): which check refused the call."""
    return re.sub(r"\S*\d\S*|'[^']*'|\"[^\"]*\"", "_", observation)


def _run_call(rp: _Replay, name: str, reference: Any) -> tuple[Any, str] | None:
    """Run the reference's call translated; when the world refuses it, try other values one
    argument at a time, keeping a change that gets the call past the check that refused it
    (a refusal not seen before), until the world accepts the call or the tries run out.

    Returns:
        ``(arguments, observation)`` (the world is stepped, the mapping extended), or None
        when no variant is accepted: the call is dropped.
    """
    if not isinstance(reference, dict):
        return None
    reference = _complete(rp, reference, rp.schemas.get(name) or {})
    fresh: dict[str, str] = {}
    slots = list(_slots(reference))
    arguments: Any = reference
    for slot in slots:
        arguments = _put(arguments, slot.path, _translate_slot(rp, slot, fresh))
    counts = list(_lists(reference))
    fork = rp.env.copy()
    observation = fork.execute(name, arguments)
    refusals = {_shape(observation)}
    tries = 0
    for _ in range(2):  # two passes: a later fix can make an earlier argument matter
        # The arguments whose value the refusal names first: it is what the world refused.
        named = [s for s in slots if _names(observation, _get(arguments, s.path))]
        for slot in named + [s for s in slots if s not in named]:
            if _usable(observation) or tries >= _MAX_TRIES:
                break
            current = _get(arguments, slot.path)
            rest = sum(
                _get(arguments, s.path)
                for s in slots
                if s is not slot and s.key == slot.key and _is_number(_get(arguments, s.path))
            )
            options = _alternatives(rp, slot, current, counts, observation, rest)
            for option in options:
                tries += 1
                variant = _put(arguments, slot.path, option)
                trial = rp.env.copy()
                answer = trial.execute(name, variant)
                # A new refusal about another argument: the call got past the check that
                # refused it. One that names the value just tried refuses that value.
                moved = _shape(answer) not in refusals and not _names(answer, option)
                if _usable(answer) or moved:
                    refusals.add(_shape(answer))
                    arguments, observation, fork = variant, answer, trial
                    if isinstance(slot.value, str) and slot.value not in rp.mapping:
                        fresh[slot.value] = option
                    break
                if tries >= _MAX_TRIES:
                    break
    if not _usable(observation):
        return None
    rp.env = fork
    for old, new in fresh.items():
        rp.mapping.setdefault(old, new)
    return arguments, observation


def _complete(rp: _Replay, arguments: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with every required argument the reference left out filled from the
    tool's schema: an enum's first value, what the conversation showed or the state holds
    under that name, a number 0, one item of a list (a reference written by hand or by a
    model may skip arguments the world needs)."""
    out = dict(arguments)
    properties = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if name not in out and isinstance(properties.get(name), dict):
            value = _value(rp, str(name), properties[name])
            if value is not None:
                out[name] = value
    return out


def _value(rp: _Replay, key: str, schema: Mapping[str, Any]) -> Any:
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return _complete(rp, {}, schema)
    if kind == "array":
        item = _value(rp, _singular(key), schema.get("items") or {})
        return [] if item is None else [item]
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    options = rp.options(key)
    return options[0] if options else None


def _names(refusal: str, value: Any) -> bool:
    """Whether a refusal names ``value`` (as a whole word)."""
    text = str(value)
    return bool(text) and re.search(rf"(?<![\w.]){re.escape(text)}(?![\w.])", refusal) is not None


def _get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _json(text: Any) -> Any:
    """The JSON value of an observation (an object, a list, a string or a number), else None."""
    if not isinstance(text, str):
        return None
    if text.lstrip()[:1] not in ("{", "[", '"') and not _NUMBER.fullmatch(text.strip()):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _align(rp: _Replay, old: Any, new: Any) -> None:
    """Learn the mapping from the reference's observation ``old`` and the world's ``new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        common = [k for k in old if k in new]
        for k in common:
            _align(rp, old[k], new[k])
        rest_old = [k for k in old if k not in new]
        rest_new = [k for k in new if k not in old]
        if rest_old and len(rest_old) == len(rest_new):  # mappings keyed by ids
            for a, b in zip(rest_old, rest_new, strict=True):
                _learn(rp, a, b)
                _align(rp, old[a], new[b])
    elif isinstance(old, list) and isinstance(new, list):
        for a, b in zip(old, new, strict=False):
            _align(rp, a, b)
    else:
        _learn(rp, old, new)


def _learn(rp: _Replay, old: Any, new: Any) -> None:
    if _is_number(old) and _is_number(new):
        if abs(old) >= _MIN_MAPPED_NUMBER:  # an amount or a price, not a count
            rp.numbers.setdefault(float(old), new)
    elif (
        isinstance(old, str)
        and isinstance(new, str)
        and old
        and old != new
        and old not in rp.mapping
        and new not in rp.images()
        and " " not in old.strip()
    ):
        rp.mapping[old] = new


def _text(rp: _Replay, text: Any) -> str:
    """The reference's text with every mapped entity replaced (longest first, whole words)."""
    if not isinstance(text, str) or not text:
        return text if isinstance(text, str) else ""
    olds = sorted((o for o in rp.mapping if len(o) >= 3), key=len, reverse=True)
    if not olds:
        return text
    pattern = re.compile(r"(?<![\w@.-])(" + "|".join(map(re.escape, olds)) + r")(?![\w@-])")
    return pattern.sub(lambda m: rp.mapping[m[1]], text)


def replay_on(
    env: Environment,
    reference: Sequence[Mapping[str, Any]],
    rng: random.Random,
    *,
    tools: Sequence[Mapping[str, Any]],
    enums: Mapping[str, Sequence[str]],
) -> list[Message] | None:
    """The reference (output-format messages) replayed on ``env``'s state (see the module).

    Args:
        env: a world over the scenario; it is stepped.
        reference: the reference conversation (``{"role", "content", "tool_calls", ...}``).
        rng: the request's content random source.
        tools: the domain's tool specs with ``x-kind`` (a write follows the user's yes).
        enums: per key, values that are not entities (kept, tried as alternatives).

    Returns:
        The messages; when no call of the reference runs on the state, a lookup of the
        scenario's subject instead (:func:`_lookup`); None when not even that runs.
    """
    kinds = {str(t.get("name")): str(t.get("x-kind", "generic")) for t in tools}
    schemas = {str(t.get("name")): t.get("parameters") or {} for t in tools}
    rp = _Replay(env, Candidates(env.state), schemas, kinds, enums, rng)
    plan: list[tuple[Mapping[str, Any], list[tuple[str, Any, str]]]] = []
    ran = 0
    for i, message in enumerate(reference):
        calls: list[tuple[str, Any, str]] = []
        replies = [m for m in reference[i + 1 :] if m.get("role") == "tool"]
        for k, call in enumerate(message.get("tool_calls") or ()):
            name = str(call.get("name") or "")
            answer = replies[k] if k < len(replies) else {}
            recorded = str(answer.get("content") or "")
            if is_error_observation(recorded) or name not in env.tool_names:
                continue
            if not call.get("arguments") and kinds.get(name) == "read":
                continue  # "list all": an answer about the whole world, which a slice is not
            done = _run_call(rp, name, call.get("arguments"))
            if done is None:
                continue
            arguments, observation = done
            new, old = _json(observation), _json(recorded)
            if new is not None and old is not None:
                _align(rp, old, new)
            else:
                _learn(rp, recorded.strip(), observation.strip())
            rp.show(arguments)
            rp.show(new)
            calls.append((name, arguments, observation))
            ran += 1
        plan.append((message, calls))
    if not ran:
        return _lookup(rp, tools)
    return _messages(rp, plan)


def _call_message(name: str, arguments: Any, reasoning: str) -> Message:
    step: Message = {"role": "assistant", "content": ""}
    if reasoning:
        step["reasoning"] = reasoning
    step["tool_calls"] = [{"name": name, "arguments": arguments}]
    return step


def _lookup(rp: _Replay, tools: Sequence[Mapping[str, Any]]) -> list[Message] | None:
    """The subject looked up, when the reference's plot does not run on the state: the
    first read tool whose required arguments the state fills, one taking the subject's id
    before the others."""
    subject = subject_of(rp.env.state)
    if subject is None:
        return None
    reads = []
    for tool in tools:
        name = str(tool.get("name"))
        if rp.kinds.get(name) != "read" or name not in rp.env.tool_names:
            continue
        required = (tool.get("parameters") or {}).get("required") or []
        options = {str(p): rp.options(str(p)) for p in required}
        if all(options.values()):
            takes_subject = any(values[0] == subject[0] for values in options.values())
            reads.append((not takes_subject, name, {p: v[0] for p, v in options.items()}))
    for _, name, arguments in sorted(reads, key=lambda r: r[0]):
        observation = rp.env.copy().execute(name, arguments)
        if not _usable(observation):
            continue
        said = ", ".join(f"my {p.replace('_', ' ')} is {v}" for p, v in arguments.items())
        return [
            {"role": "user", "content": f"Hi! Could you look up what you have on me? {said}."},
            _call_message(name, arguments, ""),
            {"role": "tool", "name": name, "content": observation},
            {"role": "assistant", "content": "Here is what I found on your account."},
        ]
    return None


def _messages(
    rp: _Replay, plan: list[tuple[Mapping[str, Any], list[tuple[str, Any, str]]]]
) -> list[Message]:
    out: list[Message] = []
    for message, calls in plan:
        role = message.get("role")
        if role == "tool":
            continue
        if role == "user":
            out.append({"role": "user", "content": _text(rp, message.get("content"))})
            continue
        if role != "assistant":
            continue
        reasoning = _text(rp, message.get("reasoning"))
        if not message.get("tool_calls"):
            said: Message = {"role": "assistant", "content": _text(rp, message.get("content"))}
            if reasoning:
                said["reasoning"] = reasoning
            out.append(said)
            continue
        for name, arguments, observation in calls:
            if rp.kinds.get(name) == "write" and not (out and out[-1]["role"] == "user"):
                out.append({"role": "assistant", "content": _ASK})
                out.append({"role": "user", "content": rp.rng.choice(_YES)})
            out.append(_call_message(name, arguments, reasoning))
            out.append({"role": "tool", "name": name, "content": observation})
    while out and out[0]["role"] != "user":
        out.pop(0)
    if out and (out[-1]["role"] != "assistant" or out[-1].get("tool_calls")):
        out.append({"role": "assistant", "content": "Is there anything else I can help with?"})
    return out
