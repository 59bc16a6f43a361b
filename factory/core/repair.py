"""Rule-based JSON repair that refuses whenever a repair could change meaning.

Seeds and model outputs carry JSON inside strings (tool-call arguments,
observations) that is often *almost* JSON: trailing commas, Python literals,
single quotes, a missing closing brace. ``json_repair`` fixes those, but it
fixes everything: it turns ``garbage`` into ``""``, drops the half-written key
of a truncated object and invents ``""`` for a missing value. Training on a
silently rewritten argument teaches the model a call it never made, so a repair
is only accepted when it can be shown to be *lossless*.

Policy (applied in this order):

1. A markdown code fence wrapping the whole text is removed (note ``code_fence``).
2. Strict ``json.loads`` (NaN / Infinity refused). Success means no repair.
3. Otherwise ``json_repair`` runs, and its result is accepted (note
   ``json_repair``) only if all of these hold for a lenient token scan of the
   input:

   * the text starts with ``{`` or ``[`` and the result is an object or array
     respectively (no prose around JSON, no two objects glued into a list);
   * the result is not empty and has no NaN / infinite number;
   * no string literal is left open at the end (truncated inside a string);
   * if closing brackets are missing, the text ends right after a complete
     value (``{"a": [1, 2`` is accepted; ``{"a": 1, "b"`` or ``[1,`` is
     truncated in the middle and refused);
   * every bare word is a key (``{a: 1}``) or a literal (``true``, ``None``...):
     an unquoted value such as ``undefined`` or trailing prose is refused;
   * no character outside strings is foreign to JSON (comments, ``;`` ...);
   * every string literal, number and literal of the input appears in the
     result (as a key or leaf), and every key and leaf of the result appears
     in the input: nothing lost, nothing invented.

Anything else raises ``RepairError`` with a reason code; callers record the
notes of accepted repairs in ``Trajectory.metadata["repairs"]``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import json_repair

from factory.errors import RepairError, short

__all__ = [
    "looks_like_json",
    "parse_arguments",
    "parse_json_value",
    "parse_observation",
    "reject_constant",
]

NOTE_CODE_FENCE = "code_fence"
NOTE_JSON_REPAIR = "json_repair"
NOTE_DOUBLE_ENCODED = "double_encoded"

_FENCE = re.compile(r"\A\s*```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n?(.*?)\n?\s*```\s*\Z", re.S)

# Lenient scan of almost-JSON. Strings may be left open at the end of the text.
_TOKEN = re.compile(
    r"""
     (?P<dq>"(?:[^"\\]|\\.)*(?P<dq_end>")?)
    |(?P<sq>'(?:[^'\\]|\\.)*(?P<sq_end>')?)
    |(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    |(?P<word>[^\W\d][\w$-]*)
    |(?P<punct>[{}\[\]:,])
    |(?P<ws>\s+)
    |(?P<other>.)
    """,
    re.S | re.X,
)
_BARE_DQUOTE = re.compile(r'(\\*)"')
_KEYWORDS: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}
# An observation "looks like JSON" when a bracket is followed by something a JSON
# value can start with; "[INFO] done" or "{not json}" stay plain text.
_JSONISH = re.compile(
    r"""\A\s*(?:
        \{\s*(?:["'}]|[^\W\d][\w$-]*\s*:)
      | \[\s*(?:["'\[\]{}]|[-+.\d]|true\b|false\b|null\b|True\b|False\b|None\b)
    )""",
    re.X,
)


def reject_constant(name: str) -> Any:
    """``json.loads(parse_constant=...)``: refuse ``NaN`` and ``Infinity``, which JSON lacks."""
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _strict(text: str) -> Any:
    return json.loads(text, parse_constant=reject_constant, parse_float=_finite_float)


@dataclass
class _Scan:
    """What the lenient token scan found in the input text."""

    literals: list[set[str]] = field(default_factory=list)  # per literal: what it decodes to
    numbers: list[float] = field(default_factory=list)
    keywords: list[Any] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # bare-word keys
    problem: str | None = None


def _decodings(token: str, quote: str) -> set[str]:
    """What a string literal means: its JSON decoding, or its raw text if undecodable.

    Only the true decoding counts, so a json_repair result that decodes an escape
    differently (it keeps ``\\/`` and splits surrogate pairs) is refused, not kept.
    """
    inner = token[1:-1]
    if quote == "'":
        # Python-style literal: escape its bare double quotes, unescape its single quotes.
        inner = _BARE_DQUOTE.sub(
            lambda m: m.group(1) + ("" if len(m.group(1)) % 2 else "\\") + '"', inner
        )
        inner = inner.replace("\\'", "'")
    try:
        return {json.loads(f'"{inner}"', strict=False)}
    except ValueError:
        return {token[1:-1]}


def _kind(m: re.Match[str]) -> str:
    for kind in ("dq", "sq", "num", "word", "punct", "ws"):
        if m.group(kind) is not None:
            return kind
    return "other"


def _scan(text: str) -> _Scan:
    scan = _Scan()
    sig = [(k, m) for m in _TOKEN.finditer(text) if (k := _kind(m)) != "ws"]
    stack: list[str] = []
    for pos, (kind, m) in enumerate(sig):
        tok = m.group(0)
        if kind in ("dq", "sq"):
            if m.group(f"{kind}_end") is None:
                scan.problem = "the text ends inside a string literal (truncated)"
                return scan
            scan.literals.append(_decodings(tok, tok[0]))
        elif kind == "num":
            value = float(tok)
            if not math.isfinite(value):
                scan.problem = f"number {short(tok, 40)} is not finite"
                return scan
            scan.numbers.append(value)
        elif kind == "word":
            nxt = sig[pos + 1][1].group(0) if pos + 1 < len(sig) else None
            if nxt == ":":
                scan.keys.append(tok)
            elif tok in _KEYWORDS:
                scan.keywords.append(_KEYWORDS[tok])
            else:
                scan.problem = f"unquoted value {short(tok, 40)!r} would have to be guessed"
                return scan
        elif kind == "punct":
            if tok in "{[":
                stack.append(tok)
            elif tok in "}]" and stack:
                stack.pop()
        else:
            scan.problem = f"character {tok!r} has no meaning in JSON"
            return scan
    if stack and not _ends_with_value(sig, stack):
        scan.problem = "the text is truncated in the middle of a value"
    return scan


def _ends_with_value(sig: list[tuple[str, re.Match[str]]], stack: list[str]) -> bool:
    """With closers missing, accept only an end right after a complete value."""
    if not sig:
        return False
    last = sig[-1][1].group(0)
    if last in ("}", "]"):
        return True
    if last in ("{", "[", ",", ":") or len(sig) < 2:
        return False
    before = sig[-2][1].group(0)
    if stack[-1] == "{":
        return before == ":"
    return before in ("[", ",")


def _atoms(value: Any) -> tuple[set[str], list[float], list[Any], bool]:
    """Strings (keys and leaves), numbers and literals of a parsed value, iteratively."""
    strings: set[str] = set()
    numbers: list[float] = []
    keywords: list[Any] = []
    finite = True
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            strings.update(str(k) for k in item)
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, str):
            strings.add(item)
        elif item is None or isinstance(item, bool):
            keywords.append(item)
        elif isinstance(item, (int, float)):
            if isinstance(item, float) and not math.isfinite(item):
                finite = False
            numbers.append(float(item))
    return strings, numbers, keywords, finite


def _check_lossless(text: str, value: Any) -> str | None:
    """Return why ``value`` is not a faithful repair of ``text``, or None."""
    opener = text.lstrip()[:1]
    if opener not in ("{", "["):
        return "the text does not start with a JSON object or array"
    if not isinstance(value, dict if opener == "{" else list):
        return "repair changed the top-level type (prose or several values?)"
    if not value:
        return "repair produced an empty value from non-empty text"
    scan = _scan(text)
    if scan.problem:
        return scan.problem
    strings, numbers, keywords, finite = _atoms(value)
    if not finite:
        return "NaN / Infinity is not JSON"
    for options in scan.literals:
        if not options & strings:
            return f"string {short(min(options, key=len), 60)!r} would be lost"
    for key in scan.keys:
        if key not in strings:
            return f"key {short(key, 60)!r} would be lost"
    number_set = set(numbers)
    for num in scan.numbers:
        if num not in number_set:
            return f"number {num!r} would be lost"
    for kw in scan.keywords:
        if not any(kw is other for other in keywords):
            return f"literal {kw!r} would be lost"
    known = set(scan.keys).union(*scan.literals) if scan.literals else set(scan.keys)
    for s in strings:
        if s not in known:
            return f"repair would invent the string {short(s, 60)!r}"
    input_numbers = set(scan.numbers)
    for num in numbers:
        if num not in input_numbers:
            return f"repair would invent the number {num!r}"
    for kw in keywords:
        if not any(kw is other for other in scan.keywords):
            return f"repair would invent the literal {kw!r}"
    return None


def _recover(text: str, reason: str) -> tuple[Any, list[str]]:
    if not isinstance(text, str):
        raise RepairError(reason, f"expected JSON text, got {type(text).__name__}")
    notes: list[str] = []
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
        notes.append(NOTE_CODE_FENCE)
    if not text.strip():
        raise RepairError(reason, "empty text is not JSON")
    try:
        return _strict(text), notes
    except RecursionError as exc:
        raise RepairError(reason, "JSON nested too deeply") from exc
    except ValueError:
        pass
    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True)
    except RecursionError as exc:
        raise RepairError(reason, "JSON nested too deeply") from exc
    except Exception as exc:  # json_repair has no error hierarchy of its own
        raise RepairError(reason, f"json_repair failed: {short(str(exc), 80)}") from exc
    problem = _check_lossless(text, value)  # iterative: no recursion limit to hit
    if problem is not None:
        raise RepairError(reason, f"cannot repair {short(text, 80)!r}: {problem}")
    return value, [*notes, NOTE_JSON_REPAIR]


def parse_json_value(text: str, *, reason: str = "invalid_json") -> tuple[Any, bool]:
    """Parse JSON text, repairing it only when the repair is provably lossless.

    Args:
        text: JSON text, possibly fenced in markdown or slightly malformed.
        reason: reason code carried by the ``RepairError`` on refusal.

    Returns:
        ``(value, repaired)``; ``repaired`` is True when a fence was removed or
        ``json_repair`` was needed.

    Raises:
        RepairError: empty text, no JSON, or a repair that would lose or invent content.
    """
    value, notes = _recover(text, reason)
    return value, bool(notes)


def parse_arguments(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """Turn tool-call arguments (object, JSON string, or nothing) into a dict.

    ``None``, ``""`` and ``"{}"`` are the legitimate empty argument list (tools
    like ``list_all_airports``) and give ``{}`` with no note. Anything else that
    does not parse is refused; ``{}`` is never a fallback. A JSON string that
    holds a JSON object (double encoding) is decoded once more.

    Returns:
        ``(arguments, notes)``, notes being the applied repairs (e.g. ``["json_repair"]``).

    Raises:
        RepairError: ``malformed_arguments`` or ``arguments_not_object``.
    """
    if isinstance(raw, dict):
        return raw, []
    if raw is None or raw in ("", "{}"):
        return {}, []
    if not isinstance(raw, str):
        raise RepairError(
            "arguments_not_object", f"arguments must be an object, got {type(raw).__name__}"
        )
    value, notes = _recover(raw, "malformed_arguments")
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            inner = _strict(value)
        except (ValueError, RecursionError):
            inner = None
        if isinstance(inner, dict):
            return inner, [*notes, NOTE_DOUBLE_ENCODED]
    if not isinstance(value, dict):
        raise RepairError(
            "arguments_not_object",
            f"arguments are JSON {type(value).__name__}, not an object: {short(raw, 80)!r}",
        )
    return value, notes


def looks_like_json(text: str) -> bool:
    """True when ``text`` opens like a JSON object or array (not ``[INFO] ...`` prose)."""
    fenced = _FENCE.match(text)
    return bool(_JSONISH.match(fenced.group(1) if fenced else text))


def parse_observation(text: str) -> tuple[str, list[str]]:
    """Keep plain-text observations; repair JSON-looking ones that fail to parse.

    A valid JSON observation is returned byte for byte (fidelity against the
    executing environment); a repaired one is re-serialised with ``json.dumps``.

    Returns:
        ``(text, notes)``.

    Raises:
        RepairError: ``malformed_observation`` when JSON-looking text cannot be recovered.
    """
    if not looks_like_json(text):
        return text, []
    try:
        _strict(text)
        return text, []
    except (ValueError, RecursionError):
        pass
    value, notes = _recover(text, "malformed_observation")
    return json.dumps(value, ensure_ascii=False), notes
