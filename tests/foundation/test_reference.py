"""The generated references follow the code (issue 47 item 2): docs/reference/configuration.md and cli.md,
and templates/bootseer.toml (what `bootseer init` writes), are what `python -m bootseer_cli.reference`
makes from the settings declarations and the CLI now; a setting changed in the code without them fails here."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from bootseer_cli import reference
from bootseer_cli.settings import section_classes

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_references_are_what_the_code_makes() -> None:
    stale = [
        str(p.relative_to(ROOT))
        for p, text in reference.outputs(ROOT).items()
        if not p.is_file() or p.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{', '.join(stale)} differ from the code: run `{reference.REGENERATE}` and commit them"


def test_every_setting_is_in_the_reference_and_the_template() -> None:
    doc = reference.configuration_md()
    template = reference.template_toml()
    for section, cls in section_classes().items():
        assert f"## `[{section}]`" in doc, section
        for f in dataclasses.fields(cls):
            if "setting" in f.metadata:
                assert f"| `{f.name}` |" in doc and f"BOOTSEER_{section.upper()}_{f.name.upper()}" in doc, f.name
                assert f"\n{f.name} = " in template or f"\n# {f.name} = " in template, (section, f.name)


def test_a_changed_default_is_caught(tmp_path: Path) -> None:
    """A copy of the committed files with one default edited by hand: --check fails and names the command."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    for p in reference.outputs(ROOT):
        (tmp_path / p.relative_to(ROOT)).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    check = [sys.executable, "-m", "bootseer_cli.reference", "--check", "--root", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, text=True, timeout=120).returncode == 0
    conf = tmp_path / "docs" / "reference" / "configuration.md"
    edited = conf.read_text().replace(
        "| `wait_s` | a number of seconds >= 0 | s | `600.0` |", "| `wait_s` | a number of seconds >= 0 | s | `300.0` |"
    )
    assert edited != conf.read_text()
    conf.write_text(edited)
    r = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "docs/reference/configuration.md differs" in r.stderr, r.stderr
    assert reference.REGENERATE in r.stderr
