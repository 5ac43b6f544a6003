from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.verbs.exec import ExecOptions, ExecUsageError, parse_exec

BOOTSEER = [sys.executable, "-m", "bootseer_cli"]


def run(args: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOOTSEER, *args], capture_output=True, text=True, timeout=120, cwd=cwd, **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "torchrun", "x.py"], (ExecOptions(), ["torchrun", "x.py"])),
        (["-q", "--config", "a.toml", "--", "ls", "-l"], (ExecOptions(quiet=True, config="a.toml"), ["ls", "-l"])),
        (
            ["--config=a.toml", "--store=s3://b/p", "--skip", "image,env", "ls"],
            (ExecOptions(config="a.toml", store="s3://b/p", skip=("image", "env")), ["ls"]),
        ),
        (["-c", "x.toml", "python", "-c", "pass"], (ExecOptions(config="x.toml"), ["python", "-c", "pass"])),
        (["-qv", "-cx.toml", "ls"], (ExecOptions(config="x.toml", quiet=True, verbose=True), ["ls"])),
        (["-qc", "x.toml", "--", "-weird"], (ExecOptions(config="x.toml", quiet=True), ["-weird"])),
        (["x", "--", "y"], (ExecOptions(), ["x", "--", "y"])),
        (["--help"], None),
        (["-qh"], None),
        (["--config"], None),
    ],
)
def test_fast_exec_parser(args: list[str], expected: object) -> None:
    assert parse_exec(args) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sotre", "x", "--", "true"], "no such option --sotre (did you mean --store?)"),
        (["--bogus", "--", "ls"], "no such option --bogus;"),
        (["--skip=env", "--confg=a.toml", "ls"], "no such option --confg (did you mean --config?)"),
        (["-qx", "ls"], "no such option -qx"),
        (["--quiet=1", "ls"], "option --quiet takes no value"),
        (["--store", "--", "ls"], "option --store needs a store URI"),
        (["--store=", "ls"], "option --store needs a store URI"),
        (["--store", "cache", "ls"], "option --store 'cache' is a relative path"),
    ],
)
def test_fast_exec_parser_refuses_unknown_options(args: list[str], message: str) -> None:
    with pytest.raises(ExecUsageError) as e:
        parse_exec(args)
    assert message in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("fast", [True, False])
def test_unknown_exec_option_is_a_usage_error_before_any_stage(tmp_path: Path, fast: bool) -> None:
    """`exec --sotre x -- true` used to run every stage, then exec `--sotre` (127). Now: exit 2 and one
    line naming the option and the one meant, and no stage ran (the env setup would create the marker).
    The typer command (what `--help` reaches, and callers of the app) refuses it as well."""
    marker = tmp_path / "marker"
    (tmp_path / "bootseer.toml").write_text(f'[env]\nsetup = ["touch {marker}"]\n')
    if fast:
        r = run(["exec", "--sotre", "x", "--", "true"], tmp_path, env={**_env(), "XDG_CACHE_HOME": str(tmp_path)})
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "--sotre" in line and "did you mean --store?" in line, line
    else:
        code = (
            "import sys; from bootseer_cli.cli import main; "
            "sys.argv = ['bootseer', 'exec', '--sotre', 'x', '--', 'true']; main()"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**_env(), "XDG_CACHE_HOME": str(tmp_path)},
        )
        assert r.returncode == 2, r.stderr
        assert "--sotre" in r.stderr and "--store" in r.stderr, r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("args", [["exec", "--store", "--", "true"], ["exec", "--store", "rel", "--", "true"]])
def test_exec_store_flag_without_a_store_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    """Issue 46: `exec --store -- CMD` took `--` as the store and ran every stage against a directory named
    `--` (and a relative path was a store that moves with the working directory). Now: exit 2, one line,
    no stage ran, no such directory made."""
    marker = tmp_path / "marker"
    (tmp_path / "bootseer.toml").write_text(f'[env]\nsetup = ["touch {marker}"]\n')
    r = run(args, tmp_path, env={**_env(), "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "--store" in line, line
    assert not marker.exists() and not (tmp_path / "--").exists() and not (tmp_path / "rel").exists()


def test_a_verb_refuses_a_relative_store(tmp_path: Path) -> None:
    r = run(["env", "ls", "--store", "rel"], tmp_path, env={**_env(), "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 2 and "relative path" in r.stderr, r.stderr
    assert not (tmp_path / "rel").exists()


def test_exec_skip_help_lists_the_stages_of_the_table(tmp_path: Path) -> None:
    from bootseer_cli.capabilities import stage_names

    r = run(["exec", "--help"], tmp_path)
    assert r.returncode == 0
    assert ",".join(stage_names()) in " ".join(r.stdout.split()).replace(", ", ",")


def test_help_lists_every_verb(tmp_path: Path) -> None:
    r = run(["--help"], tmp_path)
    assert r.returncode == 0
    for verb in ("exec", "init", "config", "keys", "doctor"):
        assert f"  {verb} " in r.stdout
    assert run(["--version"], tmp_path).stdout.startswith("bootseer ")
    r = run(["exec", "--help"], tmp_path)
    assert r.returncode == 0 and "--skip" in r.stdout


def test_init_writes_the_template(tmp_path: Path) -> None:
    r = run(["init"], tmp_path)
    assert r.returncode == 0, r.stderr
    root = Path(__file__).resolve().parents[2]
    assert (tmp_path / "bootseer.toml").read_text() == (root / "templates" / "bootseer.toml").read_text()
    r = run(["init"], tmp_path)
    assert r.returncode == 2 and "exists" in r.stderr
    assert run(["init", "--force"], tmp_path).returncode == 0
    r = run(["init", "--template", "nope"], tmp_path)
    assert r.returncode == 2 and "no template 'nope'" in r.stderr


def test_config_shows_sources(tmp_path: Path) -> None:
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["true"]\n')
    r = run(["config", "--json"], tmp_path, env={**_env(), "BOOTSEER_ENV_WAIT_S": "3"})
    doc = json.loads(r.stdout)
    assert doc["settings"]["env"]["setup"] == {"value": ["true"], "source": f"file:{tmp_path}/bootseer.toml:2"}
    assert doc["settings"]["env"]["wait_s"] == {"value": 3.0, "source": "env:BOOTSEER_ENV_WAIT_S"}
    assert doc["settings"]["store"]["uri"]["source"] == "default"
    text = run(["config", "--store", "file:///x"], tmp_path).stdout
    assert 'uri = "file:///x"    # flag' in text


def test_keys_json(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("six\n")
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["pip install -r requirements.txt"]\n')
    doc = json.loads(run(["keys", "--json"], tmp_path).stdout)
    assert doc["env"]["doc"]["image"] == doc["image"]["digest"]
    assert len(doc["env"]["digest"]) == 64
    (tmp_path / "requirements.txt").write_text("six==1.17\n")
    assert json.loads(run(["keys", "--json"], tmp_path).stdout)["env"]["digest"] != doc["env"]["digest"]


def test_doctor(tmp_path: Path) -> None:
    r = run(["doctor", "--json", "--store", (tmp_path / "s").as_uri()], tmp_path)
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    machine = {"store", "leases", "trust", "fuse", "cache", "docker", "p2p", "hostname"}
    assert set(checks) == machine | {"image root", "env mode"}
    assert checks["store"]["status"] == "ok" and checks["leases"]["status"] == "ok"
    r = run(["doctor", "--store", "nope://x"], tmp_path)
    assert r.returncode == 1
    assert "fail  store" in r.stdout and "unknown scheme" in r.stdout and "fix:" in r.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
