"""A toy fifth capability: its package is this module, and `ROW` is its one row of the capability table.

`register()` appends the row; nothing else in bootseer is told about it. The test beside this package
(`test_toy_capability.py`) shows that the row alone puts the toy into exec's summary line, `--skip`,
`bootseer config`, the report's stage table and picture, and gc's keep set and words.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer_cli.capabilities import CAPABILITIES, Capability, StageEntry
from bootseer_cli.settingspec import flag, text
from bootseer_cli.stage import StageContext, StageResult
from bootseer_cli.upkeep import Policy, Scan, aged_refs

if TYPE_CHECKING:
    from bootseer_cli.store.core import Store

HERE = __name__


@dataclass(frozen=True)
class ToySettings:
    enabled: bool = flag(False, "Run the toy stage.")
    greeting: str = text("hello", "What the toy stage says in the summary line.")

    def wanted(self) -> bool:
        return self.enabled


def run_stage(ctx: StageContext) -> StageResult:
    toy = ctx.settings.section("toy")
    assert isinstance(toy, ToySettings)
    return StageResult(outcome="hit", summary=f"toy says {toy.greeting}", cache="hit", bytes=42)


def gc_keep(store: Store, policy: Policy, scan: Scan) -> None:
    """The toy's refs (`refs/toy/<key>.json`) name blobs gc must keep, as env and hot refs do."""
    aged_refs(store, "toy", policy, scan)


ROW = Capability(
    "toy",
    "toy (the fifth capability)",
    f"{HERE}:ToySettings",
    stage=StageEntry(f"{HERE}:run_stage", f"{HERE}:ToySettings.wanted", order=4),
    gc_keep=f"{HERE}:gc_keep",
    gc_kinds=(("toy", "toy greetings"),),
)


def register() -> None:
    if ROW not in CAPABILITIES:
        CAPABILITIES.append(ROW)


def main() -> None:
    """`python -m tests.foundation.toycap ARGS…` is `bootseer ARGS…` with the toy registered."""
    register()
    from bootseer_cli.entry import main as bootseer_main

    sys.argv = ["bootseer", *sys.argv[1:]]
    bootseer_main()
