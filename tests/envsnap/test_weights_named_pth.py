"""A package that ships model weights named `*.pth` (torchmetrics' `lpips_models/alex.pth`, a torch.save zip)
is not an editable install: the capture refused every env holding lightning's torchmetrics (issue 44 item 5
found it: the real Lightning job's env was never snapshotted, so every fresh node ran the setup)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from bootseer_cli.envsnap import manifest
from bootseer_cli.envsnap.capture import editable_outside


def _weights() -> bytes:
    """What torch.save writes: a zip archive (binary, NUL bytes), whose bytes may begin with '/'."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." + bytes(range(256)))
    return b"/" + buf.getvalue()


def test_binary_pth_weights_are_not_path_files(tmp_path: Path) -> None:
    root = tmp_path / "venv"
    pkg = root / "lib" / "python3.11" / "site-packages" / "torchmetrics" / "functional" / "image" / "lpips_models"
    pkg.mkdir(parents=True)
    before = manifest.scan([str(root)])
    (pkg / "alex.pth").write_bytes(_weights())
    (root / "lib" / "python3.11" / "site-packages" / "outside.pth").write_text("/somewhere/else/entirely\n")
    after = manifest.scan([str(root)])
    changed = sorted(manifest.diff(before, after).changed)
    problems = editable_outside(after, changed, [str(root)])
    assert len(problems) == 1 and "outside.pth adds /somewhere/else/entirely" in problems[0], problems
