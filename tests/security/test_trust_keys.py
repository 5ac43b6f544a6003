"""Keys and signatures (issue 25): what a signature covers, which key may sign for which domain, and how a
key file is read (no link followed, no FIFO waited on, a regular file of bounded size)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bootseer_cli.errors import ConfigError
from bootseer_cli.trust import Trust, keygen, load_signer, load_verifiers, read_key_file


def pair(tmp_path: Path, domain: str, name: str | None = None) -> tuple[str, str]:
    name = name or domain
    priv, pub = str(tmp_path / f"{name}.key"), str(tmp_path / f"{name}.pub")
    keygen(priv, pub, domain)
    return priv, pub


def test_keygen_writes_a_private_0600_half_and_never_overwrites(tmp_path: Path) -> None:
    priv, pub = pair(tmp_path, "team-a")
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    assert Path(pub).read_text().startswith("bootseer-ed25519 ") and Path(pub).read_text().split()[2] == "team-a"
    before = Path(priv).read_bytes()
    with pytest.raises(ConfigError, match="never overwrites"):
        keygen(priv, str(tmp_path / "other.pub"), "team-a")
    assert Path(priv).read_bytes() == before and not (tmp_path / "other.pub").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["team-a.key", "team-a.pub"]  # nothing half-written


def test_a_signature_covers_the_domain_the_path_and_the_document(tmp_path: Path) -> None:
    priv, pub = pair(tmp_path, "team-a")
    writer = Trust("team-a", signer=load_signer(priv))
    reader = Trust("team-b", read_from=("team-a",), verifiers=load_verifiers([pub]))
    doc = writer.sign("team-a", "refs/env/k1.json", {"blob": "ab" * 32, "size": 3})
    assert reader.check("team-a", "refs/env/k1.json", doc) == ""
    assert "bad signature" in reader.check("team-a", "refs/env/k2.json", doc)  # moved to another key
    assert reader.check("team-a", "refs/env/k1.json", {**doc, "blob": "cd" * 32}).startswith("bad signature")
    assert "not of team-c" in reader.check("team-c", "refs/env/k1.json", doc)  # another domain's key
    assert reader.check("team-a", "refs/env/k1.json", {"blob": "ab" * 32}) == "unsigned"


def test_a_retired_key_verifies_nothing(tmp_path: Path) -> None:
    old_priv, old_pub = pair(tmp_path, "team-a", "old")
    _, new_pub = pair(tmp_path, "team-a", "new")
    doc = Trust("team-a", signer=load_signer(old_priv)).sign("team-a", "refs/hot/k.json", {"blob": "ab" * 32})
    assert Trust("team-a", verifiers=load_verifiers([old_pub, new_pub])).check("team-a", "refs/hot/k.json", doc) == ""
    why = Trust("team-a", verifiers=load_verifiers([new_pub])).check("team-a", "refs/hot/k.json", doc)
    assert "not in [trust] verify_keys" in why


def test_without_keys_only_the_own_domain_is_read() -> None:
    t = Trust("alice", read_from=("ci",))
    assert t.domains == ("alice",) and not t.required
    assert t.check("alice", "refs/env/k.json", {"blob": "x"}) == ""
    assert "another domain" in t.check("ci", "refs/env/k.json", {"blob": "x"})


def test_key_files_are_read_without_following_links_or_waiting(tmp_path: Path) -> None:
    priv, _ = pair(tmp_path, "a")
    link = tmp_path / "link.key"
    link.symlink_to(priv)
    with pytest.raises(ConfigError):
        read_key_file(str(link))
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_key_file(str(fifo))  # returns at once: opened O_NONBLOCK, refused by fstat
    big = tmp_path / "big.key"
    big.write_bytes(b"x" * (1 << 20))
    with pytest.raises(ConfigError, match="more than a key file holds"):
        read_key_file(str(big))
    junk = tmp_path / "junk.key"
    junk.write_text("junk")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_signer(str(junk))
