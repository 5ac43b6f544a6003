"""The cluster pages (docs/clusters/) say what the shipped templates do (issue 17): hooks from the wheel, FUSE in
Kubernetes; docs/trust.md how to set up a trust domain with them (issue 25)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "docs" / "clusters"


def _clusters() -> str:
    return "\n".join(p.read_text() for p in sorted(CLUSTERS.glob("*.md")))


def test_hooks_come_from_the_wheel() -> None:
    doc = _clusters()
    assert "copy `hooks/`" not in doc and "hooks/slurm-prolog.sh" not in doc
    for hook in ("entrypoint.sh", "k8s-init.sh", "slurm-prolog.sh"):
        assert f"--template {hook}" in doc, hook
        assert (ROOT / "src" / "bootseer_cli" / "templates" / "hooks" / hook).exists()


def test_fuse_in_kubernetes_matches_the_template() -> None:
    doc = re.sub(r"\s+", " ", (CLUSTERS / "kubernetes.md").read_text())
    job = (ROOT / "src" / "bootseer_cli" / "templates" / "k8s-job.yaml").read_text()
    assert "privileged: true" not in job.replace("Never privileged: true", "")  # issue 25: no privileged pod
    assert "never sets `privileged`" in doc and "BOOTSEER_CHECKPOINT_MODE=pull" in doc
    assert '{name: BOOTSEER_CHECKPOINT_MODE, value: "pull"}' in job
    assert "device plugin" in doc and "smarter-devices/fuse" in doc and "smarter-devices/fuse" in job
    assert "`/dev/fuse` and `SYS_ADMIN` for checkpoint mounts" not in doc  # the route that does not work
    assert "FUSE unavailable (/dev/fuse is missing)" in doc  # the stage's own words


def test_trust_doc_covers_the_setup() -> None:
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "trust.md").read_text())
    assert "bootseer trust keygen --domain" in doc
    for what in ("verify_keys", "read_from", "BOOTSEER_TRUST_SIGNING_KEY", "pass_store_credentials"):
        assert what in doc, what
    assert "Rotating a key" in doc and "never" in doc.lower()
    assert "deny service" in doc and "as strong as its least trusted job" in doc
    for template in ("github-actions-prewarm.yml", "gitlab-ci-prewarm.yml", "slurm-prolog.sh", "k8s-job.yaml"):
        assert template in doc, template
        assert (ROOT / "templates" / "hooks" / template).exists() or (ROOT / "templates" / template).exists()
    readme = (ROOT / "README.md").read_text()
    assert "[docs/trust.md](docs/trust.md)" in readme
    assert "[docs/trust.md](trust.md)" not in doc and "(../trust.md)" in (CLUSTERS / "kubernetes.md").read_text()
