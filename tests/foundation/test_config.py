from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.config import load
from bootseer_cli.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bootseer.toml"
    p.write_text(text)
    return p


def test_defaults_without_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load()
    assert cfg.path is None
    assert cfg.get("env", "setup") == []
    assert cfg.source("env", "setup") == "default"
    assert cfg.get("image", "record") == "auto"


def test_layers_file_env_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[store]\nuri = "file:///from-file"\n[env]\nwait_s = 5\n')
    cfg = load(path)
    assert cfg.get("store", "uri") == "file:///from-file"
    assert cfg.source("store", "uri") == f"file:{path}:2"
    assert cfg.get("env", "wait_s") == 5.0 and isinstance(cfg.get("env", "wait_s"), float)

    monkeypatch.setenv("BOOTSEER_STORE", "file:///from-env")
    monkeypatch.setenv("BOOTSEER_ENV_WAIT_S", "7.5")
    cfg = load(path)
    assert cfg.get("store", "uri") == "file:///from-env"
    assert cfg.source("store", "uri") == "env:BOOTSEER_STORE"
    assert cfg.get("env", "wait_s") == 7.5

    cfg = load(path, {("store", "uri"): "file:///from-flag"})
    assert cfg.get("store", "uri") == "file:///from-flag"
    assert cfg.source("store", "uri") == "flag"


def test_config_found_in_cwd_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, '[env]\nsetup = ["true"]\n')
    monkeypatch.chdir(tmp_path)
    assert load().get("env", "setup") == ["true"]
    other = tmp_path / "sub"
    other.mkdir()
    (other / "x.toml").write_text('[env]\nsetup = ["false"]\n')
    monkeypatch.setenv("BOOTSEER_CONFIG", str(other / "x.toml"))
    cfg = load()
    assert cfg.get("env", "setup") == ["false"]
    assert cfg.base_dir == other


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[env]\nsetup = [\n", "invalid TOML"),
        ('[env]\nsetpu = ["x"]\n', "bootseer.toml:2: unknown key 'setpu' in [env]"),
        ("[nope]\nx = 1\n", "bootseer.toml:1: unknown section [nope]"),
        ('[env]\nwait_s = "soon"\n', "[env] wait_s must be a number of seconds >= 0"),
        ('\n\n[image]\nrecord = "sometimes"\n', "bootseer.toml:4: [image] record must be one of auto, always, never"),
        ("[env]\nsetup = [1, 2]\n", "[env] setup must be a list of strings"),
        ("[p2p]\nenabled = 1\n", "[p2p] enabled must be true or false"),
    ],
)
def test_bad_files_name_key_and_line(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert needle in str(err.value)
    assert err.value.exit_code == 2


def test_bad_env_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOTSEER_P2P_ENABLED", "maybe")
    with pytest.raises(ConfigError, match="BOOTSEER_P2P_ENABLED"):
        load()


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "missing.toml")


def test_list_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOTSEER_EXEC_SKIP", "image, env")
    monkeypatch.setenv("BOOTSEER_QUIET", "1")
    cfg = load()
    assert cfg.get("exec", "skip") == ["image", "env"]
    assert cfg.get("exec", "quiet") is True


def test_example_is_the_template_and_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    example = root / "bootseer.toml.example"
    template = root / "templates" / "bootseer.toml"
    assert example.read_text() == template.read_text()
    cfg = load(example)
    assert cfg.get("env", "setup") == ["pip install -r requirements.txt"]


# ---- the image stage runs only when asked (issue 16) -------------------------------------------


def _image_enabled(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> bool:
    from bootseer_cli.settings import Settings

    (tmp_path / "bootseer.toml").write_text(text)
    return Settings.from_config(load(tmp_path / "bootseer.toml", environ=environ or {})).image.enabled


def test_image_stage_is_on_only_when_asked(tmp_path: Path) -> None:
    """Keys restating their defaults never turn it on; `enabled`, or `record`/`roots` of the user's own, do."""
    assert not _image_enabled(tmp_path, "")
    assert not _image_enabled(tmp_path, '[image]\nrecord = "auto"\nready = "quiet"\nprefetch_threads = 64\n')
    assert not _image_enabled(tmp_path, '[image]\nready = "call"\nprefetch_mbps = 100.0\nref = "x@sha256:00"\n')
    assert _image_enabled(tmp_path, "[image]\nenabled = true\n")
    assert _image_enabled(tmp_path, '[image]\nrecord = "never"\n')
    assert _image_enabled(tmp_path, '[image]\nroots = ["/opt/venv"]\n')
    assert not _image_enabled(tmp_path, '[image]\nenabled = false\nrecord = "always"\n'), "an explicit no wins"
    assert _image_enabled(tmp_path, "", {"BOOTSEER_IMAGE_ENABLED": "1"})
    assert not _image_enabled(tmp_path, "", {"BOOTSEER_IMAGE": "x@sha256:00"}), "pinning the image is not asking"


def test_init_config_leaves_the_image_stage_off(tmp_path: Path) -> None:
    """`bootseer init`'s config: exec runs the other stages, the image stage shows `–` and is not run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), "BOOTSEER_EXEC_AGENT": "0"})
    bootseer = [sys.executable, "-m", "bootseer_cli"]
    subprocess.run([*bootseer, "init"], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    written = (tmp_path / "bootseer.toml").read_text()
    assert not _image_enabled(tmp_path, written)
    # the setup of the template installs a requirements.txt: a setup that needs nothing instead
    (tmp_path / "venv").mkdir()
    text = written.replace(
        'setup = ["pip install -r requirements.txt"]', f'setup = ["true"]\nroots = ["{tmp_path}/venv"]'
    )
    assert text != written
    (tmp_path / "bootseer.toml").write_text(text)
    env["BOOTSEER_STORE"] = (tmp_path / "store").as_uri()
    r = subprocess.run(
        [*bootseer, "exec", "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "bootseer: image – | env " in r.stderr, r.stderr
    runs = list((tmp_path / "cache").rglob("events.jsonl"))
    stages = {json.loads(line)["stage"] for f in runs for line in f.read_text().splitlines()}
    assert "env" in stages and "image" not in stages, stages


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # Each passed `bootseer config` before and failed later, in a stage (issue 29, item 8).
        (
            '[image]\nready = "soon"\n',
            "bootseer.toml:2: [image] ready must be one of call, quiet or a number of seconds",
        ),
        ('[p2p]\nport = "abc"\n', "bootseer.toml:2: [p2p] port must be text (like 6881-6891)"),
        ("[store]\ncache_max_gb = -5\n", "[store] cache_max_gb must be a number of GB (decimal: 10^9 bytes) >= 0"),
        ("[checkpoint]\nstripes = 0\n", "[checkpoint] stripes must be a whole number >= 1"),
        ('[evn]\nsetup = ["x"]\n', "unknown section [evn] (did you mean [env]?)"),
        ('[env]\nsetpu = ["x"]\n', "unknown key 'setpu' in [env] (did you mean setup?)"),
    ],
)
def test_every_value_is_checked_at_load(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, text))
    assert needle in str(err.value)


def test_an_unknown_bootseer_variable_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load(write(tmp_path, ""), environ={"BOOTSEER_ENV_WAITS": "5", "BOOTSEER_RUN_ID": "r1"})
    err = capsys.readouterr().err
    assert "BOOTSEER_ENV_WAITS is not a bootseer setting, ignored (did you mean BOOTSEER_ENV_WAIT_S?)" in err
    assert "BOOTSEER_RUN_ID" not in err  # a fact for the launcher, not a setting
    assert cfg.get("env", "wait_s") == 600.0


def test_sizes_are_decimal_gb_and_the_old_meaning_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bootseer_cli.settings import Settings
    from bootseer_cli.units import fmt_bytes

    default = Settings.from_config(load(write(tmp_path, "")))
    assert fmt_bytes(default.store.cache_max_bytes) == "50.0 GB"  # was 53.7 GB: GiB counted as GB
    assert fmt_bytes(default.compile.max_bytes) == "10.0 GB"
    assert "cache_max_gb" not in capsys.readouterr().err  # nothing to say about a default
    settings = Settings.from_config(load(write(tmp_path, "[store]\ncache_max_gb = 2\n")))
    assert settings.store.cache_max_bytes == 2 * 10**9
    assert "[store] cache_max_gb now counts decimal GB" in capsys.readouterr().err


def test_bootseer_config_prints_each_unit_beside_its_value(tmp_path: Path) -> None:
    write(tmp_path, "[store]\ncache_max_gb = 2\n")
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "config"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (
        "cache_max_gb = 2.0    # file:" in r.stdout
        and "GB" in r.stdout.split("cache_max_gb = 2.0", 1)[1].split("\n")[0]
    )
    assert "max_gb = 10.0    # default · GB" in r.stdout


def test_ckpt_push_refuses_zero_stripes(tmp_path: Path) -> None:
    """`ckpt push --stripes 0` silently became 4 (issue 29, item 8)."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "w.bin").write_bytes(b"x" * 100)
    store = (tmp_path / "store").as_uri()
    r = subprocess.run(
        [sys.executable, "-m", "bootseer_cli", "ckpt", "push", "ck", "--name", "m", "--stripes", "0", "--store", store],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--stripes 0: a checkpoint needs at least 1 stripe" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "store" / "ckpt").exists()
