"""Config discovery as git's safe.directory (issue 45, item 2): a `bootseer.toml` is code, so the walk up
from the working directory obeys one only where the caller (for root: root) owns the directory and the
file and no one else can write the file. A plain user's file in a world-writable parent once made root's
`bootseer exec`, started in a subdirectory, run that user's `[env] setup` as root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootseer_cli.config import find_config_file
from bootseer_cli.errors import ConfigError

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants a file owned by another user (needs root)")


def run_exec(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BOOTSEER_CONFIG"}
    argv = [sys.executable, "-m", "bootseer_cli", "exec", *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _planted(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A world-writable parent (as /tmp or /scratch) holding a plain user's bootseer.toml whose setup
    would leave a marker, and root's working directory one level below it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    marker = tmp_path / "ran-as-root"
    (tmp_path / "tree").mkdir()
    toml = shared / "bootseer.toml"
    toml.write_text(f'[exec]\nagent = false\n[env]\nroots = ["{tmp_path / "tree"}"]\nsetup = ["touch {marker}"]\n')
    os.chown(toml, NOBODY, NOBODY)
    work = shared / "sub"
    work.mkdir()
    return toml, work, marker


def test_roots_exec_ignores_a_plain_users_config_above_it(tmp_path: Path) -> None:
    toml, work, marker = _planted(tmp_path)
    r = run_exec(work, "--", "true")
    assert not marker.exists(), "root ran a plain user's setup"
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = [x for x in r.stderr.splitlines() if str(toml) in x]
    assert line and "--config" in line[0] and "uid 65534" in line[0], r.stderr
    # The fix the message names works: a config passed explicitly is the caller's choice.
    r = run_exec(work, "--config", str(toml), "--", "true")
    assert r.returncode == 0 and marker.exists(), r.stderr


def test_a_file_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / "deep").mkdir(parents=True)
    toml = project / "bootseer.toml"
    toml.write_text("[exec]\nagent = false\n")
    monkeypatch.chdir(project / "deep")
    assert find_config_file() == toml  # premise: root's own file, in root's own directory
    for mode in (0o664, 0o646):
        toml.chmod(mode)
        with pytest.raises(ConfigError, match=r"bootseer\.toml.*writable by (group|others).*--config"):
            find_config_file()
    toml.chmod(0o644)
    link = project / "deep" / "bootseer.toml"
    link.symlink_to(toml)
    os.lchown(link, NOBODY, NOBODY)  # a link another user made, to a file root would trust
    with pytest.raises(ConfigError, match=r"link.*uid 65534.*--config"):
        find_config_file()


def test_the_walk_stops_at_a_directory_root_does_not_own(tmp_path: Path) -> None:
    """Above a directory another user owns nothing is read (their file there is named, and ignored)."""
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    os.chown(home, NOBODY, NOBODY)
    (home / "bootseer.toml").write_text('[store]\nuri = "file:///somewhere/else"\n')  # root's, but not its dir
    r = run_exec(home / "proj", "-v", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "bootseer: no config file" in r.stderr and f"ignored {home / 'bootseer.toml'}" in r.stderr, r.stderr


def test_the_entrypoint_hook_names_its_config(tmp_path: Path) -> None:
    """The container entrypoint never walks up: the workdir's bootseer.toml, or none at all."""
    hook = Path(__file__).resolve().parents[2] / "templates" / "hooks" / "entrypoint.sh"
    _, work, marker = _planted(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "BOOTSEER_CONFIG"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    show = [sys.executable, "-c", "import os; print(os.environ['BOOTSEER_CONFIG'])"]
    r = subprocess.run(["sh", str(hook), *show], capture_output=True, text=True, cwd=work, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == os.devnull and not marker.exists(), r.stderr
    (work / "bootseer.toml").write_text("[exec]\nagent = false\n")
    r = subprocess.run(["sh", str(hook), *show], capture_output=True, text=True, cwd=work, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(work / "bootseer.toml"), r.stderr
