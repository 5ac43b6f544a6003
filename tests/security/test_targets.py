"""Item 4 of issue 14: a manifest's stripe targets are untrusted.

A target is matched (scheme, host or bucket, path) to the store or a configured `[checkpoint]
targets` entry and opened through that configuration; anything else is refused with one clear line,
before a directory is created or a request is sent. Real `bootseer ckpt pull` processes against a
file:// store and the loopback S3 server; a plain socket listens where a hostile manifest points.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.stripe.layout import manifest_rel
from bootseer_cli.stripe.push import push

pytestmark = pytest.mark.integration

CELL = 64 << 10


def _ckpt(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(3 * CELL + 5))
    return src


def _pull(
    tmp_path: Path, store_uri: str, dest: Path, targets: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "bootseer.toml"
    cfg.write_text(f'[store]\nuri = "{store_uri}"\n\n[checkpoint]\ntargets = {json.dumps(targets or [])}\n')
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "ckpt", "pull", "job:t1", str(dest), "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _retarget(store: Store, target: str) -> None:
    """Rewrite the stored manifest so every stripe names `target` (what a hostile writer can do)."""
    doc = json.loads(store.get_bytes(manifest_rel("job", "t1")) or b"")
    for s in doc["stripes"]:
        s["target"] = target
    store.put_bytes(manifest_rel("job", "t1"), json.dumps(doc).encode())


def test_unknown_file_target_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    store = Store((tmp_path / "store").as_uri())
    push(store, _ckpt(tmp_path), "job", "t1", stripes=2, cell_size=CELL)
    elsewhere = tmp_path / "some" / "other" / "path"
    _retarget(store, elsewhere.as_uri())
    r = _pull(tmp_path, store.uri, tmp_path / "dest")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "is neither the store nor a configured [checkpoint] targets entry" in r.stderr, r.stderr
    assert not (tmp_path / "some").exists(), "the manifest's target directory was created"
    assert not (tmp_path / "dest").exists()


def test_configured_target_is_matched_without_trusting_the_manifest(tmp_path: Path) -> None:
    """A stripe on a configured target still pulls (the match ignores what the manifest adds)."""
    store = Store((tmp_path / "store").as_uri())
    other = Store((tmp_path / "t2").as_uri())
    push(store, _ckpt(tmp_path), "job", "t1", stripes=2, cell_size=CELL, targets=[other])
    r = _pull(tmp_path, store.uri, tmp_path / "dest", targets=[other.uri])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dest" / "w.bin").read_bytes() == (tmp_path / "src" / "w.bin").read_bytes()


@pytest.mark.parametrize("path", ["x", "same"])
def test_endpoint_override_in_a_manifest_sends_nothing_there(tmp_path: Path, s3_server, path: str) -> None:  # type: ignore[no-untyped-def]
    """`x`: an unknown bucket path; `same`: the store's own bucket path with a hostile endpoint.
    Both are refused (an endpoint only selects among configured targets); neither connects."""
    prefix = f"sec-{os.urandom(4).hex()}"
    store = Store(s3_server.uri(prefix))
    push(store, _ckpt(tmp_path), "job", "t1", stripes=2, cell_size=CELL)
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(16)
    trap.setblocking(False)
    port = trap.getsockname()[1]
    bucket_path = prefix if path == "same" else "x"
    _retarget(store, f"s3://{s3_server.bucket}/{bucket_path}?endpoint_override=127.0.0.1:{port}&scheme=http")
    try:
        r = _pull(tmp_path, store.uri, tmp_path / "dest")
        with pytest.raises(BlockingIOError):
            trap.accept()  # a connection attempt would be waiting in the backlog
    finally:
        trap.close()
    assert "Traceback" not in r.stderr
    assert r.returncode != 0 and "configured [checkpoint] targets" in r.stderr, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr  # the line names the target it refused
