"""The redacted display form of a URI: what may be printed, logged, recorded or uploaded."""

from __future__ import annotations

import pytest

from bootseer_cli.redact import redact, redact_text
from bootseer_cli.store.core import Store


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (
            "s3://KEY:SECRET@bucket/p?endpoint_override=127.0.0.1:9000&scheme=http",
            "s3://***@bucket/p?endpoint_override=127.0.0.1:9000&scheme=http",
        ),
        ("s3://bucket/p?session_token=TOK&region=us-east-1", "s3://bucket/p?session_token=***&region=us-east-1"),
        (
            "https://h/x?X-Amz-Signature=S&sig=S&access_key=A&secret_key=B&password=C&token=D",
            "https://h/x?X-Amz-Signature=***&sig=***&access_key=***&secret_key=***&password=***&token=***",
        ),
        ("gs://user@bucket/x", "gs://***@bucket/x"),
        ("file:///tmp/store", "file:///tmp/store"),
        ("/plain/path", "/plain/path"),
        (
            "s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http",
            "s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http",
        ),
    ],
)
def test_redact(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_redact_text_finds_every_uri() -> None:
    text = "store 's3://K:S@b/p?token=T': cannot stat s3://K:S@b/q (see https://x:y@h/z)"
    out = redact_text(text)
    assert "K:S" not in out and "T'" not in out and "x:y" not in out
    assert out.count("***@") == 3


def test_store_shows_the_redacted_uri_and_keeps_the_full_one(tmp_path: object) -> None:
    uri = "s3://AKID:SECRET@bucket/p?endpoint_override=127.0.0.1:1&scheme=http&connect_timeout=1"
    st = Store(uri)
    assert st.uri == "s3://***@bucket/p?endpoint_override=127.0.0.1:1&scheme=http&connect_timeout=1"
    assert st.uri_with_credentials() == uri


def test_store_errors_carry_no_secret() -> None:
    from bootseer_cli.errors import StoreError

    with pytest.raises(StoreError) as e:
        Store("s3://AKID:SECRET@bucket/p?nonsense=1&token=TOK")
    assert "SECRET" not in str(e.value) and "AKID" not in str(e.value) and "TOK" not in str(e.value)


def test_a_manifest_records_the_same_target_for_the_full_and_the_shown_uri() -> None:
    """push records `public_uri(target.uri)` (redacted); a reader maps configured full URIs through
    `public_uri` too: both must agree, and neither may carry a secret."""
    from bootseer_cli.stripe.catalog import public_uri

    full = "s3://AKID:SECRET@ckpt-a/x?endpoint_override=127.0.0.1:1&scheme=http&session_token=TOK"
    shown = Store(full).uri
    assert (
        public_uri(full)
        == public_uri(shown)
        == "s3://ckpt-a/x?endpoint_override=127.0.0.1:1&scheme=http&session_token=***"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "s3://user:123/abc@host/bucket",  # the secret starts with digits: urlsplit reads a port, the rest a path
        "s3://123:456/def@host/bucket?region=us-east-1",
        "s3://123:abc/def@host/bucket",
        "s3://AKIA123/abc:def+ghi@host/bucket",
    ],
)
def test_a_secret_with_an_unencoded_slash_is_masked(uri: str) -> None:
    secret = uri.split("://", 1)[1].rsplit("@", 1)[0]
    shown = redact(uri)
    assert shown.startswith("s3://***@host/bucket"), shown
    for part in secret.replace(":", "/").split("/"):
        assert part not in shown.split("://", 1)[1], shown
    assert secret not in redact_text(f"cannot open {uri}: denied")


def test_an_at_sign_in_a_path_is_not_user_info() -> None:
    assert redact("s3://bucket/dir@v1/x") == "s3://bucket/dir@v1/x"


def test_the_one_warning_is_redacted_and_said_once_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    from bootseer_cli.redact import warn

    warn("fetch from s3://AKIDWARN:SECRETWARN99@bkt/p failed")
    warn("the ref is unsigned", once=True)
    warn("the ref is unsigned", once=True)
    warn("the ref is unsigned")  # not asked to be quiet the second time
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "bootseer: warning: fetch from s3://***@bkt/p failed",
        "bootseer: warning: the ref is unsigned",
        "bootseer: warning: the ref is unsigned",
    ]
