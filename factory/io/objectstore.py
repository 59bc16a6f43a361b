"""An output folder on object storage: the S3 client under ``mirror`` and ``lease``.

Why boto3 and not ``pyarrow.fs`` (which the response cache and the seeds use): one run per
output prefix needs a conditional write (S3's ``If-None-Match: *`` to create the lease
object only if it is absent, ``If-Match: <etag>`` to renew or take over exactly the
version one read), and ``pyarrow.fs.S3FileSystem`` has no way to send either. boto3 is
the reference S3 client, reads its credentials and endpoint from the same environment
variables as pyarrow (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``), and speaks to any
S3-compatible server (MinIO, Ceph, R2, moto). Plain HTTP would mean writing SigV4
signing by hand.

Credentials are never passed, printed or stored by the factory: the client finds them
in the environment (or an instance role); their values are registered with
``factory.secrets`` so a library's message that echoes one is masked, and an S3 error
becomes a message built from its code and status only (an S3 error body may quote the
access key id).
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from factory.errors import ConfigError, FactoryError, OutputWriteError, short
from factory.secrets import install_log_redaction, register_secret

__all__ = [
    "CREDENTIAL_VARS",
    "Blob",
    "ObjectStoreError",
    "PreconditionFailed",
    "S3Store",
    "is_uri",
    "open_store",
    "output_location",
]

#: The environment variables whose values are credentials (registered for redaction).
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def is_uri(location: str | Path) -> bool:
    """Whether ``location`` names a filesystem by URI (``s3://``, ``gs://``, ...), not a path."""
    return isinstance(location, str) and "://" in location and not location.startswith("file://")


def output_location(text: str) -> str | Path:
    """The output folder a user named: a local path (``file://`` URIs included, made
    absolute) or an ``s3://bucket/prefix`` URI, kept as written without a trailing slash.

    Raises:
        ConfigError: a URI of another scheme (a run's lease needs S3's conditional
            writes), one with a query or without a bucket (key path ``output.dir``).
    """
    if text.startswith("file://"):
        return Path(urlsplit(text).path).resolve()
    if not is_uri(text):
        return Path(text).expanduser().resolve()
    parts = urlsplit(text)
    if parts.scheme != "s3":
        raise ConfigError(
            f"output folder {short(text, 120)}: only s3:// (any S3-compatible store) or a local "
            "folder can hold a run's output: one run per output needs a conditional write "
            f"(S3's If-None-Match), which {parts.scheme}:// does not offer through pyarrow.fs; "
            "the response cache (cache.path) and the seeds (seeds.path) accept any pyarrow.fs URI",
            key_path="output.dir",
        )
    if parts.query or not parts.netloc:
        raise ConfigError(
            f"output folder {short(text, 120)}: expected s3://BUCKET/PREFIX without a query; "
            "name another S3-compatible server with AWS_ENDPOINT_URL",
            key_path="output.dir",
        )
    return f"s3://{parts.netloc}/{parts.path.strip('/')}".rstrip("/")


class ObjectStoreError(OutputWriteError):
    """An object store refused or failed a request (names the object, the S3 error code)."""

    def __init__(self, path: Any, detail: str, *, hint: str | None = None) -> None:
        self.path = str(path)
        FactoryError.__init__(self, f"{self.path}: {detail}" + (f"; {hint}" if hint else ""))


class PreconditionFailed(Exception):
    """A conditional write or delete found another version than the one it named."""


@dataclass(frozen=True)
class Blob:
    """One object read back: its bytes, its version (ETag), when the server last wrote it
    and the server's own clock at the read (both epoch seconds, from the server: a lease's
    expiry is judged on one clock, whatever the hosts' clocks say)."""

    data: bytes
    etag: str
    modified: float
    server_now: float


def _register_credentials() -> None:
    """Mask the credentials in this process's logs, as ``api_key_from_env`` does for keys:
    botocore's debug records quote the access key id in each request's headers."""
    for var in CREDENTIAL_VARS:
        register_secret(os.environ.get(var))
    install_log_redaction()


_CLIENT_LOCK = threading.Lock()


def _client() -> Any:
    """A boto3 S3 client configured from the environment only.

    ``AWS_ENDPOINT_URL`` (an S3-compatible server) gets path-style addressing, which
    every such server accepts; AWS itself keeps boto3's default.
    """
    import boto3
    from botocore.config import Config

    _register_credentials()
    style = "path" if os.environ.get("AWS_ENDPOINT_URL") else "auto"
    config = Config(
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": style},
    )
    with _CLIENT_LOCK:  # boto3's default session is not thread-safe to create
        return boto3.session.Session().client("s3", config=config)


class S3Store:
    """The objects under one ``s3://bucket/prefix``, named by their path below it.

    Args:
        uri: ``s3://bucket/prefix``.
        client: a boto3 S3 client (tests); default one from the environment.
    """

    def __init__(self, uri: str, client: Any | None = None) -> None:
        parts = urlsplit(uri)
        self.uri = uri.rstrip("/")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._s3 = client if client is not None else _client()

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url(self, rel: str) -> str:
        return f"{self.uri}/{rel}"

    def _fail(self, rel: str, exc: BaseException, action: str) -> ObjectStoreError:
        """An S3 failure as one line: the code and status, never the server's body."""
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            detail, hint = (
                "no credentials",
                (
                    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a "
                    "server other than AWS) in the environment of the run"
                ),
            )
        elif isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(err.get("Code") or "error")
            detail = f"S3 {action} refused: {code} (HTTP {status})"
            hint = {
                "NoSuchBucket": f"create the bucket {self.bucket} first",
                "AccessDenied": "the credentials in the environment may not write this prefix",
                "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID / AWS_ENDPOINT_URL",
                "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY",
            }.get(code, "check the bucket, the credentials and AWS_ENDPOINT_URL, then run the "
                  "same command again to resume")  # fmt: skip
        else:
            detail = f"S3 {action} failed: {type(exc).__name__}"
            hint = "check that the store is reachable (AWS_ENDPOINT_URL), then run again"
        return ObjectStoreError(self.url(rel), detail, hint=hint)

    def _call(self, rel: str, action: str, fn: Any, **kw: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kw)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
                raise PreconditionFailed(rel) from None
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(self.url(rel)) from None
            raise self._fail(rel, exc, action) from None
        except BotoCoreError as exc:
            raise self._fail(rel, exc, action) from None

    # -- listing and whole objects ----------------------------------------------------------

    def list(self) -> dict[str, int]:
        """Every object below the prefix: path below it -> size."""
        out: dict[str, int] = {}
        base = f"{self.prefix}/" if self.prefix else ""
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Prefix": base}
            if token:
                kw["ContinuationToken"] = token
            page = self._call("", "list", self._s3.list_objects_v2, **kw)
            for item in page.get("Contents") or ():
                rel = item["Key"][len(base) :]
                if rel and not rel.endswith("/"):  # not a folder marker (pyarrow writes them)
                    out[rel] = int(item["Size"])
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")

    def get(self, rel: str) -> Blob:
        """One object with its version and the server's clock.

        Raises:
            FileNotFoundError: no such object.
        """
        resp = self._call(rel, "read", self._s3.get_object, Key=self.key(rel))
        data = resp["Body"].read()
        headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        modified = resp["LastModified"].timestamp()
        date = headers.get("date")
        now = email.utils.parsedate_to_datetime(date).timestamp() if date else modified
        return Blob(data, str(resp.get("ETag", "")), modified, now)

    def read_text(self, rel: str) -> str | None:
        """An object's text, or None when it is absent."""
        try:
            return self.get(rel).data.decode("utf-8")
        except FileNotFoundError:
            return None

    def put(
        self, rel: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None
    ) -> str:
        """Write an object whole; returns its new ETag.

        Raises:
            PreconditionFailed: ``if_absent`` and it exists, or ``if_match`` and its
                version is another.
        """
        kw: dict[str, Any] = {"Key": self.key(rel), "Body": data}
        if if_absent:
            kw["IfNoneMatch"] = "*"
        if if_match is not None:
            kw["IfMatch"] = if_match
        return str(self._call(rel, "write", self._s3.put_object, **kw).get("ETag", ""))

    def delete(self, rel: str, *, if_match: str | None = None) -> None:
        """Delete an object (absent already: fine).

        Raises:
            PreconditionFailed: ``if_match`` and its version is another.
        """
        kw: dict[str, Any] = {"Key": self.key(rel)}
        if if_match is not None:
            kw["IfMatch"] = if_match
        with contextlib.suppress(FileNotFoundError):
            self._call(rel, "delete", self._s3.delete_object, **kw)

    def delete_under(self, sub: str) -> int:
        """Delete every object below ``sub/``; returns how many."""
        names = [n for n in self.list() if n.startswith(sub.rstrip("/") + "/")]
        for name in names:
            self.delete(name)
        return len(names)

    # -- files -------------------------------------------------------------------------------

    def upload(self, rel: str, path: Path) -> None:
        """Upload a local file as the object ``rel`` (multipart for large files)."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._s3.upload_file(str(path), self.bucket, self.key(rel))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(rel, exc, "upload") from None
        except S3UploadFailedError:
            raise ObjectStoreError(self.url(rel), "S3 upload failed") from None

    def download(self, rel: str, path: Path) -> None:
        """Download the object ``rel`` into the local file ``path`` (folders created)."""
        from botocore.exceptions import BotoCoreError, ClientError

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._s3.download_file(self.bucket, self.key(rel), str(path))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(rel, exc, "download") from None


def open_store(uri: str) -> S3Store:
    """The store of an output URI (``output_location`` has checked its scheme)."""
    return S3Store(uri)
