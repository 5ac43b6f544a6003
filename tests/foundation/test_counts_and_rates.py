"""Issue 46 finding 8: messages said `1 files` and `0 MB/s` (a small checkpoint pulled in a moment)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bootseer_cli.units import count, fmt_rate


def test_count_and_rate_words() -> None:
    assert count(1, "file") == "1 file" and count(0, "file") == "0 files" and count(2, "file") == "2 files"
    assert count(1, "deletion") == "1 deletion" and count(1_234, "file") == "1,234 files"
    assert fmt_rate(300, 1.0) == "300 B/s" and fmt_rate(45_000_000, 2.0) == "22.5 MB/s"
    assert fmt_rate(5000, 0.0) == "–"  # no time measured: no rate, rather than a division


def _bootseer(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer_cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_one_file_is_one_file_in_push_pull_and_exec(tmp_path: Path, isolated_cache: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"x" * 3000)
    pushed = _bootseer(["ckpt", "push", str(ckpt), "--name", "model", "--tag", "t1"], tmp_path)
    assert pushed.returncode == 0 and ": 1 file, " in pushed.stdout, pushed.stdout + pushed.stderr
    pulled = _bootseer(["ckpt", "pull", "model:t1", str(tmp_path / "out")], tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert "0 MB/s" not in pulled.stdout and "B/s)" in pulled.stdout, pulled.stdout

    root = tmp_path / "envroot"
    root.mkdir()
    (tmp_path / "bootseer.toml").write_text(f'[env]\nsetup = ["echo x > {root}/f"]\nroots = ["{root}"]\n')
    first = _bootseer(["exec", "--", "true"], tmp_path)
    assert first.returncode == 0 and "captured 1 file (" in first.stderr, first.stderr
