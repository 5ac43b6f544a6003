"""Redacted display forms of URIs: what bootseer may print, log, record or upload.

A store URI may carry credentials (`s3://KEY:SECRET@bucket/…`, `?session_token=…`). Messages,
stage events (uploaded to the shared store), reports, `config`, `doctor`, and the agent's files must
show where the store is without the secret, so every such text goes through `redact` (one URI) or
`redact_text` (free text that may contain URIs). The full URI stays in memory (`Store`) and reaches a
child process only through its environment or a 0600 file, never its argv.

A client's error text can hold a secret outside any URI: pyarrow split `s3://KEY:abc/Secret@bkt/p` at
the secret's "/" and said `key 'Secret@bkt/p…'`. So `redact` also remembers every secret it masks (and
its "/"-separated pieces), and `redact_text`, which every message, warning and event passes through,
masks those, and the store credentials of the environment, wherever they appear: the one place where
the text of errors from pyarrow, obstore and libtorrent is cleaned.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

MASK = "***"

# Query parameters whose values are (or may be) secrets, compared after lower-casing and removing
# "-" and "_": secret_key, access_key, session_token, password, token, sig, signature, X-Amz-…
_SECRET_NAMES = ("secret", "password", "passwd", "pwd", "token", "sig", "signature", "credential", "accesskey", "key")
_SECRET_EXACT = ("sig", "key", "pwd", "auth", "authorization", "sas")

# A URI inside free text: a scheme, "://", then anything up to white space or a quote/bracket.
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")

# Secrets seen by `redact` in this process, masked in free text by `redact_text`. A piece shorter than
# _MIN_PIECE, or a whole secret shorter than _MIN_WHOLE, is not masked in bare text (it would mask
# letters of ordinary words; inside its URI it is masked anyway). User info without a password is a
# user name unless it is as long as a token.
_SEEN: set[str] = set()
_MIN_PIECE = 6
_MIN_WHOLE = 4
_MIN_TOKEN = 16
# Environment variables whose values are store credentials (a client may echo them in its errors).
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN")


def _secret_name(name: str) -> bool:
    n = name.lower().replace("-", "").replace("_", "")
    return n in _SECRET_EXACT or any(s in n for s in _SECRET_NAMES if len(s) > 3)


def redact(uri: str) -> str:
    """`uri` with user info and secret-looking query values replaced by `***`.

    A text that is not a URI (a local path) comes back unchanged. A URI that cannot be parsed is
    masked after its scheme, since it cannot be told apart from one that carries a secret.
    """
    if "://" not in uri:
        return uri
    _remember(uri)
    uri = _userinfo_to_last_at(uri)
    try:
        parts = urlsplit(uri)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return uri.split("://", 1)[0] + "://" + MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{host}" + (f":{port}" if port else "")
    query = "&".join(_redact_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _userinfo_to_last_at(uri: str) -> str:
    """`uri` with everything before the last "@" of its authority-and-path taken as user info (and
    replaced by a placeholder that `redact` masks).

    A secret may hold an unencoded "/" (AWS secret keys do): in `s3://user:123/abc@host/b` urlsplit
    ends the netloc at the "/", reads "123" as a port and "/abc@host/b" as the path, and the secret
    would be printed whole. An "@" before the query whose left side has a ":" (user:secret) or no "/"
    (plain user info) ends the user info; `s3://bucket/dir@v1` keeps its path."""
    scheme, rest = uri.split("://", 1)
    head = re.split(r"[?#]", rest, maxsplit=1)[0]
    at = head.rfind("@")
    if at < 0 or (":" not in head[:at] and "/" in head[:at]):
        return uri
    return f"{scheme}://user@{rest[at + 1 :]}"


def _redact_pair(pair: str) -> str:
    """One `name=value` of a query: kept as written (so the redacted form of a URI without secrets
    is the URI itself), or with its value masked when the name looks like a secret's."""
    name, eq, _ = pair.partition("=")
    return f"{name}={MASK}" if eq and _secret_name(unquote(name)) else pair


def _remember(uri: str) -> None:
    """Keep the secrets `uri` carries (its user info's password, secret-looking query values) for
    `redact_text`, with their decoded forms and "/"-separated pieces: a client that split the URI at
    a "/" of the secret prints the piece after it."""
    rest = uri.split("://", 1)[1]
    head = re.split(r"[?#]", rest, maxsplit=1)[0]
    at = head.rfind("@")
    found = []
    if at >= 0 and (":" in head[:at] or "/" not in head[:at]):
        user, colon, password = head[:at].partition(":")
        if colon or len(user) >= _MIN_TOKEN:
            found.append(password if colon else user)
    query = rest.partition("?")[2].partition("#")[0]
    found += [v for k, v in parse_qsl(query, keep_blank_values=False) if _secret_name(k)]
    for secret in found:
        for form in {secret, unquote(secret)}:
            if len(form) >= _MIN_WHOLE:
                _SEEN.add(form)
            _SEEN.update(p for p in form.split("/") if len(p) >= _MIN_PIECE)


def _secrets() -> list[str]:
    """What `redact_text` masks outside URIs, longest first (a piece never leaves its whole half-shown)."""
    env = (os.environ.get(name, "") for name in _SECRET_ENV)
    return sorted(_SEEN.union(v for v in env if len(v) >= _MIN_PIECE), key=len, reverse=True)


def redact_text(text: str) -> str:
    """Free text (an error message, a warning, a log line) with every URI in it redacted and every
    secret this process knows of masked, wherever it stands (a client's error may print one bare)."""
    if "://" in text:
        text = _URI_IN_TEXT.sub(lambda m: redact(m.group(0)), text)
    for secret in _secrets():
        if secret in text:
            text = text.replace(secret, MASK)
    return text


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()  # the agent's threads and a stage's pool warn too


def warn(msg: str, *, once: bool = False) -> None:
    """bootseer's one way to warn: `bootseer: warning: MSG` on stderr, loud even under --quiet (a fallback is
    something a user must see), after `redact_text` (a warning often carries an exception's text, which may
    hold a URI with its credentials). `once`: said once per process (a stage may meet the same refusal
    several times)."""
    text = redact_text(msg)
    if once:
        with _WARNED_LOCK:
            if text in _WARNED:
                return
            _WARNED.add(text)
    print(f"bootseer: warning: {text}", file=sys.stderr, flush=True)
