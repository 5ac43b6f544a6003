"""Python API for training code that saves checkpoints: store one in the striped layout.

    import bootseer_cli.ckpt
    torch.save(state, "/tmp/ckpt/model.pt")
    tag = bootseer_cli.ckpt.push("/tmp/ckpt", "my-model")          # tag defaults to a timestamp
    # a restarted job then mounts my-model:latest ([checkpoint] name = "my-model")

The store and targets come from bootseer.toml / BOOTSEER_* as for the CLI, unless given here.
Under `bootseer exec` with a `[checkpoint]`, a job need not push at all: what it saves into
`$BOOTSEER_CKPT_DIR` is pushed as a new tag by the agent after it ends (stripe/writeback.py), with
the agent's credentials, which the job never holds.
`push_checkpoint` and `phase_bars` are what `bootseer ckpt push` shares with this API, so the
command and the library push the same way and show the same bars.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError, StoreError

if TYPE_CHECKING:
    from .settings import CheckpointSettings
    from .store.core import Store
    from .stripe.layout import Manifest

PhaseProgress = Callable[[str, int], Callable[[int], None]]


@contextmanager
def phase_bars(label: str, enabled: bool | None = None) -> Iterator[PhaseProgress]:
    """A `progress(phase, total)` for `stripe.push.push`: one byte bar per phase, `"<phase> <label>"`.

    The push reports its phases one after the other ("hash", then "upload"), so the previous bar is
    closed when the next phase starts, and the last one when the block ends (also on an error).
    `enabled` is `progress.byte_bar`'s: None shows bars only on a terminal, False never.
    """
    from .progress import byte_bar

    with ExitStack() as bar:

        def start(phase: str, total: int) -> Callable[[int], None]:
            bar.close()
            return bar.enter_context(byte_bar(total, f"{phase} {label}", enabled=enabled))

        yield start


def push_checkpoint(
    store: Store,
    settings: CheckpointSettings,
    directory: Path,
    name: str,
    tag: str | None = None,
    *,
    stripes: int | None = None,
    cell_size: int | None = None,
    targets: list[str] | None = None,
    bars: bool | None = None,
) -> Manifest:
    """Push `directory` as NAME:TAG; arguments left out come from `settings` ([checkpoint]).

    `targets=None` means the configured targets (none configured: the store itself). `bars` is
    `phase_bars`' `enabled`.
    """
    from .store.core import Store
    from .stripe.push import push as _push

    uris = targets if targets is not None else list(settings.targets)
    k = settings.stripes if stripes is None else stripes  # 0 is a value given, not "unset"
    cells = settings.cell_size if cell_size is None else cell_size
    if k < 1:
        raise ConfigError(f"--stripes {k}: a checkpoint needs at least 1 stripe")
    if cells < 1:
        raise ConfigError(f"--cell-size {cells}: a cell holds at least 1 byte")
    try:
        with phase_bars(name, enabled=bars) as progress:
            return _push(
                store,
                directory,
                name,
                tag,
                stripes=k,
                cell_size=cells,
                targets=[Store(u) for u in uris] or None,
                progress=progress,
            )
    except (StoreError, OSError) as e:
        if os.environ.get("BOOTSEER_STORE_WITHHELD") != "1":
            raise
        raise StoreError(
            f"{e} (this job was started by bootseer exec, which keeps the store's credentials from the job: "
            "set [exec] pass_store_credentials = true for a job that pushes checkpoints itself)"
        ) from None


def push(
    directory: str | os.PathLike[str],
    name: str,
    tag: str | None = None,
    *,
    stripes: int | None = None,
    cell_size: int | None = None,
    targets: list[str] | None = None,
    store: str | None = None,
    config: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> str:
    """Push `directory` as checkpoint NAME:TAG; returns the tag. The manifest is published last."""
    from .config import load
    from .settings import Settings
    from .store.core import open_store_for

    settings = Settings.from_config(load(config, {("store", "uri"): store}))
    m = push_checkpoint(
        open_store_for(settings),
        settings.checkpoint,
        Path(directory),
        name,
        tag,
        stripes=stripes,
        cell_size=cell_size,
        targets=targets,
        bars=None if progress else False,
    )
    return m.tag
