"""The docs say what the code does (issue 47): the facts a newcomer found contradicting each other are each
stated once, and checked here against the code or the templates they describe; the README stays a front
page, and the site's pages link to each other rather than copying the README."""

from __future__ import annotations

import re
from pathlib import Path

from bootseer_cli.settings import CheckpointSettings, TrustSettings
from bootseer_cli.settingspec import settings_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _pages() -> dict[str, str]:
    """README and every page of the docs, by path, whitespace folded (a phrase may wrap)."""
    paths = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return {str(p.relative_to(ROOT)): re.sub(r"\s+", " ", p.read_text()) for p in paths}


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"
    assert not [p for p, text in _pages().items() if "README section" in text], "a page copies the README"


def test_kubernetes_is_documented_as_the_template_is() -> None:
    job = (ROOT / "templates" / "k8s-job.yaml").read_text()
    assert "STORE_SECRET|" not in job and "{{STORE_READ_SECRET|" in job and "runAsUser: {{UID|1000}}" in job
    for page, text in _pages().items():
        assert "--set STORE_SECRET" not in text, page
        assert "privileged: true" not in text, page
    k8s = _pages()["docs/clusters/kubernetes.md"]
    assert "--set STORE_READ_SECRET" in k8s and "default 1000:1000" in k8s and "env roots" in k8s


def test_the_signing_key_never_goes_to_the_slurm_prolog() -> None:
    help_ = settings_of(TrustSettings)["signing_key"].help
    assert "never" in help_ and "Slurm prolog" in help_
    prolog = (ROOT / "templates" / "hooks" / "slurm-prolog.sh").read_text()
    mentions = [line for line in prolog.splitlines() if "SIGNING_KEY" in line]
    assert mentions and all("continue" in line for line in mentions), mentions  # the prolog only drops it
    for page, text in _pages().items():
        assert not re.search(r"signing key[^.]*(in|on|to) the (Slurm )?prolog", text, re.I), page


def test_the_default_mount_point_is_per_run() -> None:
    """The help and the checkpoints page say what the stage does (stripe/stage.py `_mountpoint`; the
    per-run directory itself is tested in tests/security/test_mountpoint.py)."""
    help_ = settings_of(CheckpointSettings)["mountpoint"].help
    assert "<runtime>/ckpt-<run id>" in help_
    assert "<runtime>/ckpt-<run id>" in _pages()["docs/checkpoints.md"]


def test_how_the_config_is_found_is_said_once() -> None:
    """The walk's rule lives in docs/configuring.md; the security page links to it instead of restating it."""
    pages = _pages()
    assert "safe.directory" in pages["docs/configuring.md"] and "BOOTSEER_CONFIG" in pages["docs/configuring.md"]
    assert [p for p, text in pages.items() if "safe.directory" in text and not p.startswith("docs/notes/")] == [
        "docs/configuring.md"
    ]
