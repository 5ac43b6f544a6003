"""The conventions users of uv, ruff, pip and typer-based tools expect: a config found from a subdirectory,
`exec -v` naming it, `config` output that is TOML, shell completion, and help without Python types."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from bootseer_cli.config import find_config_file, load
from bootseer_cli.paths import default_store_uri
from bootseer_cli.verbs.exec import ExecOptions, parse_exec

BOOTSEER = [sys.executable, "-m", "bootseer_cli"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOOTSEER, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """A project with its bootseer.toml at the top and a working directory two levels down."""
    project = tmp_path / "project"
    deep = project / "runs" / "exp1"
    deep.mkdir(parents=True)
    (project / "bootseer.toml").write_text('[env]\nsetup = ["true"]\n[exec]\nquiet = true\n')
    return project, deep


def test_config_is_found_walking_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, deep = _project(tmp_path)
    monkeypatch.chdir(deep)
    assert find_config_file() == project / "bootseer.toml"
    cfg = load()
    assert cfg.get("env", "setup") == ["true"] and cfg.base_dir == project  # relative paths: the file's folder
    # $BOOTSEER_CONFIG and --config still win over the walk.
    other = tmp_path / "other.toml"
    other.write_text('[env]\nsetup = ["false"]\n')
    monkeypatch.setenv("BOOTSEER_CONFIG", str(other))
    assert find_config_file() == other
    assert find_config_file(project / "bootseer.toml") == project / "bootseer.toml"


def test_the_walk_stops_at_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lonely = tmp_path / "a" / "b"
    lonely.mkdir(parents=True)
    monkeypatch.chdir(lonely)
    assert not any((p / "bootseer.toml").is_file() for p in lonely.parents)  # premise: none above either
    assert find_config_file() is None


def test_exec_verbose_names_the_config(tmp_path: Path) -> None:
    assert parse_exec(["-v", "--", "true"]) == (ExecOptions(verbose=True), ["true"])
    assert parse_exec(["--verbose", "true"]) == (ExecOptions(verbose=True), ["true"])
    project, deep = _project(tmp_path)
    r = run(["exec", "-v", "--skip", "env", "--", "sh", "-c", "exit 3"], deep)
    assert r.returncode == 3, r.stderr
    assert f"bootseer: config {project / 'bootseer.toml'}; the local store {default_store_uri()}" in r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run(["exec", "--verbose", "--", "true"], elsewhere)
    assert r.returncode == 0 and "bootseer: no config file" in r.stderr
    assert "bootseer:" not in run(["exec", "--", "true"], deep).stderr  # quiet unless asked


def test_config_prints_toml_with_the_effective_store(tmp_path: Path) -> None:
    _, deep = _project(tmp_path)
    r = run(["config"], deep)
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(r.stdout)  # `uri = null` used to make this fail
    assert doc["env"]["setup"] == ["true"] and doc["exec"]["quiet"] is True
    assert "uri" not in doc["store"] and f"# uri = (unset: the local store {default_store_uri()})" in r.stdout
    r = run(["config", "--store", 's3://b/p?x="1"'], deep)
    assert tomllib.loads(r.stdout)["store"]["uri"] == 's3://b/p?x="1"'


def test_completion_and_human_metavars(tmp_path: Path) -> None:
    top = run(["--help"], tmp_path).stdout
    assert "--install-completion" in top and "--show-completion" in top
    init_help = run(["init", "--help"], tmp_path).stdout
    assert "--set KEY=VALUE" in init_help and "--template NAME" in init_help
    exec_help = run(["exec", "--help"], tmp_path).stdout
    # typer renders the variadic argument as COMMAND, [COMMAND] or [COMMAND]... depending on its version.
    assert "COMMAND" in exec_help.splitlines()[0] and "--config FILE" in exec_help and "--verbose" in exec_help
    for text in (init_help, exec_help):
        assert "list[str]" not in text and "<str>" not in text


def test_no_verb_shows_python_types_in_its_help() -> None:
    """Every verb's help reads like a Unix tool's (`--name NAME`, `DEST`), never typer's `<str>`/`<path>`."""
    import re

    from bootseer_cli.cli import human_metavars, register_commands

    typer_main = pytest.importorskip("typer.main")
    top = typer_main.get_command(register_commands())
    human_metavars(top)

    def verbs(cmd: object, path: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", {})
        return [path] if not subs else [p for n, c in subs.items() for p in verbs(c, [*path, n])]

    typed = re.compile(r"<(str|int|float|path|list\[[a-z]+\]|[a-z]+ range|file)>")
    leaks = {}
    paths = verbs(top, [])
    for path, text in zip(paths, _helps(paths), strict=True):
        assert text.strip(), f"bootseer {' '.join(path)} --help printed nothing"
        found = typed.findall(text)
        if found:
            leaks[" ".join(path)] = found
    assert not leaks, leaks


HELP_SEP = "\n--- bootseer help ends ---\n"


def _helps(paths: list[list[str]]) -> list[str]:
    """`bootseer VERB… --help` for each path, as the entry point prints it to a pipe: one process runs
    the entry point once per path (sys.argv set as the shell would), instead of one interpreter per verb."""
    code = (
        "import json, sys\n"
        "from bootseer_cli.entry import main\n"
        "for path in json.loads(sys.argv.pop(1)):\n"
        "    sys.argv = ['bootseer', *path, '--help']\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"    sys.stdout.write({HELP_SEP!r})\n"
        "    sys.stdout.flush()\n"
    )
    r = subprocess.run([sys.executable, "-c", code, json.dumps(paths)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split(HELP_SEP)
    assert len(out) == len(paths) + 1 and out[-1] == "", r.stdout[-2000:]
    return out[:-1]


def test_readme_second_command_sets_up_a_fresh_machine() -> None:
    """The README's two commands: the second must install and start what the suite needs (issue 17, item 6)."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0].strip() for b in section.split("```sh\n")[1:]]
    assert len(blocks) == 2 and blocks[1] == "bash .ci/run"
    ci = (root / ".ci" / "run").read_text()
    for need in ("docker.io", "docker-registry", "fuse3", "dockerd", "pip install -q --upgrade nox"):
        assert need in ci
    assert ci.rstrip().endswith("nox")  # and then runs the everyday command
    subprocess.run(["bash", "-n", str(root / ".ci" / "run")], check=True)
