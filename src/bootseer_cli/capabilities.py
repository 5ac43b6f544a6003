"""The capability table: every capability of bootseer, declared once, in one row.

`launch` (which stages run, in which order, the summary line), the agent (which task kinds it knows),
`gc` (which ref kinds keep their blobs), the report (the stage order and labels), `--skip`, `doctor`,
`prefetch` and `bootseer config` (the settings sections) iterate this table; none of them names a
capability. Adding a capability is its package plus one row here.

Rows hold strings, tuples and dataclasses only, never imports of the capability: a target is "module:name"
and is imported when it is needed, so `bootseer exec` with nothing to do imports no capability (and
neither pyarrow nor libtorrent). Tests add a row by appending to `CAPABILITIES` before the table is read.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, NamedTuple


def resolve(target: str) -> Any:
    """The object a "module:name" (or "module:Class.attr") target names, imported now."""
    module, _, name = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class StageEntry(NamedTuple):
    """A capability's stage in `bootseer exec`.

    `run` takes a `StageContext` and returns a `StageResult`. `wanted` takes the capability's settings
    section and says whether the stage has work (cheap and import-free: it lives on the settings class).
    `order` is the position in the run; the table's order is the display order (summary line, report).
    `local_hits`: its hits read files already on the node (the hot-block replay reads the image's own
    files), so the report counts no bytes saved from the store for them.
    """

    run: str
    wanted: str
    order: int
    local_hits: bool = False


class Advice(NamedTuple):
    """What the report's verdict tells about the capability's stage (empty: the report's generic words).

    - `miss`: when the stage missed its cache;
    - `slow`: when it was slow on every node;
    - `slow_p2p`: when it was slow and peers could take the load off the store (several nodes, a remote
      store, no bytes from peers yet): replaces `slow`;
    - `absent`: added to the launcher's finding when the stage did not run (what enabling it would save).
    """

    miss: str = ""
    slow: str = ""
    slow_p2p: str = ""
    absent: str = ""


NO_ADVICE = Advice()


class AgentTask(NamedTuple):
    """A kind of work the agent does after exec: `handler(task, agent)`, `task` being an instance of
    the frozen dataclass `spec` names (its fields are what the stage hands over)."""

    kind: str
    handler: str
    spec: str


@dataclass(frozen=True, eq=False)  # a row is itself: compared by identity (and cheaper to declare)
class Capability:
    """One row of the table.

    - `name`: the stage name (`--skip NAME`, the summary line, the report's events) and the settings
      section (`[name]` in bootseer.toml) unless `section` says otherwise;
    - `label`: what the report calls the stage;
    - `settings`: "module:Class" of the frozen settings section (fields declare unit, env var, help);
    - `stage`: the stage, if the capability runs one in `exec`;
    - `agent_tasks`: the after-exec work its stage hands to the agent;
    - `gc_keep`: "module:function" `(store, policy, scan) -> None` that adds the digests the
      capability's refs name to the keep set (and what its policy lets go to the doomed list); `gc_phase`
      orders the passes (a pass that follows other refs' blobs, like the torrents, runs later);
      `gc_kinds`: (kind, what `bootseer gc` calls them) for the kinds its pass keeps or dooms;
    - `prefetch`: "module:function" `(settings, store, cache, keys) -> list[Item]`, for `bootseer prefetch`;
    - `doctor`: "module:function" `(settings) -> list[Check]`, for `bootseer doctor` (one that reads the
      launcher, `bootseer doctor -- LAUNCHER …`, takes it as a `command` keyword: the compile check);
    - `advice`: what the report's verdict says about its stage.
    """

    name: str
    label: str
    settings: str
    section: str = ""
    stage: StageEntry | None = None
    agent_tasks: tuple[AgentTask, ...] = ()
    gc_keep: str = ""
    gc_phase: int = 0
    gc_kinds: tuple[tuple[str, str], ...] = ()
    prefetch: str = ""
    doctor: str = ""
    advice: Advice = NO_ADVICE

    @property
    def section_name(self) -> str:
        return self.section or self.name


_S = "bootseer_cli.settings"


def _task(kind: str, module: str, handler: str, spec: str) -> AgentTask:
    return AgentTask(kind, f"bootseer_cli.{module}:{handler}", f"bootseer_cli.{module}:{spec}")


# The table's order is the display order; `StageEntry.order` the run order. The env stage runs first:
# a hot-block record taken on a warm node (or by `prewarm`) includes the files the env snapshot
# restores, so the image stage must look at them after they are restored, or a fresh node would find
# the record mostly stale and re-record instead of replaying.
CAPABILITIES: list[Capability] = [
    Capability(
        "image",
        "image (hot blocks)",
        f"{_S}:ImageSettings",
        stage=StageEntry(
            "bootseer_cli.hotblocks.stage:run_stage", f"{_S}:ImageSettings.wanted", order=1, local_hits=True
        ),
        agent_tasks=(
            _task("hot-record", "hotblocks.agent_tasks", "record_task", "RecordTask"),
            _task("hot-prefetch", "hotblocks.agent_tasks", "prefetch_task", "PrefetchTask"),
            _task("hot-judge", "hotblocks.agent_tasks", "judge_task", "JudgeTask"),
        ),
        gc_keep="bootseer_cli.hotblocks.upkeep:gc_keep",
        gc_kinds=(("hot", "hot-block records"),),
        prefetch="bootseer_cli.hotblocks.upkeep:prefetch",
        doctor="bootseer_cli.hotblocks.upkeep:doctor",
        advice=Advice(
            miss="no hot-block record for this image yet (one is recorded on a first start, ending at the first "
            "optimizer step or at bootseer_cli.ready())",
            slow="the hot-block replay is slow: raise [image] prefetch_threads, or look at the image's lazy loading",
        ),
    ),
    Capability(
        "env",
        "env (snapshot)",
        f"{_S}:EnvSettings",
        stage=StageEntry("bootseer_cli.envsnap.stage:run_stage", f"{_S}:EnvSettings.wanted", order=0),
        agent_tasks=(
            _task("env-publish", "envsnap.agent_tasks", "publish_task", "PublishTask"),
            _task("env-squash", "envsnap.squash", "squash_task", "SquashTask"),
            _task("env-umount", "envmount.stage", "umount_task", "MountTask"),
        ),
        gc_keep="bootseer_cli.envsnap.upkeep:gc_keep",
        gc_kinds=(("env", "env snapshots"),),
        prefetch="bootseer_cli.envsnap.upkeep:prefetch",
        doctor="bootseer_cli.envmount.upkeep:doctor",
        advice=Advice(
            miss="the environment snapshot missed: run `bootseer prewarm` in CI (or `bootseer snapshot` after a "
            "manual setup) so every start restores it",
            slow="the snapshot restore is slow: it is bound by the store's read speed and the node's disk (its "
            "bytes and seconds are in the stage's row)",
            slow_p2p="the snapshot restore is slow: enable [p2p] so nodes fetch it from each other instead of the "
            "store",
        ),
    ),
    Capability(
        "checkpoint",
        "checkpoint",
        f"{_S}:CheckpointSettings",
        stage=StageEntry("bootseer_cli.stripe.stage:run_stage", f"{_S}:CheckpointSettings.wanted", order=2),
        agent_tasks=(
            _task("ckpt-umount", "stripe.agent_tasks", "unmount_task", "UnmountTask"),
            _task("ckpt-writeback", "stripe.agent_tasks", "writeback_task", "WritebackTask"),
        ),
        gc_keep="bootseer_cli.stripe.upkeep:gc_keep",
        gc_kinds=(("ckpt", "checkpoint tags"), ("stripe", "checkpoint stripes on other targets")),
        prefetch="bootseer_cli.stripe.upkeep:prefetch",
        doctor="bootseer_cli.stripe.upkeep:doctor",
        advice=Advice(
            miss="the checkpoint was not in the striped layout or the node cache: push it with `bootseer ckpt push`",
            slow="the checkpoint read is slow: spread it over more stripes/targets ([checkpoint] stripes, targets)",
            slow_p2p="the checkpoint read is slow: spread it over more stripes/targets ([checkpoint] stripes, "
            "targets) or enable [p2p]",
        ),
    ),
    Capability(
        "compile",
        "compile (torch.compile caches)",
        f"{_S}:CompileSettings",
        stage=StageEntry("bootseer_cli.compilecache.stage:run_stage", f"{_S}:CompileSettings.wanted", order=3),
        agent_tasks=(_task("compile-publish", "compilecache.tasks", "publish_task", "PublishTask"),),
        gc_keep="bootseer_cli.compilecache.upkeep:gc_keep",
        gc_kinds=(("compile", "compile-cache keys"),),
        doctor="bootseer_cli.compilecache.upkeep:doctor",
        advice=Advice(absent="if it uses torch.compile, [compile] enabled = true restores its caches"),
    ),
    Capability(
        "p2p",
        "p2p (swarm)",
        f"{_S}:P2PSettings",
        agent_tasks=(_task("seed", "p2p.seed", "run_seed", "SeedTask"),),
        gc_keep="bootseer_cli.p2p.upkeep:gc_keep",
        gc_kinds=(("torrent", "torrent refs"),),
        gc_phase=1,  # a torrent ref follows its blob: kept while another ref keeps the blob
        doctor="bootseer_cli.p2p.upkeep:doctor",
    ),
]


def stages() -> list[Capability]:
    """The capabilities that run a stage, in display order."""
    return [c for c in CAPABILITIES if c.stage is not None]


def stage_names() -> tuple[str, ...]:
    return tuple(c.name for c in stages())


def run_order() -> list[Capability]:
    return sorted(stages(), key=lambda c: c.stage.order if c.stage else 0)


def agent_tasks() -> dict[str, AgentTask]:
    """Task kind -> its declaration, over every capability."""
    return {t.kind: t for c in CAPABILITIES for t in c.agent_tasks}


def gc_kinds() -> dict[str, str]:
    """What `bootseer gc` calls each kind the capabilities' passes keep or doom."""
    return {kind: words for c in CAPABILITIES for kind, words in c.gc_kinds}


def labels() -> dict[str, str]:
    return {c.name: c.label for c in CAPABILITIES}


def advice(name: str) -> Advice:
    """The report's advice for the stage `name` (none for a stage the table does not know)."""
    return next((c.advice for c in CAPABILITIES if c.name == name), NO_ADVICE)
