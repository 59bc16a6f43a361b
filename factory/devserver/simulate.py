"""What the development server's simulated model answers (pure functions, no I/O).

Why simulate rather than echo: the pipeline downstream of the model (parser,
repair, validation, dedup) must see *new* trajectories that still hang
together, or dedup collapses every answer onto the seed and validation tests
nothing. ``amplify`` therefore keeps the reference's tools and turn structure
and consistently renames what a real model would vary: person names, ids
(keeping their shape), places with their names (a domain's vocabulary,
from its plug-in: airports and their cities), and dates (shifted within
their month). One mapping is applied to every string -- user and assistant
text, reasoning, tool arguments, observations -- so the result stays
self-consistent and valid against the same tool schemas.

The expensive part (finding entities) is done once per reference by
``compile_reference``; a request only draws a mapping and fills the template,
which keeps a 30-turn reference well under a millisecond.

A simulate prompt (``factory.envsim.simulator``) is answered by a *perfect*
simulator: the call is executed on the given state slice in the world of
the domain whose state it is (the first registered domain that accepts it)
and the answer is the real observation and the exact Δ, so a metric run
against the devserver must score 100% unless a defect is switched on. A prompt in
EnvSimBench's SFT layout (``factory.envsim.envsimbench``: environment code, then
``{"initial_config", "tool_call"}``) gets the same perfect answer in that layout's
terms (``feedback`` and dotted ``config_changes``) when the state is one of ours.

One module on purpose (about 880 lines): it is the one simulated model the app
calls as ``simulate.<answer>``. Half of it is the reference compiler and the
renamer, which share the vocabulary and the compiled template's private types;
the simulation, judge and content-defect answers (about 220 lines) read the
same references and prompt blocks.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from factory.core.delta import diff
from factory.devserver import domains
from factory.envsim.envsimbench import CODE_MARKER, diff_dicts, read_sft_prompt
from factory.envsim.simulator import SIM_MARKER, STATE_MARKER, SampleError

__all__ = [
    "AMPLIFY_MARKER",
    "CONTENT_DEFECTS",
    "JUDGE_MARKER",
    "SIM_MARKER",
    "Reference",
    "amplify",
    "answer_other",
    "break_json",
    "compile_reference",
    "drop_change",
    "extract_block",
    "inject_defect",
    "judge",
    "last_user_text",
    "prompt_kind",
    "read_simulation",
    "reference_from_block",
    "reference_messages",
    "render_json",
    "simulate_call",
    "simulate_envsimbench",
    "vary_opening",
]

AMPLIFY_MARKER = "### Reference trajectory"
JUDGE_MARKER = "### Trajectory to judge"
CONTENT_DEFECTS: tuple[str, ...] = (
    "malformed_json",
    "unknown_tool",
    "wrong_arg_type",
    "missing_observation",
)

FIRST_NAMES: tuple[str, ...] = (
    "Adele", "Akira", "Alejandro", "Amara", "Anton", "Beatriz", "Bilal", "Camila", "Chidi",
    "Clara", "Dmitri", "Elif", "Esther", "Felix", "Gabriel", "Hana", "Hugo", "Ines", "Jonas",
    "Kai", "Kenji", "Leila", "Lorenzo", "Malik", "Marta", "Nadia", "Nikolai", "Oscar", "Priya",
    "Quentin", "Rafael", "Rosa", "Samir", "Selin", "Tariq", "Thea", "Tomas", "Uma", "Valeria",
    "Viktor", "Wen", "Ximena", "Yosef", "Yuki", "Zara", "Zoltan",
)  # fmt: skip
LAST_NAMES: tuple[str, ...] = (
    "Abbott", "Bauer", "Becker", "Castillo", "Chowdhury", "Dubois", "Eriksen", "Fischer",
    "Fujita", "Haddad", "Hoang", "Ibrahim", "Jensen", "Kaur", "Keller", "Kowalski", "Larsen",
    "Mendoza", "Moreau", "Nakamura", "Novak", "Okafor", "Olsen", "Park", "Petrov", "Quinn",
    "Ramos", "Reyes", "Schmidt", "Shah", "Sato", "Tanaka", "Torres", "Vargas", "Volkov",
    "Weber", "Yilmaz", "Zhou",
)  # fmt: skip
_MONTHS = {name: i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name: i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["Sept"] = 9
# Capitalised words that are names in a profile but ordinary words in text: never renamed.
_NOT_RENAMED = frozenset(_MONTHS) | frozenset(calendar.day_name) | {
    "Will", "Grace", "Hope", "Joy", "Faith", "Bill", "Mark", "Rose", "Summer", "Dawn", "Sky",
    "Art", "Guy", "Page", "Young", "Long", "King", "White", "Black", "Green",
}  # fmt: skip
_NAME_RE = re.compile(r"[A-Z][a-z]+")
_USER_ID_RE = re.compile(r"([a-z]+)_([a-z]+)_(\d+)")
_LITERAL_ID_RE = re.compile(r"[A-Za-z0-9_]{4,40}")
# A code with a letter prefix keeps it (HAT123, W2378156): the prefix is the id's format.
_PREFIXED_ID_RE = re.compile(r"([A-Z]{1,3})(\d{3,8})")
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
_DIGITS = "0123456789"

_MONTH_ALT = "|".join(sorted(_MONTHS, key=len, reverse=True))
_HEAD = (
    r"(?P<email>\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\b)"
    r"|(?P<iso>\b(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})(?!\d))"
    rf"|(?P<md>\b(?P<mon>{_MONTH_ALT})\.? (?P<day>\d{{1,2}})(?P<suf>st|nd|rd|th)?\b)"
)
_TAIL = r"|(?P<uid>\b[a-z]+(?:_[a-z]+)*_\d{3,}\b)|(?P<up>\b[A-Z0-9]{6,8}\b)"


@dataclass(frozen=True)
class _Vocabulary:
    """The places and id keys of every registered domain (``factory.devserver.domains``:
    derived from the domains' worlds, places from their plug-ins' ``places``)."""

    places: dict[str, str]  # code -> name: renaming targets
    every_place: dict[str, str]  # with the source-only ones
    code_of: dict[str, str]  # name -> code of the targets
    id_keys: frozenset[str]
    tail: str  # the entity regex after the reference's literals


@lru_cache(maxsize=1)
def _vocabulary() -> _Vocabulary:
    known = domains.vocabulary()
    places = known.places
    code_of = {name: code for code, name in places.items()}
    tail = _TAIL
    if places:  # an empty alternation would match at every word boundary
        codes = "|".join([*places, *(c for c in known.every_place if c not in places)])
        names = "|".join(sorted(code_of, key=len, reverse=True))
        tail += rf"|(?P<apt>\b(?:{codes})\b)|(?P<city>\b(?:{names})\b)"
    return _Vocabulary(places, {**known.every_place, **places}, code_of, known.id_keys, tail)


# --------------------------------------------------------------------------------------
# Prompt recognition
# --------------------------------------------------------------------------------------
def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def last_user_text(messages: list[Any]) -> str:
    """Text of the last user message ('' when there is none)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def prompt_kind(messages: list[Any]) -> str:
    """Recognise the prompt by the markers of the shared prompt contract.

    Returns:
        ``"amplify"``, ``"judge"``, ``"simulate"``, ``"simulate_envsimbench"`` or ``"other"``.
    """
    # A marker counts only as a line of its own: a seed quoting a heading inside its
    # (JSON-escaped) text cannot change what kind of prompt it is.
    lines = set(last_user_text(messages).splitlines())
    if AMPLIFY_MARKER in lines:
        return "amplify"
    if JUDGE_MARKER in lines:
        return "judge"
    if SIM_MARKER in lines:
        return "simulate"
    if CODE_MARKER in lines:
        return "simulate_envsimbench"
    return "other"


def extract_block(text: str, marker: str) -> str | None:
    """The fenced block that follows ``marker`` (its inner text), or None."""
    at = text.find(marker)
    if at < 0:
        return None
    fence = text.find("```", at + len(marker))
    if fence < 0:
        return None
    start = text.find("\n", fence)
    end = text.find("\n```", start)
    if start < 0 or end < 0:
        return None
    return text[start + 1 : end]


# --------------------------------------------------------------------------------------
# Reference templates
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ent:
    """One entity occurrence: what kind, its original text, parsed extras (dates)."""

    kind: str
    value: str
    data: tuple[int, ...] = ()


class _Tpl:
    """A string with entity holes, as a ``str.format`` pattern over the entity values.

    ``str.format`` fills every hole of a string in one C call, which keeps a
    request's rendering cheap.
    """

    __slots__ = ("fmt",)

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt


@dataclass
class Reference:
    """A parsed reference trajectory compiled into a renaming template."""

    raw: dict[str, Any]
    messages: list[dict[str, Any]]  # output-format messages whose strings may be _Tpl
    entities: tuple[_Ent, ...] = ()  # distinct entities; _Tpl holes index into it
    first_names: tuple[str, ...] = ()
    last_names: tuple[str, ...] = ()
    places: tuple[str, ...] = ()  # codes (an airport), renamed with their names
    month_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    ids: frozenset[str] = frozenset()


@dataclass
class _Found:
    first: set[str] = field(default_factory=set)
    last: set[str] = field(default_factory=set)
    ids: set[str] = field(default_factory=set)
    user_ids: set[str] = field(default_factory=set)
    fours: set[str] = field(default_factory=set)


def _gather(value: Any, key: str, found: _Found) -> None:
    """Collect names and ids from structured data (arguments, JSON observations)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _gather(v, k, found)
    elif isinstance(value, list):
        for item in value:
            _gather(item, key, found)
    elif isinstance(value, str):
        if key == "first_name" and _NAME_RE.fullmatch(value):
            found.first.add(value)
        elif key == "last_name" and _NAME_RE.fullmatch(value):
            found.last.add(value)
        elif key == "last_four" and value.isdigit() and len(value) == 4:
            found.fours.add(value)
        elif (
            key in _vocabulary().id_keys or key.endswith(("_id", "_ids"))
        ) and _LITERAL_ID_RE.fullmatch(value):
            if key == "user_id":
                found.user_ids.add(value)
            if not value.isalpha() or not value.islower():
                found.ids.add(value)


def _content(message: dict[str, Any]) -> str:
    return _text_of(message.get("content"))


def _normalise_call(call: Any) -> dict[str, Any]:
    """A call in output format; tolerates OpenAI's ``function`` wrapper and string args."""
    if not isinstance(call, dict):
        return {"name": "", "arguments": {}}
    fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    return {"name": str(fn.get("name") or ""), "arguments": {} if args is None else args}


def reference_messages(reference: Reference) -> list[dict[str, Any]]:
    """The reference's messages in the output format, as plain values (not templates)."""
    return _normalise(reference.raw)


def _normalise(reference: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in reference.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        msg: dict[str, Any] = {"role": role}
        if role == "tool":
            msg["name"] = str(m.get("name") or "")
        if role == "assistant" and isinstance(m.get("reasoning"), str) and m["reasoning"]:
            msg["reasoning"] = m["reasoning"]
        msg["content"] = _content(m)
        if role == "assistant" and isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
            msg["tool_calls"] = [_normalise_call(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


def _month_length(year: int | None, month: int) -> int:
    if year is None:
        return 29 if month == 2 else calendar.monthrange(2023, month)[1]
    return calendar.monthrange(year, month)[1]


def _brace(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class _Compiler:
    """Turns strings into templates with one reference-specific regex."""

    def __init__(self, found: _Found) -> None:
        self.kind_of: dict[str, str] = {}
        for name in found.first:
            self.kind_of[name] = "first"
        for name in found.last:
            self.kind_of.setdefault(name, "last")
        for name in [n for n in self.kind_of if n in _NOT_RENAMED]:
            del self.kind_of[name]
        for four in found.fours:
            if not 1900 <= int(four) <= 2099:  # a year-like card number would rename years
                self.kind_of[four] = "four"
        for ident in found.ids:
            self.kind_of.setdefault(ident, "id")
        literals = sorted(self.kind_of, key=len, reverse=True)
        lit = (
            "|(?<![A-Za-z0-9_])(?P<lit>" + "|".join(map(re.escape, literals)) + ")(?![A-Za-z0-9_])"
            if literals
            else ""
        )
        self.regex = re.compile(_HEAD + lit + _vocabulary().tail)
        self.places: set[str] = set()
        self.idents: set[str] = set(found.ids)
        self.entities: list[_Ent] = []
        self.index: dict[tuple[str, str], int] = {}
        self.ranges: dict[int, tuple[int, int]] = {}

    def _date(self, year: int | None, month: int, day: int) -> bool:
        if not 1 <= month <= 12 or not 1 <= day <= _month_length(year, month):
            return False
        lo, hi = self.ranges.get(month, (-31, 31))
        self.ranges[month] = (max(lo, 1 - day), min(hi, _month_length(year, month) - day))
        return True

    def _entity(self, m: re.Match[str]) -> _Ent | None:
        kind = m.lastgroup
        text = m.group(0)
        if kind == "iso":
            y, mo, d = int(m["y"]), int(m["m"]), int(m["d"])
            return _Ent("iso", text, (y, mo, d)) if self._date(y, mo, d) else None
        if kind == "md":
            mo, d = _MONTHS[m["mon"]], int(m["day"])
            return (
                _Ent("md", text, (mo, d, 1 if m["suf"] else 0)) if self._date(None, mo, d) else None
            )
        if kind == "lit":
            return _Ent(self.kind_of[text], text)
        if kind == "up" and (text.isdigit() or text.isalpha()):
            return None
        if kind in ("up", "uid"):
            self.idents.add(text)
        elif kind == "apt":
            self.places.add(text)
        elif kind == "city":
            self.places.add(_vocabulary().code_of[text])
        return _Ent(kind or "", text)

    def template(self, text: str) -> str | _Tpl:
        parts: list[str] = []
        pos = 0
        for m in self.regex.finditer(text):
            ent = self._entity(m)
            if ent is None:
                continue
            key = (ent.kind, ent.value)
            index = self.index.get(key)
            if index is None:
                index = self.index[key] = len(self.entities)
                self.entities.append(ent)
            parts.append(_brace(text[pos : m.start()]))
            parts.append(f"{{{index}}}")
            pos = m.end()
        if not parts:
            return text
        parts.append(_brace(text[pos:]))
        return _Tpl("".join(parts))

    def walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.template(value)
        if isinstance(value, dict):
            return {k: self.walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v) for v in value]
        return value


def compile_reference(reference: dict[str, Any]) -> Reference:
    """Find the reference's entities once so each amplification only fills holes.

    Args:
        reference: ``{"messages": [...]}`` in the amplification output format.

    Returns:
        A ``Reference`` template; ``amplify`` renders it.
    """
    messages = _normalise(reference)
    found = _Found()
    for m in messages:
        for call in m.get("tool_calls", ()):
            _gather(call["arguments"], "", found)
        text = m["content"].lstrip()
        if m["role"] == "tool" and text[:1] in ("{", "["):
            with contextlib.suppress(ValueError):
                _gather(json.loads(text), "", found)
    for uid in found.user_ids:
        parts = _USER_ID_RE.fullmatch(uid)
        if parts:
            found.first.add(parts[1].capitalize())
            found.last.add(parts[2].capitalize())
    comp = _Compiler(found)
    compiled = []
    for m in messages:
        out = dict(m)  # role and tool names are never renamed
        out["content"] = comp.walk(m["content"])
        if "reasoning" in m:
            out["reasoning"] = comp.walk(m["reasoning"])
        if "tool_calls" in m:
            out["tool_calls"] = [
                {"name": c["name"], "arguments": comp.walk(c["arguments"])} for c in m["tool_calls"]
            ]
        compiled.append(out)
    first = tuple(sorted(n for n, k in comp.kind_of.items() if k == "first"))
    last = tuple(sorted(n for n, k in comp.kind_of.items() if k == "last"))
    return Reference(
        raw=reference,
        messages=compiled,
        first_names=first,
        last_names=last,
        places=tuple(sorted(comp.places)),
        month_ranges=dict(sorted(comp.ranges.items())),
        ids=frozenset(comp.idents),
        entities=tuple(comp.entities),
    )


@lru_cache(maxsize=8192)  # a 90k benchmark cycles 1.5k references: keep them all
def reference_from_block(block: str) -> Reference | None:
    """Parse and compile a fenced reference block; None when it is not a trajectory.

    Cached by the block text: a benchmark amplifies each seed many times.
    """
    try:
        data = json.loads(block)
    except ValueError:
        return None
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return None
    return compile_reference(data)


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------
def _ordinal(day: int) -> str:
    if 11 <= day % 100 <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


class _Renamer:
    """One request's consistent mapping, drawn entity by entity in first-occurrence order."""

    def __init__(self, ref: Reference, rng: random.Random) -> None:
        self.rng = rng
        self.names: dict[str, str] = {}
        for present, pool in ((ref.first_names, FIRST_NAMES), (ref.last_names, LAST_NAMES)):
            free = [n for n in pool if n not in present]
            chosen = rng.sample(free, min(len(free), len(present)))
            self.names.update(zip(present[: len(chosen)], chosen, strict=True))
        self.lower = {k.lower(): v.lower() for k, v in self.names.items()}
        known = _vocabulary().places
        targets = [c for c in known if c not in ref.places]
        if len(targets) < len(ref.places):  # many places: permute them among themselves
            targets = sorted(set(known) | set(ref.places))
        self.places = dict(zip(ref.places, rng.sample(targets, len(ref.places)), strict=True))
        self.deltas: dict[int, int] = {}
        for month, (lo, hi) in ref.month_ranges.items():
            choices = [d for d in range(lo, hi + 1) if d] or [0]
            self.deltas[month] = rng.choice(choices)
        self.used: set[str] = set(ref.ids)

    def __call__(self, ent: _Ent) -> str:
        return self._make(ent)

    def _fresh(self, make: Callable[[], str]) -> str:
        """A new value that is neither an original id nor one already handed out."""
        for _ in range(50):
            out = make()
            if out not in self.used:
                break
        self.used.add(out)
        return out

    def _chars(self, text: str) -> str:
        """Same letter/digit pattern, fresh characters."""
        n = len(text)
        digits, letters = self.rng.choices(_DIGITS, k=n), self.rng.choices(_UPPER, k=n)
        return "".join(
            digits[i]
            if c.isdigit()
            else letters[i]
            if c.isupper()
            else letters[i].lower()
            if c.islower()
            else c
            for i, c in enumerate(text)
        )

    def _digits(self, digits: str) -> str:
        """Same number of digits; no leading zero unless the original had one."""
        if not digits:
            return digits
        head = str(self.rng.randint(1, 9)) if digits[0] != "0" else "0"
        if len(digits) == 1:
            return head
        return head + str(self.rng.randrange(10 ** (len(digits) - 1))).zfill(len(digits) - 1)

    def _ident(self, value: str) -> str:
        user = _USER_ID_RE.fullmatch(value)
        if user and user[1] in self.lower and user[2] in self.lower:
            head = f"{self.lower[user[1]]}_{self.lower[user[2]]}_"
            return self._fresh(lambda: head + self._digits(user[3]))
        prefixed = _PREFIXED_ID_RE.fullmatch(value)
        if prefixed:
            return self._fresh(lambda: prefixed[1] + self._chars(prefixed[2]))
        head, sep, tail = value.rpartition("_")
        if sep and tail and head.replace("_", "").isalpha() and head.islower():
            new_tail = self._digits if tail.isdigit() else self._chars
            return self._fresh(lambda: head + sep + new_tail(tail))
        return self._fresh(lambda: self._chars(value))

    def _email(self, value: str) -> str:
        local, _, domain = value.partition("@")
        pieces = []
        for piece in local.split("."):
            letters = piece.rstrip(_DIGITS)
            new = self.lower.get(letters, letters)
            pieces.append(new + self._digits(piece[len(letters) :]))
        return ".".join(pieces) + "@" + domain

    def _make(self, ent: _Ent) -> str:
        kind, value = ent.kind, ent.value
        if kind in ("first", "last"):
            return self.names.get(value, value)
        if kind in ("id", "uid", "up"):
            return self._ident(value)
        if kind == "four":
            return self._digits(value)
        if kind == "apt":
            return self.places.get(value, value)
        if kind == "city":
            code = self.places.get(_vocabulary().code_of[value])
            return _vocabulary().every_place[code] if code else value
        if kind == "iso":
            y, mo, d = ent.data
            return f"{y:04d}-{mo:02d}-{d + self.deltas.get(mo, 0):02d}"
        if kind == "md":
            mo, d, suffix = ent.data
            day = d + self.deltas.get(mo, 0)
            head = value.split(" ", 1)[0]
            return f"{head} {day}{_ordinal(day) if suffix else ''}"
        if kind == "email":
            return self._email(value)
        return value


def _render(value: Any, values: list[str]) -> Any:
    if value.__class__ is _Tpl:
        return value.fmt.format(*values)
    if isinstance(value, dict):
        return {k: _render(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, values) for v in value]
    return value


_OPENING_SWAPS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (
        re.compile(r"^(?:Hi|Hello|Hey|Good (?:morning|afternoon|evening))(?: there)?[!,.]?\s+"),
        ("Hi! ", "Hello! ", "Hey there! ", "Hi there! ", "Good morning! ", "Hello there. "),
    ),
    (
        re.compile(r"\b(?:I'm looking to|I want to|I'd like to|I would like to|I need to)\b"),
        ("I'm looking to", "I want to", "I'd like to", "I would like to", "I need to"),
    ),
    (re.compile(r"\b(?:Could you|Can you|Would you)\b"), ("Could you", "Can you", "Would you")),
)
_GREETINGS = ("Hi! ", "Hello! ", "Hey there! ", "Hi there! ")


def vary_opening(text: str, rng: random.Random) -> str:
    """Reword a user's opening line a little (greeting, a common phrase), keeping its facts."""
    out = text
    for pattern, options in _OPENING_SWAPS:
        m = pattern.search(out)
        if m:
            alternatives = [o for o in options if o != m.group(0)]
            rest = out[m.end() :]
            if options is _OPENING_SWAPS[0][1]:  # a new greeting starts a new sentence
                rest = rest[:1].upper() + rest[1:]
            out = out[: m.start()] + rng.choice(alternatives) + rest
    if out == text:
        out = rng.choice(_GREETINGS) + text
    return out


def amplify(reference: dict[str, Any] | Reference, rng: random.Random) -> dict[str, Any]:
    """A new trajectory in the output format: the reference's tools and structure, other entities.

    Args:
        reference: the reference trajectory (``{"messages": [...]}``) or its compiled template.
        rng: the request's random source; the same seed gives the same trajectory.

    Returns:
        ``{"messages": [...]}`` whose every string went through one consistent renaming.
    """
    ref = reference if isinstance(reference, Reference) else compile_reference(reference)
    ren = _Renamer(ref, rng)
    values = [ren(e) for e in ref.entities]
    messages = [{k: _render(v, values) for k, v in m.items()} for m in ref.messages]
    for m in messages:
        if m["role"] == "user":
            m["content"] = vary_opening(m["content"], rng)
            break
    return {"messages": messages}


def render_json(value: Any, rng: random.Random, fence_rate: float) -> str:
    """Serialise a model answer, inside a ```json fence at ``fence_rate`` as real models do."""
    text = json.dumps(value, ensure_ascii=False)
    if fence_rate and rng.random() < fence_rate:
        return f"```json\n{text}\n```"
    return text


# --------------------------------------------------------------------------------------
# Simulation: execute the call instead of guessing
# --------------------------------------------------------------------------------------
def read_simulation(text: str) -> tuple[dict[str, Any], Any, Any] | None:
    """``(state, tool name, arguments)`` from a simulate prompt, or None when unreadable.

    The blocks are taken from the *last* call marker and the last state marker
    before it, so a marker quoted inside the tool's description cannot shift them.
    """
    at = text.rfind(SIM_MARKER)
    if at < 0:
        return None
    start = text.rfind(STATE_MARKER, 0, at)
    call_block = extract_block(text[at:], SIM_MARKER)
    state_block = extract_block(text[start:at], STATE_MARKER) if start >= 0 else None
    if call_block is None or state_block is None:
        return None
    try:
        state, call = json.loads(state_block), json.loads(call_block)
    except (ValueError, RecursionError):
        return None
    if not isinstance(state, dict) or not isinstance(call, dict) or "name" not in call:
        return None
    return state, call["name"], call.get("arguments", {})


def _execute(state: dict[str, Any], name: Any, arguments: Any) -> tuple[str, Any] | None:
    """``(observation, state after)`` of the call on ``state`` in its domain's world, or
    None when no registered domain builds a world on ``state`` (a table missing)."""
    found = domains.world_over(state, [name] if isinstance(name, str) else [])
    if found is None:
        return None
    env = found[1]
    return env.execute(name, arguments), env.state


def simulate_call(state: dict[str, Any], name: Any, arguments: Any) -> dict[str, Any] | None:
    """A perfect simulator's answer: execute the call on ``state`` in its domain's world.

    Returns:
        ``{"feedback": observation, "config_changes": diff(state, new state)}``, or
        None when no registered domain builds a world on ``state`` (a table missing).
    """
    done = _execute(state, name, arguments)
    if done is None:
        return None
    return {"feedback": done[0], "config_changes": diff(state, done[1])}


def simulate_envsimbench(text: str) -> dict[str, Any] | None:
    """The perfect answer to a prompt in EnvSimBench's SFT layout, in that layout.

    Returns:
        ``{"feedback": observation, "config_changes": [{path, type, before, after}]}``,
        or None when the prompt is unreadable or its state belongs to no domain of ours.
    """
    try:
        state, name, arguments = read_sft_prompt(text)
    except SampleError:
        return None
    done = _execute(state, name, arguments)
    if done is None:
        return None
    return {"feedback": done[0], "config_changes": diff_dicts(state, done[1])}


def drop_change(answer: dict[str, Any], rng: random.Random) -> bool:
    """Remove one op of ``answer["config_changes"]`` in place (a simulator that misses a change).

    Returns:
        False when there is no op to drop.
    """
    changes = answer["config_changes"]
    if not changes:
        return False
    del changes[rng.randrange(len(changes))]
    return True


# --------------------------------------------------------------------------------------
# Judge and plain answers
# --------------------------------------------------------------------------------------
def judge(reference: dict[str, Any] | Reference | None) -> dict[str, Any]:
    """A pre-filter verdict: keep unless the trajectory is structurally broken.

    Returns:
        ``{"keep": bool, "scores": {"completeness", "consistency", "format"}, "reasons": [...]}``.
    """
    raw = reference.raw if isinstance(reference, Reference) else reference
    messages = raw.get("messages") if isinstance(raw, dict) else None
    if not isinstance(messages, list) or not messages:
        return {
            "keep": False,
            "scores": {"completeness": 1, "consistency": 1, "format": 1},
            "reasons": ["the trajectory is empty or not a message list"],
        }
    broken: list[str] = []
    form: list[str] = []
    pending: list[str] = []
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    for i, m in enumerate(messages):
        role = roles[i]
        if role not in ("user", "assistant", "tool"):
            form.append(f"message {i} has role {role!r}")
            continue
        if role == "tool":
            if pending:
                pending.pop(0)
            else:
                broken.append(f"message {i} is an observation without a call")
            continue
        if pending:
            broken.append(f"call to {pending[0]} before message {i} has no observation")
            pending = []
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None and not isinstance(calls, list):
            form.append(f"message {i} has tool_calls that are not a list")
            calls = None
        for call in calls or []:
            norm = _normalise_call(call)
            if not norm["name"] or not isinstance(norm["arguments"], dict):
                form.append(f"message {i} has a call without a name or object arguments")
            pending.append(norm["name"] or "?")
    if pending:
        broken.append(f"call to {pending[0]} at the end has no observation")
    if "user" not in roles:
        broken.append("there is no user message")
    if "assistant" not in roles:
        broken.append("there is no assistant message")
    ends_well = roles[-1] == "assistant" and not messages[-1].get("tool_calls")
    keep = not broken and not form
    reasons = broken + form
    if not ends_well:
        reasons.append("the conversation does not end with an assistant answer")
    if keep and not reasons:
        reasons = ["complete conversation; every call has an observation"]
    return {
        "keep": keep,
        "scores": {
            "completeness": 5 if ends_well and not broken else 3 if not broken else 2,
            "consistency": 2 if broken else 5,
            "format": 2 if form else 5,
        },
        "reasons": reasons,
    }


def answer_other(messages: list[Any]) -> str:
    """A short plain-text answer for prompts that are neither amplification nor judging."""
    asked = " ".join(last_user_text(messages).split())
    if len(asked) > 80:
        asked = asked[:77] + "..."
    return f"Understood. (factory devserver reply to: {asked!r})"


# --------------------------------------------------------------------------------------
# Content defects: what a weak model gets wrong
# --------------------------------------------------------------------------------------
_UNKNOWN_TOOLS = (
    "lookup_customer_profile", "search_hotels", "get_weather_forecast", "book_rental_car",
    "send_email_notification", "check_loyalty_points", "transfer_to_supervisor_queue",
)  # fmt: skip


def break_json(text: str, rng: random.Random) -> tuple[str, str]:
    """Damage serialised JSON (possibly fenced) the ways models do.

    Returns:
        ``(text, finish_reason)``: truncation reports ``"length"`` like a max-token cut.
    """
    fenced = text.startswith("```json\n") and text.endswith("\n```")
    body = text[8:-4] if fenced else text
    mode = rng.choice(("truncate", "trailing_comma", "unclosed"))
    if mode == "truncate" or len(body) < 4:
        cut = max(1, int(len(text) * rng.uniform(0.3, 0.95)))
        return text[:cut], "length"
    body = body[:-1] + "," + body[-1] if mode == "trailing_comma" else body[:-1]
    return (f"```json\n{body}\n```" if fenced else body), "stop"


def _call_turns(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("tool_calls")]


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return int(value) if value.isdigit() else len(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return 0


def inject_defect(
    trajectory: dict[str, Any], defect: str, rng: random.Random, avoid: str = ""
) -> bool:
    """Apply one structural defect in place to a freshly generated trajectory.

    Args:
        trajectory: ``{"messages": [...]}`` from ``amplify`` (mutated).
        defect: ``unknown_tool``, ``wrong_arg_type`` or ``missing_observation``.
        rng: the request's defect random source.
        avoid: prompt text; an invented tool name never occurs in it.

    Returns:
        False when the trajectory has nothing the defect can apply to (no calls).
    """
    messages = trajectory["messages"]
    turns = _call_turns(messages)
    if not turns:
        return False
    if defect == "unknown_tool":
        names = [n for n in _UNKNOWN_TOOLS if n not in avoid]
        if not names:
            return False
        i = rng.choice(turns)
        j = rng.randrange(len(messages[i]["tool_calls"]))
        old = messages[i]["tool_calls"][j]["name"]
        new = messages[i]["tool_calls"][j]["name"] = rng.choice(names)
        k = i + 1 + j
        if k < len(messages) and messages[k]["role"] == "tool" and messages[k].get("name") == old:
            messages[k]["name"] = new
        return True
    if defect == "wrong_arg_type":
        calls = [c for i in turns for c in messages[i]["tool_calls"] if c.get("arguments")]
        if not calls:
            return False
        call = rng.choice(calls)
        key = rng.choice(sorted(call["arguments"]))
        call["arguments"][key] = _wrong_type(call["arguments"][key])
        return True
    if defect == "missing_observation":
        i = rng.choice(turns)
        end = i + 1
        while end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        if end == i + 1:
            return False
        del messages[i + 1 : end]
        return True
    raise ValueError(f"not a structural defect: {defect!r}")
