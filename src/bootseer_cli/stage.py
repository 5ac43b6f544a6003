"""The stage contract: what `bootseer exec` hands a stage, and what a stage hands back.

A stage lives in its capability's package (`envsnap/stage.py`, …) and depends on this module only,
never on the pipeline that drives it (`launch.py`). Which stages exist, in which order, is the
capability table's business (`capabilities.py`), not this module's: a contract that imports no
capability cannot close an import circle through one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .errors import StoreError
from .events import RunInfo
from .settings import Settings

if TYPE_CHECKING:
    from .keys import Keys
    from .store.cache import BlobCache
    from .store.core import Store


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
    after_agent: list[Callable[[], None]] = field(default_factory=list)  # run once it is started, before exec
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
            from .store.core import open_store_for

            try:
                self._store = open_store_for(self.settings)
            except (StoreError, OSError) as e:  # remembered as it is: the next stage sees the same failure
                self._store_error = e
                raise
            # a store that did not answer one stage is not asked by the next before exec (store.guard)
            self._store.breaker.hold_s = float("inf")
        return self._store

    @property
    def cache(self) -> BlobCache:
        from .store.cache import cache_for

        return cache_for(self.settings.store)

    def warn(self, msg: str) -> None:
        """Warnings are loud even under --quiet: a fallback is something a user must see.

        Any URI in the text loses its credentials (messages often carry an exception's text)."""
        from .redact import warn

        warn(msg)

    def info(self, msg: str) -> None:
        if not self.quiet:
            from .redact import redact_text

            print(f"bootseer: {redact_text(msg)}", file=sys.stderr, flush=True)

    def add_agent_task(self, task: AgentTaskSpec) -> None:
        """Hand `task` to the agent (its class must be a spec of the capability table: checked now)."""
        agent_task_kind(task)
        self.agent_tasks.append(task)
