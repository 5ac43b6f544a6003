"""The stage contract: what `bootseer exec` hands a stage, what a stage hands back, and the table of stages.

A stage lives in its capability's package (`envsnap/stage.py`, …) and depends on this module only,
never on the pipeline that drives it (`launch.py`). Adding a stage is one `Stage` entry in `STAGES`
plus its package: the summary line, `--skip`, the run order and the report follow from the table.
Stages are named here by "module:function" and imported only when wanted, so `bootseer exec` with
nothing to do imports neither pyarrow nor libtorrent.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .errors import StoreError
from .events import RunInfo
from .settings import Settings

if TYPE_CHECKING:
    from .cache import BlobCache
    from .keys import Keys
    from .store import Store


class AgentTaskSpec(Protocol):
    """An agent task: an instance of the frozen dataclass that its kind's row of the capability table
    names (`capabilities.AgentTask.spec`). Its fields are plain JSON values (str, int, float, bool,
    lists and dicts of them): `agent_task_doc` writes them into agent.json, the agent reads them back."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


def agent_task_kind(task: AgentTaskSpec) -> str:
    """The kind the capability table declares for `task`'s class; a class no row names is a bug."""
    from .capabilities import agent_tasks

    target = f"{type(task).__module__}:{type(task).__qualname__}"
    for kind, decl in agent_tasks().items():
        if decl.spec == target:
            return kind
    raise TypeError(f"{target} is not the spec of any agent task in capabilities.py")


def agent_task_doc(task: AgentTaskSpec) -> dict[str, Any]:
    """What agent.json holds of a task: its kind, then its fields."""
    import dataclasses

    return {"kind": agent_task_kind(task), **dataclasses.asdict(task)}


@dataclass
class StageResult:
    """What a stage did. `summary` is the few words shown in the summary line."""

    outcome: str
    summary: str = ""
    cache: str = ""
    bytes: int = 0
    bytes_from_store: int = 0
    bytes_from_peers: int = 0
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    """What stages share: the settings, this run, lazily the keys and the store, and what to hand on."""

    settings: Settings
    run: RunInfo
    command: list[str]
    quiet: bool = False
    exports: dict[str, str] = field(default_factory=dict)  # environment added for the launcher
    agent_tasks: list[AgentTaskSpec] = field(default_factory=list)  # for the agent, in agent.json
    before_agent: list[Callable[[], None]] = field(default_factory=list)  # run just before the agent starts
    agent_fds: list[int] = field(default_factory=list)  # fds the agent inherits (the image stage's fanotify group)
    _keys: Keys | None = None
    _store: Store | None = None
    _store_error: Exception | None = None

    @property
    def keys(self) -> Keys:
        """Both cache keys, gathered once per run (asking the engine or hashing files is not free)."""
        if self._keys is None:
            from .identity import keys_for

            self._keys = keys_for(self.settings)
        return self._keys

    @property
    def store(self) -> Store:
        """The store; raises the error it failed with (remembered) when it cannot be opened."""
        if self._store_error is not None:
            raise self._store_error
        if self._store is None:
            from .store import open_store

            try:
                self._store = open_store(self.settings.store.uri)
            except (StoreError, OSError) as e:  # remembered as it is: the next stage sees the same failure
                self._store_error = e
                raise
        return self._store

    @property
    def cache(self) -> BlobCache:
        from .cache import cache_for

        return cache_for(self.settings.store)

    def warn(self, msg: str) -> None:
        """Warnings are loud even under --quiet: a fallback is something a user must see.

        Any URI in the text loses its credentials (messages often carry an exception's text)."""
        from .redact import redact_text

        print(f"bootseer: warning: {redact_text(msg)}", file=sys.stderr, flush=True)

    def info(self, msg: str) -> None:
        if not self.quiet:
            from .redact import redact_text

            print(f"bootseer: {redact_text(msg)}", file=sys.stderr, flush=True)

    def add_agent_task(self, task: AgentTaskSpec) -> None:
        """Hand `task` to the agent (its class must be a spec of the capability table: checked now)."""
        agent_task_kind(task)
        self.agent_tasks.append(task)


@dataclass(frozen=True)
class Stage:
    """One stage of `exec`: where it shows (`display`), when it runs (`order`), whether it has work."""

    name: str
    display: int  # position in the summary line and the report
    order: int  # position in the run
    wanted: Callable[[Settings], bool]  # cheap and import-free
    target: str  # "module:function" taking a StageContext, returning a StageResult

    def run(self, ctx: StageContext) -> StageResult:
        module, func = self.target.split(":")
        return getattr(importlib.import_module(module), func)(ctx)


# The env stage runs first: a hot-block record taken on a warm node (or by `prewarm`) includes the
# files the env snapshot restores, so the image stage must look at them after they are restored, or
# a fresh node would find the record mostly stale and re-record instead of replaying.
STAGES: tuple[Stage, ...] = (
    Stage("image", 0, 1, lambda s: s.image.enabled, "bootseer_cli.hotblocks.stage:run_stage"),
    Stage("env", 1, 0, lambda s: bool(s.env.setup), "bootseer_cli.envsnap.stage:run_stage"),
    Stage("checkpoint", 2, 2, lambda s: bool(s.checkpoint.name), "bootseer_cli.stripe.stage:run_stage"),
    Stage("compile", 3, 3, lambda s: s.compile.enabled, "bootseer_cli.compilecache.stage:run_stage"),
)

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in sorted(STAGES, key=lambda s: s.display))


def run_order() -> list[Stage]:
    return sorted(STAGES, key=lambda s: s.order)
