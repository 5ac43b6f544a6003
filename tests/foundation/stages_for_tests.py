"""Stage functions used by the launch tests to drive the stage framework itself."""

from __future__ import annotations

from bootseer_cli.errors import StageFatal
from bootseer_cli.stage import StageContext, StageResult


def ok(ctx: StageContext) -> StageResult:
    ctx.exports["BOOTSEER_TEST_EXPORT"] = "yes"
    return StageResult(outcome="hit", summary="restored", cache="hit", bytes=123, bytes_from_store=100)


def boom(ctx: StageContext) -> StageResult:
    raise RuntimeError("disk on fire")


def unreachable_store(ctx: StageContext) -> StageResult:
    ctx.store.check_writable()  # raises StoreError for a dead store
    return StageResult(outcome="hit")


def fatal(ctx: StageContext) -> StageResult:
    raise StageFatal("setup failed with exit status 4", 4)


CALLS: list[str] = []


def note_env(ctx: StageContext) -> StageResult:
    CALLS.append("env")
    return StageResult(outcome="hit")


def note_image(ctx: StageContext) -> StageResult:
    CALLS.append("image")
    return StageResult(outcome="hit")
