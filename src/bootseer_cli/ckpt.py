"""Python API for training code that saves checkpoints: store one in the striped layout.

    import bootseer_cli.ckpt
    torch.save(state, "/tmp/ckpt/model.pt")
    tag = bootseer_cli.ckpt.push("/tmp/ckpt", "my-model")          # tag defaults to a timestamp
    # a restarted job then mounts my-model:latest ([checkpoint] name = "my-model")

The store and targets come from bootseer.toml / BOOTSEER_* as for the CLI, unless given here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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
    from .progress import byte_bar
    from .store import Store
    from .stripe.push import push as _push

    cfg = load(config, {("store", "uri"): store})
    st = Store(cfg.get("store", "uri")) if cfg.get("store", "uri") else _default_store()
    uris = targets if targets is not None else list(cfg.get("checkpoint", "targets") or [])
    target_stores = [Store(u) for u in uris] or None
    bars: list[Any] = []

    def bar(phase: str, total: int) -> Any:
        for b in bars:
            b.__exit__(None, None, None)
        bars.clear()
        cm = byte_bar(total, f"{phase} {name}", enabled=None if progress else False)
        bars.append(cm)
        return cm.__enter__()

    try:
        m = _push(
            st,
            Path(directory),
            name,
            tag,
            stripes=stripes or cfg.get("checkpoint", "stripes"),
            cell_size=cell_size or cfg.get("checkpoint", "cell_size"),
            targets=target_stores,
            progress=bar,
        )
    finally:
        for b in bars:
            b.__exit__(None, None, None)
    return m.tag


def _default_store() -> Any:
    from .store import open_store

    return open_store(None)
