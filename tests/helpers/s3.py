"""A real S3-compatible server on 127.0.0.1 for the object-storage tests (moto, server mode).

One server per test process, started on first use (a thread: ~1 s, no subprocess, so fast
tests may use it too). Its address and made-up credentials are chosen when this module is
imported and put in ``os.environ`` by ``use_s3()``: a test module that runs the factory on
Ray calls it at import, before any test starts Ray, since local Ray workers inherit the
environment of the session they join and never variables set later.
"""

from __future__ import annotations

import os
import secrets
import threading
import uuid
from typing import Any

from tests.helpers import free_port

PORT = free_port()
ENV = {
    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{PORT}",
    # Made up, long and random: a scan for them in outputs and logs is not vacuous.
    "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
    "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
    "AWS_DEFAULT_REGION": "us-east-1",
}
_server: Any = None
_lock = threading.Lock()


def use_s3() -> dict[str, str]:
    """Point this process (and the Ray it starts later) at the test server; returns its env."""
    os.environ.update(ENV)
    return dict(ENV)


def start_server() -> str:
    """The server's URL, started on first call (moto's ThreadedMotoServer on 127.0.0.1)."""
    global _server
    with _lock:
        if _server is None:
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=PORT, verbose=False)
            server.start()
            _server = server
    use_s3()
    return ENV["AWS_ENDPOINT_URL"]


def client() -> Any:
    import boto3

    start_server()
    return boto3.client("s3", endpoint_url=ENV["AWS_ENDPOINT_URL"])


def new_bucket() -> str:
    """A fresh bucket (tests never share one)."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    client().create_bucket(Bucket=name)
    return name


def objects(uri: str) -> dict[str, bytes]:
    """Every object below ``s3://bucket/prefix``: path below it -> bytes."""
    from factory.io.objectstore import S3Store

    store = S3Store(uri, client())
    return {rel: store.get(rel).data for rel in store.list()}
