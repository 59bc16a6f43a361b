"""API keys: read from the environment only, and kept out of every log and artefact.

Keys never live in recipes, manifests or command lines; an endpoint names the
environment variable that holds its key (``api_key_env``) and
``api_key_from_env`` reads it. Every value read that way is registered in a
process-wide registry, and ``redact`` replaces registered values (plus the
obvious disguises a key takes on its way into a log: ``Bearer <key>``, URL- or
JSON-escaped copies, a copy cut after 16 or more characters) with ``***``.
``RedactingFilter`` applies that to every log record, ``redact_obj`` to JSON-like
structures before they are written.

Redaction is the second line of defence: code must still never put a key into
a message. It exists because third-party libraries (HTTP clients logging
headers, exceptions echoing a request) do not share that rule.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = [
    "MASK",
    "PLACEHOLDER_KEY",
    "RedactingFilter",
    "api_key_from_env",
    "clear_secrets",
    "install_log_redaction",
    "is_local_url",
    "redact",
    "redact_obj",
    "register_secret",
]

MASK = "***"

# What local OpenAI-compatible servers (vLLM, SGLang) accept when started without
# --api-key; the SDK refuses an empty key, so something must be sent.
PLACEHOLDER_KEY = "EMPTY"

# Shorter values are too likely to occur in ordinary text ("EMPTY", "test") to be
# masked everywhere; real provider keys are far longer.
_MIN_SECRET_LEN = 8
# A copy cut short (``short()`` truncating a server's echo of the key) still gives
# most of the key away: a registered value's first 16 characters are masked with
# whatever key-like text follows them.
_PREFIX_LEN = 16
_PREFIX_TAIL = r"[^\s\"'<>]*"

# Belt and braces for keys that were never registered (e.g. typed into a URL by
# hand): any bearer credential and anything shaped like an OpenAI key.
_GENERIC_PATTERNS = (
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
)

# Mapping keys whose string values are credentials whatever they contain.
_SENSITIVE_KEY = re.compile(
    r"(?i)^(?:.*[_-])?(?:api[_-]?key|apikey|secret|password|passwd|authorization|"
    r"access[_-]?token|auth[_-]?token|bearer)$"
)

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
# What every match of ``_pattern`` contains (each registered variant's first
# ``_MIN_SECRET_LEN`` characters): text without any of them is not scanned. Every
# completion passes through ``redact``; the scans cost 58 us for 1.6 KB, the checks 2.
_markers: tuple[str, ...] = ()


def is_local_url(url: str) -> bool:
    """True when ``url`` points at this machine (where a placeholder key is acceptable)."""
    host = (urlsplit(url).hostname or "").lower()
    return host in _LOCAL_HOSTS or host.startswith("127.")


def _variants(value: str) -> Iterable[str]:
    yield value
    yield quote(value, safe="")
    yield json.dumps(value)[1:-1]
    yield repr(value)[1:-1]


def register_secret(value: str | None) -> None:
    """Add ``value`` to the registry so ``redact`` masks it from now on.

    Values shorter than 8 characters are ignored: masking them would mangle
    ordinary text, and no provider issues keys that short.
    """
    global _pattern
    if not value or len(value) < _MIN_SECRET_LEN:
        return
    with _lock:
        new = {v for v in _variants(value) if len(v) >= _MIN_SECRET_LEN} - _secrets
        if new:
            _secrets.update(new)
            _pattern = None


def clear_secrets() -> None:
    """Forget every registered value (for tests; production never needs to)."""
    global _pattern
    with _lock:
        _secrets.clear()
        _pattern = None


def _compiled() -> re.Pattern[str] | None:
    global _pattern, _markers
    with _lock:
        if _pattern is None and _secrets:
            _markers = tuple({v[:_MIN_SECRET_LEN] for v in _secrets})
            # Longest first so a value never leaves the tail of a longer variant behind;
            # whole values before truncated ones.
            ordered = sorted(_secrets, key=len, reverse=True)
            parts = [re.escape(v) for v in ordered]
            parts += [
                re.escape(v[:_PREFIX_LEN]) + _PREFIX_TAIL for v in ordered if len(v) > _PREFIX_LEN
            ]
            _pattern = re.compile("|".join(dict.fromkeys(parts)))
        return _pattern


def api_key_from_env(var_name: str) -> str | None:
    """Read an API key from the environment and register it for redaction.

    Args:
        var_name: the environment variable that holds the key.

    Returns:
        The key with surrounding whitespace removed, or ``None`` when the variable
        is unset or blank.
    """
    value = os.environ.get(var_name, "").strip()
    if not value:
        return None
    register_secret(value)
    # Every process that holds a key masks it in its logs, Ray workers included
    # (their clients read the key themselves; the driver's filter never sees them).
    install_log_redaction()
    return value


def redact(text: str) -> str:
    """Replace every registered secret, and bearer credentials, in ``text`` with ``***``."""
    if not text:
        return text
    pattern = _compiled()
    if pattern is not None and any(m in text for m in _markers):
        text = pattern.sub(MASK, text)
    if "bearer" in text.lower():
        text = _GENERIC_PATTERNS[0].sub(lambda m: m.group(1) + MASK, text)
    if "sk-" in text:
        text = _GENERIC_PATTERNS[1].sub(MASK, text)
    return text


def redact_obj(obj: Any) -> Any:
    """Return a copy of a JSON-like structure with secrets masked.

    Strings are passed through ``redact``; the string value of a mapping key that
    names a credential (``api_key``, ``authorization``, ``password`` ...) is masked
    whole. Tuples come back as lists, as they would from JSON. Other scalars are
    returned unchanged.
    """
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            new_key = redact(key) if isinstance(key, str) else key
            if (
                isinstance(key, str)
                and isinstance(value, str)
                and value
                and _SENSITIVE_KEY.match(key)
            ):
                out[new_key] = MASK
            else:
                out[new_key] = redact_obj(value)
        return out
    if isinstance(obj, list | tuple):
        return [redact_obj(item) for item in obj]
    return obj


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message, arguments, traceback and stack text.

    The message is rendered once (``getMessage``) and the arguments dropped, so a
    key hidden in an argument's ``repr`` is caught too. Never rejects a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the raw parts, redacted
            message = f"{record.msg} {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> RedactingFilter:
    """Attach one ``RedactingFilter`` to ``logger`` (default: root) and its handlers.

    Logger filters only see records logged on that very logger, while handler
    filters see everything that propagates to them, so both are needed for
    "every record". On the root logger ``logging.lastResort`` is covered too: it
    prints when no handler is configured, as in a Ray worker. Handlers added
    later need ``handler.addFilter`` too. Idempotent: an existing filter is reused.

    Returns:
        The installed filter.
    """
    target = logger if logger is not None else logging.getLogger()
    existing = next((f for f in target.filters if isinstance(f, RedactingFilter)), None)
    flt = existing or RedactingFilter()
    if existing is None:
        target.addFilter(flt)
    handlers = list(target.handlers)
    if target is logging.getLogger() and logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(flt)
    return flt
