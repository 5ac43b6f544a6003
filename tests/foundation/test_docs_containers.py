"""docs/containers.md says what the shipped templates do (issue 17): hooks from the wheel, FUSE in Kubernetes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hooks_come_from_the_wheel() -> None:
    doc = (ROOT / "docs" / "containers.md").read_text()
    assert "copy `hooks/`" not in doc and "hooks/slurm-prolog.sh" not in doc
    for hook in ("entrypoint.sh", "k8s-init.sh", "slurm-prolog.sh"):
        assert f"--template {hook}" in doc, hook
        assert (ROOT / "src" / "bootseer_cli" / "templates" / "hooks" / hook).exists()


def test_fuse_in_kubernetes_matches_the_template() -> None:
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "containers.md").read_text())
    job = (ROOT / "src" / "bootseer_cli" / "templates" / "k8s-job.yaml").read_text()
    assert "privileged: true" in job and "privileged: true" in doc
    assert "device plugin" in doc and "smarter-devices/fuse" in doc and "smarter-devices/fuse" in job
    assert "`/dev/fuse` and `SYS_ADMIN` for checkpoint mounts" not in doc  # the route that does not work
    assert "FUSE unavailable (/dev/fuse is missing)" in doc  # the stage's own words
