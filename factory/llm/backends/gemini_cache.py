"""Gemini's explicit context cache: when it pays, and its life in one actor.

Why: Gemini caches a repeated prefix implicitly (no cost, no guarantee) and offers an
explicit cache (``POST {base}/cachedContents``) whose reads are guaranteed the cached
rate, at a price: the cached tokens are billed once at the input rate when the cache is
made, and then per token-hour of storage (https://ai.google.dev/gemini-api/docs/caching,
https://ai.google.dev/gemini-api/docs/pricing). ``factory.llm.pricing.explicit_cache_pays``
(the plan's estimate asks the same) decides from the price table whether the calls expected
within one TTL save more than that; the ``gemini`` backend asks it once per static prefix
(``backend_options.explicit_cache: auto``), after counting the prefix's requests for
``cache_decide_after_s``, or skips it (``on``: always, where the prefix is long enough;
``off``: never).

An :class:`ExplicitCache` belongs to one endpoint of one actor's backend. It makes a cache
lazily, on the first request that should use it (one creation however many requests wait
for it), refreshes its TTL when a request comes within a margin of its expiry, and
deletes it when the backend closes. Money: creating a cache is charged its tokens at the
input rate and a whole TTL of storage, a refresh the storage it adds (what Google bills
if the actor dies and nothing deletes it: the count never falls short of the bill, and
exceeds it by at most the unused part of one TTL). Charges go to the backend's
:class:`CacheBook`, which the backend adds to the next completion's ``cost_usd``, so the
ledger, the budget and the manifest count them with the tokens.

This module knows no wire: the backend hands it the body of a ``cachedContents`` create
(``CacheWire``) and an ``API`` to call.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from factory.errors import LLMError
from factory.llm.pricing import explicit_cache_pays
from factory.llm.types import Request

if TYPE_CHECKING:
    from factory.llm.pricing import Price

__all__ = [
    "API",
    "CacheBook",
    "CacheWire",
    "ExplicitCache",
    "min_cache_tokens",
    "prefix_tokens",
]

log = logging.getLogger(__name__)

# The shortest prefix a Gemini model caches, by model name prefix, the largest value any
# version of https://ai.google.dev/gemini-api/docs/caching has stated (2.5 Flash 1,024 and
# then 2,048; 2.5 Pro 4,096 and then 2,048; 3.x 4,096): an explicit cache is never tried
# below it. An unknown model gets 4,096.
_MIN_TOKENS = (("gemini-2.5-flash", 2048), ("gemini-2.0-flash", 2048))
_MIN_TOKENS_DEFAULT = 4096
_REFRESH_MARGIN_S = 60.0  # refresh a cache's TTL when a request comes this close to expiry
_MAX_FORGOTTEN = 2  # caches the server lost before the prefix goes implicit for good


def min_cache_tokens(model: str) -> int:
    """The shortest prefix ``model`` caches (see ``_MIN_TOKENS``)."""
    name = model.lower().removeprefix("models/")
    for start, tokens in _MIN_TOKENS:
        if name.startswith(start):
            return tokens
    return _MIN_TOKENS_DEFAULT


def prefix_tokens(request: Request) -> int:
    """An estimate of the static prefix's tokens (4 characters a token), for the decision;
    the cache's own ``usageMetadata`` gives the exact count once it exists."""
    chars = sum(len(m.content) for m in request.static)
    chars += sum(len(t.name) + len(t.description) + len(str(t.parameters)) for t in request.tools)
    return chars // 4


@dataclass
class CacheBook:
    """The explicit caches' charges of one backend: ``take`` hands what is not yet on a
    completion to the next one."""

    charged_usd: float = 0.0
    untaken: float = 0.0
    created: int = 0
    token_hours: float = 0.0

    def charge(self, usd: float) -> None:
        self.charged_usd += usd
        self.untaken += usd

    def take(self) -> float:
        """The charges since the last call (0.0: none)."""
        usd, self.untaken = self.untaken, 0.0
        return usd

    def totals(self) -> dict[str, float]:
        return {
            "explicit_cache_usd": self.charged_usd,
            "explicit_caches": float(self.created),
            "explicit_cache_token_hours": self.token_hours,
        }


class API(Protocol):
    """What the cache calls: one JSON call of the provider's API below its versioned base."""

    async def call(
        self, method: str, path: str, body: Mapping[str, Any] | None, request_header: str = ""
    ) -> dict[str, Any]: ...


class CacheWire(Protocol):
    """The body of a ``cachedContents`` create for a request's static prefix."""

    def cache_body(self, request: Request, model: str, ttl_s: float) -> dict[str, Any]: ...


@dataclass
class _Entry:
    first_seen: float
    count: int = 0
    state: Literal["undecided", "on", "off"] = "undecided"
    name: str | None = None
    expires: float = 0.0
    tokens: int = 0
    forgotten: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ExplicitCache:
    """The explicit caches of one endpoint, one per static prefix (see the module)."""

    def __init__(
        self,
        *,
        model: str,
        mode: Literal["auto", "on"],
        ttl_s: float,
        min_tokens: int,
        price: Price | None,
        storage_per_mtok_hour: float | None,
        decide_after_s: float,
        book: CacheBook,
        wire: CacheWire,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.mode = mode
        self.ttl_s = ttl_s
        self.min_tokens = min_tokens
        self.price = price
        self.storage = storage_per_mtok_hour
        self.decide_after_s = decide_after_s
        self.book = book
        self.wire = wire
        self.clock = clock
        self.entries: dict[bytes, _Entry] = {}
        if mode == "on" and storage_per_mtok_hour is None:
            log.warning(
                "gemini explicit cache on without a storage price: its storage is not "
                "counted (set llm.backend_options.cache_storage_per_mtok_hour)"
            )

    @staticmethod
    def _key(request: Request) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for m in request.static:
            h.update(f"\x1e{m.role}\x1f{m.content}".encode())
        for t in request.tools:
            h.update(f"\x1d{t.name}\x1f{t.description}\x1f{sorted(t.parameters.items())}".encode())
        return h.digest()

    def _decide(self, entry: _Entry, request: Request) -> None:
        tokens = prefix_tokens(request)
        if tokens < self.min_tokens:
            entry.state = "off"
            return
        if self.mode == "on":
            entry.state = "on"
            return
        now = self.clock()
        elapsed = now - entry.first_seen
        if elapsed < self.decide_after_s:
            return
        calls = entry.count / max(elapsed, 1e-3) * self.ttl_s
        pays = explicit_cache_pays(
            tokens, calls, self.price, self.ttl_s, self.storage, min_tokens=self.min_tokens
        )
        entry.state = "on" if pays else "off"
        log.info(
            "gemini explicit cache for a %d-token prefix (%.0f calls per %gs TTL): %s",
            tokens,
            calls,
            self.ttl_s,
            "pays, on" if pays else "does not pay (or no storage price), implicit",
        )

    async def name_for(self, api: API, request: Request, model: str) -> str | None:
        """The cache holding ``request``'s static prefix, made or refreshed as needed; None:
        the prefix goes inline (implicit caching)."""
        if request.static_prefix <= 0:
            return None
        key = self._key(request)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry(first_seen=self.clock())
        entry.count += 1
        if entry.state == "undecided":
            self._decide(entry, request)
        if entry.state != "on":
            return None
        if entry.name is not None and self.clock() < entry.expires - self._margin():
            return entry.name
        async with entry.lock:  # one creation or refresh, however many requests wait
            if entry.state != "on":
                return None
            if entry.name is None:
                await self._create(api, entry, request, model)
            elif self.clock() >= entry.expires - self._margin():
                await self._refresh(api, entry)
        return entry.name if entry.state == "on" else None

    def _margin(self) -> float:
        return min(_REFRESH_MARGIN_S, self.ttl_s / 4)

    def _charge_storage(self, tokens: int, seconds: float) -> None:
        hours = tokens * seconds / 3600.0
        self.book.token_hours += hours
        if self.storage is not None:
            self.book.charge(hours * self.storage / 1e6)

    async def _create(self, api: API, entry: _Entry, request: Request, model: str) -> None:
        body = self.wire.cache_body(request, model, self.ttl_s)
        try:
            made = await api.call("POST", "cachedContents", body)
        except LLMError as exc:
            entry.state = "off"
            log.warning("gemini explicit cache not made (%s): the prefix goes inline", exc)
            return
        name = made.get("name")
        if not isinstance(name, str) or not name:
            entry.state = "off"
            log.warning("gemini explicit cache answer has no name: the prefix goes inline")
            return
        usage = made.get("usageMetadata") or {}
        tokens = usage.get("totalTokenCount") if isinstance(usage, Mapping) else None
        entry.tokens = tokens if isinstance(tokens, int) and tokens > 0 else prefix_tokens(request)
        entry.name = name
        entry.expires = self.clock() + self.ttl_s
        self.book.created += 1
        if self.price is not None:
            self.book.charge(entry.tokens * self.price.input_per_mtok / 1e6)
        self._charge_storage(entry.tokens, self.ttl_s)

    async def _refresh(self, api: API, entry: _Entry) -> None:
        assert entry.name is not None
        try:
            await api.call("PATCH", f"{entry.name}?updateMask=ttl", {"ttl": f"{self.ttl_s:g}s"})
        except LLMError as exc:
            log.info("gemini explicit cache %s not refreshed (%s): made anew", entry.name, exc)
            entry.name = None
            entry.state = "on"
            return
        now = self.clock()
        self._charge_storage(entry.tokens, max(0.0, now + self.ttl_s - entry.expires))
        entry.expires = now + self.ttl_s

    def forget(self, name: str, why: str) -> None:
        """The server no longer knows cache ``name``: the next request makes a new one
        (after ``_MAX_FORGOTTEN`` such losses the prefix goes inline for good)."""
        for entry in self.entries.values():
            if entry.name == name:
                entry.name = None
                entry.forgotten += 1
                if entry.forgotten >= _MAX_FORGOTTEN:
                    entry.state = "off"
                log.warning("gemini explicit cache %s refused (%s)", name, why)

    async def aclose(self, api: API) -> None:
        """Delete every cache this endpoint made (a failure is logged: the cache then
        expires at its TTL, already charged)."""
        for entry in self.entries.values():
            if entry.name is None:
                continue
            name, entry.name = entry.name, None
            try:
                await api.call("DELETE", name, None)
            except Exception as exc:  # closing: nothing to retry, the cache expires
                log.info("gemini explicit cache %s not deleted (%s): it expires", name, exc)
