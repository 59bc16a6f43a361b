"""An offline stand-in for Cohere's v2 Chat API: translates to a chat-completions server.

The factory's development server speaks the wire formats the factory ships (chat
completions, Anthropic Messages, Gemini generateContent); a provider plug-in brings its
own offline server the same way the factory's adapters do (``factory.devserver.anthropic``):
translate the request to a chat-completions body, let the development server answer it,
translate the answer back. Used by the factory's tests of this plug-in.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

FINISH = {"stop": "COMPLETE", "length": "MAX_TOKENS", "tool_calls": "TOOL_CALL"}
SESSION = web.AppKey("session", aiohttp.ClientSession)


def chat_payload(body: dict[str, Any]) -> dict[str, Any]:
    """A v2 chat request as a chat-completions body."""
    out: dict[str, Any] = {"model": body["model"], "messages": body["messages"]}
    for ours, theirs in (("max_tokens", "max_tokens"), ("temperature", "temperature"),
                         ("top_p", "p"), ("seed", "seed")):  # fmt: skip
        if theirs in body:
            out[ours] = body[theirs]
    return out


def cohere_response(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as a v2 chat response."""
    choice = chat["choices"][0]
    usage = chat.get("usage") or {}
    tokens = {"input_tokens": usage.get("prompt_tokens", 0),
              "output_tokens": usage.get("completion_tokens", 0)}  # fmt: skip
    return {
        "id": chat.get("id"),
        "finish_reason": FINISH.get(choice.get("finish_reason"), "COMPLETE"),
        "message": {"role": "assistant",
                    "content": [{"type": "text", "text": choice["message"]["content"] or ""}]},
        "usage": {"billed_units": tokens, "tokens": tokens},
    }  # fmt: skip


def relay_app(upstream: str) -> web.Application:
    """``POST /v2/chat`` answered by the chat-completions server at ``upstream`` (its
    ``/v1`` URL); its error statuses and ``Retry-After`` pass through."""

    async def chat(request: web.Request) -> web.Response:
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return web.json_response({"message": "no api key"}, status=401)
        session: aiohttp.ClientSession = request.app[SESSION]
        async with session.post(f"{upstream}/chat/completions",
                                json=chat_payload(await request.json())) as r:  # fmt: skip
            if r.status != 200:
                headers = {k: v for k, v in r.headers.items() if k.lower() == "retry-after"}
                return web.json_response({"message": await r.text()}, status=r.status,
                                         headers=headers)  # fmt: skip
            return web.json_response(cohere_response(await r.json()))

    async def session(app: web.Application) -> Any:
        app[SESSION] = aiohttp.ClientSession()
        yield
        await app[SESSION].close()

    app = web.Application()
    app.router.add_post("/v2/chat", chat)
    app.cleanup_ctx.append(session)
    return app
