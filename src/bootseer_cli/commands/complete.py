"""Shell completion for values only bootseer knows: template names (`init --template`) and checkpoint
refs (`ckpt pull|mount|rm`).

Completion runs on every Tab press: the refs are read from the store in a thread with a short deadline
(`REFS_DEADLINE_S`), and an unreachable or slow store completes nothing rather than hanging the shell.
"""

from __future__ import annotations

import threading

REFS_DEADLINE_S = 2.0
MAX_REFS = 200


def template_names(incomplete: str) -> list[str]:
    """The templates `bootseer init --list` shows, those starting with what was typed."""
    from .. import templates

    return [n for n in templates.available() if n.startswith(incomplete)]


def checkpoint_refs(incomplete: str) -> list[str]:
    """`NAME:TAG` and `NAME:latest` of the checkpoints in the configured store, those starting with
    what was typed; nothing when the store does not answer within `REFS_DEADLINE_S`."""
    found: list[str] = []
    done = threading.Event()

    def read() -> None:
        try:
            from ..settings import Settings
            from ..store.core import open_store_for
            from ..stripe.layout import ckpt_prefix
            from .options import load_config

            st = open_store_for(Settings.from_config(load_config(None, None)))
            name, sep, _ = incomplete.partition(":")
            names = [name] if sep else [n for n in st.list_dirs("ckpt") if n.startswith(name)]
            for n in names[:MAX_REFS]:
                refs = [f"{n}:{t}" for t in st.list_dirs(ckpt_prefix(n))]
                found.extend([f"{n}:latest", *refs] if refs else [])
        except Exception:  # completion must never print a traceback into the shell
            pass
        finally:
            done.set()

    threading.Thread(target=read, name="bootseer-complete", daemon=True).start()
    done.wait(REFS_DEADLINE_S)
    return [r for r in list(found) if r.startswith(incomplete)][:MAX_REFS]
