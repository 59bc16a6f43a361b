from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory import secrets
from factory.secrets import (
    MASK,
    RedactingFilter,
    api_key_from_env,
    install_log_redaction,
    is_local_url,
    redact,
    redact_obj,
    register_secret,
)

KEY = "sk-test-abcdef0123456789ZYXW"
ODD_KEY = 'k3y/with+odd&chars="x"'


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    secrets.clear_secrets()
    yield
    secrets.clear_secrets()


def test_api_key_from_env_reads_and_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FACTORY_TEST_KEY", f"  {KEY}\n")
    assert api_key_from_env("FACTORY_TEST_KEY") == KEY
    assert redact(f"header Authorization: {KEY}") == f"header Authorization: {MASK}"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_api_key_from_env_unset_or_blank_is_none(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("FACTORY_TEST_KEY", raising=False)
    else:
        monkeypatch.setenv("FACTORY_TEST_KEY", value)
    assert api_key_from_env("FACTORY_TEST_KEY") is None


@pytest.mark.parametrize(
    "template",
    [
        "{k}",
        "Bearer {k}",
        "Authorization: Bearer {k}; next",
        "url?api_key={q}",
        '{{"api_key": "{j}"}}',
        "repr: {r}",
    ],
)
def test_redact_masks_key_and_its_variants(template: str) -> None:
    register_secret(ODD_KEY)
    text = template.format(
        k=ODD_KEY, q=quote(ODD_KEY, safe=""), j=json.dumps(ODD_KEY)[1:-1], r=repr(ODD_KEY)[1:-1]
    )
    out = redact(text)
    assert MASK in out
    for variant in (ODD_KEY, quote(ODD_KEY, safe=""), json.dumps(ODD_KEY)[1:-1]):
        assert variant not in out


def test_short_values_are_not_registered() -> None:
    register_secret("EMPTY")
    assert redact("EMPTY response") == "EMPTY response"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abcdefghijkl", f"Authorization: Bearer {MASK}"),
        ("authorization: BEARER abcdefghijkl", f"authorization: BEARER {MASK}"),
        ("authorization: bEaReR\tabcdefghijkl", f"authorization: bEaReR\t{MASK}"),
        ("key sk-proj-ABCDEFGHIJKLMNOPQRST end", f"key {MASK} end"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_redact_catches_unregistered_bearer_and_provider_keys(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redact_obj_walks_structures_and_masks_credential_fields() -> None:
    register_secret(KEY)
    manifest = {
        "llm": {
            "endpoints": [
                {"base_url": "http://x/v1", "api_key_env": "OPENAI_API_KEY"},
                {"base_url": "http://y/v1", "api_key": "unregistered-value"},
            ],
            "headers": ("Bearer " + KEY,),
            "max_tokens": 100,
        },
        f"note {KEY}": KEY,
    }
    out = redact_obj(manifest)
    dumped = json.dumps(out)
    assert KEY not in dumped and "unregistered-value" not in dumped
    assert out["llm"]["endpoints"][0]["api_key_env"] == "OPENAI_API_KEY"  # a name, not a key
    assert out["llm"]["endpoints"][1]["api_key"] == MASK
    assert out["llm"]["max_tokens"] == 100
    assert out["llm"]["headers"] == [f"Bearer {MASK}"]
    assert manifest["llm"]["endpoints"][1]["api_key"] == "unregistered-value"  # not mutated


def _capture(logger: logging.Logger) -> tuple[io.StringIO, logging.Handler]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger.addHandler(handler)
    return stream, handler


def test_filter_redacts_message_args_and_traceback() -> None:
    register_secret(KEY)
    logger = logging.getLogger("factory.test_secrets.direct")
    logger.propagate = False
    stream, handler = _capture(logger)
    logger.addFilter(RedactingFilter())
    try:
        logger.warning("sending %s with %r", f"Bearer {KEY}", {"key": KEY})
        try:
            raise RuntimeError(f"server echoed {KEY}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert KEY not in out
    assert "server echoed ***" in out and "Bearer ***" in out


def test_install_on_root_covers_child_loggers() -> None:
    register_secret(KEY)
    root = logging.getLogger()
    stream, handler = _capture(root)
    flt = install_log_redaction()
    try:
        assert install_log_redaction() is flt  # idempotent
        logging.getLogger("some.library").error("token=%s", KEY)
    finally:
        root.removeHandler(handler)
        root.removeFilter(flt)
        for other in root.handlers:
            other.removeFilter(flt)
    assert KEY not in stream.getvalue()
    assert "token=***" in stream.getvalue()


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
        ("http://localhost.evil.com/v1", False),
    ],
)
def test_is_local_url(url: str, local: bool) -> None:
    assert is_local_url(url) is local


@settings(max_examples=100)
@given(
    key=st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=8),
    prefix=st.text(max_size=20),
    suffix=st.text(max_size=20),
)
def test_registered_key_never_survives_redaction(key: str, prefix: str, suffix: str) -> None:
    secrets.clear_secrets()
    register_secret(key)
    assert key not in redact(prefix + key + suffix)


def test_a_secret_registered_after_redaction_began_is_masked_too() -> None:
    register_secret(KEY)
    assert redact(f"a {KEY}") == f"a {MASK}"
    later = "later-secret-0123456789"
    assert redact(f"b {later}") == f"b {later}"  # not registered yet
    register_secret(later)
    assert redact(f"b {later} {KEY}") == f"b {MASK} {MASK}"
