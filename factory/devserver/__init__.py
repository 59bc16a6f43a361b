"""The factory's development LLM server: an OpenAI-compatible model simulator on 127.0.0.1.

Nothing in the project talks to a real LLM in tests or benchmarks; everything
talks to this server. Run it with ``python -m factory.devserver`` or, in a
test, ``with DevServer(DevServerConfig(...)) as server: ... server.url``.
"""

from __future__ import annotations

from factory.devserver.app import DEFECTS, DevServerConfig, build_app, parse_defects
from factory.devserver.server import DevServer, RunningServer, start_server

__all__ = [
    "DEFECTS",
    "DevServer",
    "DevServerConfig",
    "RunningServer",
    "build_app",
    "parse_defects",
    "start_server",
]
