"""Turning signing on over a store of unsigned refs (issue 46, finding 5).

What a site met: a warning per old unsigned ref on every start; `env ls` showing refused refs as `0 B,
0 files`; a checkpoint warning naming the wrong tag; and no way to sign the refs it had, so the first
fresh node paid a full setup. Each test runs bootseer as a node would (a subprocess per start, its own
node cache), over a real store: a directory, and the loopback S3 server where the start's store matters."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bootseer_cli.freshness import SEQ_FIELD
from bootseer_cli.store.core import Store, blob_path
from bootseer_cli.trust import Trust, keygen
from tests.envsnap.conftest import run_cli

DOMAIN = "team"
SUMMARY = "unsigned ref"  # the one line a start prints for every unsigned ref it refused


class Site:
    """A job's directory, its env tree and store, and a config that turns signing on or leaves it off."""

    def __init__(self, tmp_path: Path, store_uri: str) -> None:
        self.dir, self.tree, self.uri = tmp_path, tmp_path / "venv", store_uri
        self.key = tmp_path / "team"
        keygen(f"{self.key}.key", f"{self.key}.pub", DOMAIN)
        self.nodes = 0

    def config(self, version: str, *, signed: bool, extra: str = "") -> None:
        setup = f"mkdir -p {self.tree} && echo {version} > {self.tree}/v && echo {version} >> {self.dir}/runs"
        trust = f'[trust]\nsigning_key = "{self.key}.key"\nverify_keys = ["{self.key}.pub"]\n' if signed else ""
        (self.dir / "bootseer.toml").write_text(
            f'[store]\nuri = "{self.uri}"\ndomain = "{DOMAIN}"\n[exec]\nagent = false\n'
            f'[env]\nroots = ["{self.tree}"]\nwait_s = 20\nparent_search_s = 120\nsetup = {json.dumps([setup])}\n'
            f"{trust}{extra}"
        )

    def run(self, *args: str, fresh: bool = True):  # type: ignore[no-untyped-def]
        """`bootseer ARGS` on a fresh node: an empty env tree (as the image has it), its own node cache."""
        if fresh and args[0] == "exec":
            shutil.rmtree(self.tree, ignore_errors=True)
        self.nodes += 1
        return run_cli(list(args), self.dir, self.dir / f"node-{self.nodes}")

    def setups(self) -> list[str]:
        runs = self.dir / "runs"
        return runs.read_text().split() if runs.exists() else []

    def store(self) -> Store:
        return Store(self.uri, settle_s=0.2).use_trust(Trust(DOMAIN, verify="off"))

    def env_refs(self) -> dict[str, dict[str, object]]:
        """Each env ref's raw document (signature included), by its setup's version."""
        st = self.store()
        out = {}
        for rel in st.list("refs/env"):
            doc = json.loads(st.get_bytes(rel) or b"{}")
            out[str(doc["inputs"][0]).split("echo ")[1].split(" ")[0]] = doc | {"rel": rel}
        return out

    def publish_unsigned(self, versions: list[str]) -> None:
        """The store as jobs filled it before signing was on: one env snapshot per setup version."""
        for v in versions:
            self.config(v, signed=False)
            r = self.run("exec", "--", "true")
            assert r.returncode == 0 and "published" in r.stderr, r.stderr
        assert self.setups() == versions
        assert all("_sig" not in doc for doc in self.env_refs().values())


@pytest.fixture
def site(tmp_path: Path, store_uri: str) -> Site:
    return Site(tmp_path, store_uri)


@pytest.mark.parametrize("store_uri", ["file"], indirect=True)
def test_a_start_over_unsigned_refs_warns_once_with_the_fix(site: Site) -> None:
    """Before: one `... is not used: unsigned` line per env ref (the parent search reads them all), on
    every start. Now one line: how many of which kind, why, and the command that fixes it."""
    site.publish_unsigned(["v1", "v2", "v3"])
    site.config("v4", signed=True)  # a new env: the stage misses, and reads every env ref for a parent
    r = site.run("exec", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "is not used: unsigned" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if SUMMARY in ln]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bootseer: warning: 3 unsigned refs in ") and "env 3" in lines[0]
    assert "[trust] verify requires a signature" in lines[0] and lines[0].endswith("bootseer trust sign")
    assert site.setups()[-1] == "v4"  # the miss: the setup ran, as it must


@pytest.mark.parametrize("store_uri", ["file"], indirect=True)
def test_env_ls_marks_an_unverified_ref_and_shows_no_made_up_numbers(site: Site) -> None:
    site.publish_unsigned(["v1"])
    site.config("v2", signed=True)
    assert site.run("exec", "--", "true").returncode == 0  # one signed snapshot beside the unsigned one
    refs = site.env_refs()
    r = site.run("env", "ls")
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    old, new = refs["v1"]["rel"], refs["v2"]["rel"]
    old_row, new_row = rows[str(old).split("/")[-1][:16]], rows[str(new).split("/")[-1][:16]]
    assert old_row.endswith("unverified: unsigned") and "0 B" not in old_row and old_row.split()[1:4] == ["-"] * 3
    assert "unverified" not in new_row and " B " in new_row
    assert "1 snapshot unverified" in r.stderr and SUMMARY not in r.stderr  # listed as such, not warned about
    listed = json.loads(site.run("env", "ls", "--json").stdout)
    old_key = str(old).split("/")[-1].removesuffix(".json")
    assert [row for row in listed if "unverified" in row] == [{"env_key": old_key, "unverified": "unsigned"}]
    shown = site.run("env", "show", old_key[:12])  # not an empty ref: said to be unverified, in one line
    said = f"bootseer: error: env {old_key[:16]}: unverified: unsigned (bootseer trust sign)\n"
    assert shown.returncode != 0 and shown.stderr == said, shown.stderr


def test_trust_sign_then_a_fresh_node_restores_and_a_tampered_ref_stays_unsigned(site: Site) -> None:
    """After `bootseer trust sign` a fresh node, with verification required, restores the old snapshot
    (no setup); a ref whose blob was altered is refused by `trust sign`, reported, and stays unsigned."""
    site.publish_unsigned(["v1", "v2"])
    refs = site.env_refs()
    st = site.store()
    st.put_bytes(blob_path(str(refs["v2"]["blob"])), b"not what the ref names")  # tampered in the store
    site.config("v1", signed=True)
    dry = site.run("trust", "sign", "--dry-run")
    assert dry.returncode == 1, dry.stderr  # a ref is refused: non-zero, even in a dry run
    assert "would sign 1 ref of domain team (env 1)" in dry.stdout, dry.stdout
    assert site.env_refs()["v1"] == refs["v1"]  # a dry run writes nothing
    r = site.run("trust", "sign")
    assert r.returncode == 1, r.stderr
    assert "signed 1 ref of domain team (env 1)" in r.stdout and "1 refused" in r.stdout, r.stdout
    (refused,) = [ln for ln in r.stderr.splitlines() if ln.startswith("not signed:")]
    assert str(refs["v2"]["rel"]) in refused and "does not hash to its address" in refused
    after = site.env_refs()
    assert "_sig" in after["v1"] and "_sig" not in after["v2"]
    assert {k: v for k, v in after["v1"].items() if k not in ("_sig", SEQ_FIELD)} == refs["v1"]  # nothing else
    start = site.run("exec", "--", "true")
    assert start.returncode == 0 and "restored" in start.stderr, start.stderr
    assert SUMMARY not in start.stderr, start.stderr  # the signed ref verifies: nothing refused
    assert site.setups() == ["v1", "v2"] and (site.tree / "v").read_text() == "v1\n"  # restored, not set up
    again = site.run("trust", "sign")  # a second run: the signed one is left, the tampered one refused again
    assert again.returncode == 1 and "1 already signed" in again.stdout and "1 refused" in again.stdout


@pytest.mark.parametrize("store_uri", ["file"], indirect=True)
def test_trust_sign_refuses_bad_input_in_one_line(site: Site, tmp_path: Path) -> None:
    site.publish_unsigned(["v1"])
    before = site.env_refs()
    r = site.run("trust", "sign")  # signing is not on: no key to sign with
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "[trust] signing_key is not set" in r.stderr
    assert "Traceback" not in r.stderr and site.env_refs() == before
    site.config("v1", signed=True)
    keygen(str(tmp_path / "other.key"), str(tmp_path / "other.pub"), DOMAIN)  # a key readers do not trust
    toml = site.dir / "bootseer.toml"
    toml.write_text(toml.read_text().replace(f"{site.key}.key", f"{tmp_path}/other.key"))
    r = site.run("trust", "sign")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "is not in [trust] verify_keys" in r.stderr, r.stderr
    assert site.env_refs() == before
    site.config("v1", signed=True)
    not_a_store = tmp_path / "a-file"
    not_a_store.write_text("")
    r = site.run("trust", "sign", "--store", not_a_store.as_uri())
    assert r.returncode != 0 and r.stderr.startswith("bootseer: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and site.env_refs() == before


@pytest.mark.parametrize("store_uri", ["file"], indirect=True)
def test_the_checkpoint_warning_names_the_newest_tag_and_why(site: Site, tmp_path: Path) -> None:
    """Two unsigned tags, the newer one first in the alphabet. Before: `checkpoint m:t-b not found`, the
    older tag, and a falsehood. Now the newest tag, not used because it is unsigned; once signed, pulled."""
    data = tmp_path / "ckpt"
    data.mkdir()
    (data / "w.bin").write_bytes(os.urandom(1000))
    site.config("v1", signed=False)
    for tag in ("t-b", "t-a"):  # t-b is the older
        assert site.run("ckpt", "push", str(data), "--name", "m", "--tag", tag).returncode == 0
    site.config("v1", signed=True, extra='[checkpoint]\nname = "m"\nmode = "pull"\n')
    r = site.run("exec", "--skip", "env", "--", "true")
    assert r.returncode == 0, r.stderr
    (warning,) = [ln for ln in r.stderr.splitlines() if "warning: checkpoint:" in ln]
    assert "checkpoint m:t-a in " in warning and "is not used: unsigned" in warning, warning
    assert "t-b" not in warning and "not found" not in warning
    ls = site.run("ckpt", "ls")
    assert ls.stdout.splitlines() == ["m:t-b  (unverified: unsigned)", "m:t-a  (unverified: unsigned)"], ls.stdout
    signed = site.run("trust", "sign")
    assert signed.returncode == 0 and "signed 3 refs of domain team (ckpt 3)" in signed.stdout, signed.stdout
    r = site.run("exec", "--skip", "env", "--", "sh", "-c", 'cat "$BOOTSEER_CKPT_DIR/w.bin" > got')
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert (site.dir / "got").read_bytes() == (data / "w.bin").read_bytes()
