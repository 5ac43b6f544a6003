from __future__ import annotations

from pathlib import Path

import pytest

from bootseer_cli import identity, keys
from bootseer_cli.config import load
from bootseer_cli.errors import ConfigError
from bootseer_cli.settings import EnvSettings, Settings


def keys_here() -> keys.Keys:
    """The keys `bootseer keys` computes for the config in the current directory."""
    return identity.keys_for(Settings.from_config(load()))


def env_digest(**overrides: object) -> str:
    args: dict[str, object] = {
        "image_key": "a" * 64,
        "setup": ["pip install -r requirements.txt"],
        "files": {"requirements.txt": "b" * 64},
        "key_env": {"TORCH_CUDA_ARCH_LIST": "8.0"},
        "machine": "x86_64",
    }
    args.update(overrides)
    return keys.make_key(keys.env_key_doc(**args)).digest  # type: ignore[arg-type]


def test_env_key_is_deterministic_and_canonical() -> None:
    assert env_digest() == env_digest()
    a = keys.make_key({"x": 1, "y": [1, 2]})
    b = keys.make_key({"y": [1, 2], "x": 1})
    assert a.digest == b.digest and len(a.digest) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"image_key": "c" * 64},
        {"setup": ["pip install -r requirements.txt", "pip install flash-attn"]},
        {"setup": ["uv pip install -r requirements.txt"]},
        {"files": {"requirements.txt": "d" * 64}},
        {"files": {"requirements.txt": "b" * 64, "constraints.txt": "e" * 64}},
        {"key_env": {"TORCH_CUDA_ARCH_LIST": "9.0"}},
        {"key_env": {"TORCH_CUDA_ARCH_LIST": None}},
        {"machine": "aarch64"},
    ],
)
def test_each_input_changes_env_key(change: dict[str, object]) -> None:
    assert env_digest(**change) != env_digest()


def test_image_key_digest_vs_fingerprint() -> None:
    by_digest = keys.make_key(keys.image_key_doc("sha256:" + "1" * 64, None))
    assert by_digest.doc["kind"] == "image"
    fp = identity.gather_rootfs_fingerprint()
    assert fp == identity.gather_rootfs_fingerprint()
    by_fp = keys.make_key(keys.image_key_doc(None, fp))
    assert by_fp.digest != by_digest.digest
    other = dict(fp, python="0.0.0")
    assert keys.make_key(keys.image_key_doc(None, other)).digest != by_fp.digest


def test_image_digest_from_ref() -> None:
    d = "sha256:" + "2" * 64
    assert keys.image_digest_from_ref(f"registry:5000/train@{d}") == d
    assert keys.image_digest_from_ref(d) == d
    assert keys.image_digest_from_ref("train:latest") is None
    assert keys.image_digest_from_ref(None) is None


def test_files_named_by_setup() -> None:
    setup = [
        "pip install -r requirements.txt -c constraints.txt",
        "uv pip install --requirement=extra.txt --no-deps x",
        "python3 -m pip install -rdev.txt",
        "pip install -r https://example.invalid/r.txt",
        "rm -rf build && PIP_NO_CACHE_DIR=1 pip3 install -r lock.txt; python -c 'print(1)'",
        "sh -c 'cd sub && pip install -r nested.txt'",
        "conda install --file env.txt",
        "make -C src -r",
    ]
    assert keys.files_named_by(setup) == [
        "requirements.txt",
        "constraints.txt",
        "extra.txt",
        "dev.txt",
        "lock.txt",
        "nested.txt",
        "env.txt",
    ]


def test_setup_without_installer_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rm -rf build` once disabled the env stage (read as `-r f`): it names no file."""
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["rm -rf build", "python -c pass"]\n')
    monkeypatch.chdir(tmp_path)
    assert keys_here().env.doc["files"] == {}


def test_compute_reads_files_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "requirements.txt").write_text("six==1.16.0\n")
    (tmp_path / "bootseer.toml").write_text(
        '[env]\nsetup = ["pip install -r requirements.txt"]\nkey_env = ["BS_TEST_ARCH"]\n'
    )
    monkeypatch.chdir(tmp_path)
    first = keys_here()
    assert first.env.doc["files"]["requirements.txt"]
    assert first.env.doc["image"] == first.image.digest
    assert keys_here().env.digest == first.env.digest
    (tmp_path / "requirements.txt").write_text("six==1.17.0\n")
    second = keys_here()
    assert second.env.digest != first.env.digest
    assert second.image.digest == first.image.digest
    monkeypatch.setenv("BS_TEST_ARCH", "8.0")
    assert keys_here().env.digest != second.env.digest
    monkeypatch.setenv("BOOTSEER_IMAGE", "reg/x@sha256:" + "3" * 64)
    pinned = keys_here()
    assert pinned.image.doc == {"v": 1, "kind": "image", "digest": "sha256:" + "3" * 64}


def test_files_a_requirement_file_includes_are_in_the_env_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A team's file that says `-r base.txt`: a change to the base alone kept the env key, so the env
    built before it was restored (a wrong start). Includes follow pip: relative to the includer,
    `-c` too, nested, each file once; prewarm carries them into the container where pip looks."""
    from bootseer_cli.containers.prewarm import WORKDIR, setup_files

    (tmp_path / "deps").mkdir()
    (tmp_path / "requirements.txt").write_text("-r deps/base.txt\nsix==1.16.0\n")
    (tmp_path / "deps" / "base.txt").write_text("--requirement=more.txt\n-c ../cons.txt\n-r base.txt\n")
    (tmp_path / "deps" / "more.txt").write_text("tabulate==0.9.0\n")
    (tmp_path / "cons.txt").write_text("numpy<3\n")
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["pip install -r requirements.txt"]\n')
    monkeypatch.chdir(tmp_path)
    first = keys_here()
    assert sorted(first.env.doc["files"]) == [
        "requirements.txt",
        "requirements.txt > deps/base.txt",
        "requirements.txt > deps/base.txt > ../cons.txt",
        "requirements.txt > deps/base.txt > more.txt",
    ]
    seen = {first.env.digest}
    for changed in ["deps/more.txt", "cons.txt", "deps/base.txt"]:
        (tmp_path / changed).write_text((tmp_path / changed).read_text() + "pyyaml==6.0\n")
        seen.add(keys_here().env.digest)
    assert len(seen) == 4  # each change to an included file alone is a new env
    carried = {dest: src.name for dest, src in setup_files(Settings.from_config(load()))}
    assert carried == {
        f"{WORKDIR}/bootseer.toml": "bootseer.toml",
        f"{WORKDIR}/requirements.txt": "requirements.txt",
        f"{WORKDIR}/deps/base.txt": "base.txt",
        f"{WORKDIR}/deps/more.txt": "more.txt",
        f"{WORKDIR}/cons.txt": "cons.txt",
    }
    (tmp_path / "deps" / "more.txt").unlink()
    with pytest.raises(ConfigError, match=r"requirements\.txt > deps/base\.txt > more\.txt"):
        keys_here()


def test_unreadable_requirements_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["pip install -r missing.txt"]\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"missing\.txt"):
        keys_here()


def test_compute_is_pure() -> None:
    """The keys follow from the facts passed in, nothing read from the machine (issue 12, item 5)."""
    env = EnvSettings(setup=("pip install -r r.txt",), key_env=("ARCH",))
    pinned = keys.ImageIdentity("sha256:" + "4" * 64, None, "image ref")
    args = {"files": {"r.txt": "f" * 64}, "key_env": {"ARCH": "8.0"}, "machine": "x86_64"}
    first = keys.compute(env, pinned, **args)  # type: ignore[arg-type]
    assert first == keys.compute(env, pinned, **args)  # type: ignore[arg-type]
    assert first.image.doc == {"v": 1, "kind": "image", "digest": "sha256:" + "4" * 64}
    assert first.env.doc["files"] == {"r.txt": "f" * 64} and first.image_source == "image ref"
    fingerprinted = keys.compute(env, keys.ImageIdentity(None, {"python": "3.11"}, "fp"), **args)  # type: ignore[arg-type]
    assert fingerprinted.image.doc["kind"] == "rootfs" and fingerprinted.env.digest != first.env.digest
    assert keys.env_file_names(EnvSettings(setup=("pip install -r r.txt",), files=("x.lock", "r.txt"))) == [
        "r.txt",
        "x.lock",
    ]
