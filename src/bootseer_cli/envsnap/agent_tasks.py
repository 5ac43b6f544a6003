"""The "env-publish" agent task: upload the env snapshot the builder captured before exec, while the
job starts, holding the builder's single-flight lease until the ref is written.

Its spec, `PublishTask` (made by stage.py `_capture_and_hand_over`): env_key, roots, upload
(publish.Upload as a dict: the pending blob in the node cache and the ref's counts), and the lease
(key, owner, expires, ttl_s). The other nodes wait on that lease (stage.py `_single_flight`); the agent renews it (and
touches the pending blob, so `sweep_pending` knows it has an uploader) and releases it after the ref
is written, or at once when the upload fails, so the next node builds without waiting for the TTL.
If the agent dies (the node, SIGKILL), nobody renews: the lease expires after its TTL and the next
node to take it builds. The task is marked `finish`: the agent waits for it after the launcher ends.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BootseerError
from ..events import record as record_event
from ..units import count, fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from ..agent import Agent
    from ..store.core import Lease


@dataclass(frozen=True)
class PublishTask:
    """The "env-publish" task: upload the capture `upload` (`snapshot.Upload.as_task()`) of env `env_key` under
    the builder's lease, handed over with it."""

    finish: ClassVar[bool] = True  # the agent waits for it after the launcher ends (others wait on its lease)

    env_key: str
    roots: list[str]
    upload: dict[str, Any]
    lease_key: str
    lease_owner: str
    lease_expires: float
    lease_ttl_s: float
    ref_extra: dict[str, Any] = field(default_factory=dict)  # parent, chain, depth, inputs (publish.py)
    # `[env] mode = "mount"` and the capture is the whole tree: pack the env image from the pending blob
    # here, behind the launcher, and name it in the ref (envmount/image.py)
    image_from_blob: bool = False


def _lease_of(task: PublishTask, agent: Agent) -> Lease:
    """The builder's lease, rebuilt from its parts on the agent's own store client."""
    from ..store.core import Lease

    return Lease(agent.store, task.lease_key, task.lease_owner, task.lease_expires, task.lease_ttl_s)


def _image(agent: Agent, roots: list[str], blob: Path) -> dict[str, Any]:
    """The ref field of the env image packed from the pending whole-tree blob ({} when it cannot be
    built: logged, and the snapshot is extracted on other nodes)."""
    from ..envmount.image import image_for_publish
    from ..store.cache import cache_for
    from .setup import excluded_paths

    t0 = time.monotonic()
    settings = agent.settings
    made = image_for_publish(roots, excluded_paths(settings.store), cache_for(settings.store), agent.log, blob)
    if made:
        agent.log(f"env-publish: env image packed in {fmt_seconds(time.monotonic() - t0)}")
    return made


def publish_task(task: PublishTask, agent: Agent) -> None:
    """Renew the lease, upload, write the ref, release; the pending blob never outlives the task."""
    from ..store.cache import cache_for
    from .lease import LeaseKeeper
    from .publish import Upload, publish

    up = Upload.from_task(task.upload)
    key = task.env_key
    t0 = time.time()
    try:
        lease = _lease_of(task, agent)
        ttl = lease.ttl_s
        if not lease.renew(ttl):  # expired meanwhile, and maybe taken: the upload is still harmless
            agent.log(f"env-publish: the lease on env {key[:12]} was lost before the upload; uploading anyway")

        def touch() -> None:
            with contextlib.suppress(OSError):
                os.utime(up.blob)

        settings = agent.settings
        agent.log(f"env-publish: uploading env {key[:12]} ({fmt_bytes(up.size)}), lease renewed every {ttl / 3:.1f} s")
        with LeaseKeeper(lease, ttl, on_renew=touch):  # released on the way out, after the ref
            roots = [str(r) for r in task.roots]
            cache = cache_for(settings.store)
            extra = {**task.ref_extra, **(_image(agent, roots, up.blob) if task.image_from_blob else {})}
            publish(settings.p2p, agent.store, cache, up, key, roots, extra=extra)
    except (BootseerError, OSError) as e:  # the lease is released: the next node builds and publishes
        agent.log(f"env-publish: env {key[:12]} not published: {e}")
        record_event(agent.run, "env-publish", t0, time.time(), "failed", bytes=up.size, reason=str(e))
        return
    finally:
        up.blob.unlink(missing_ok=True)  # adopted into the cache on success; a failed upload's copy goes
    took = time.time() - t0
    files = count(up.files, "file")
    agent.log(f"env-publish: env {key[:12]} published, {files} ({fmt_bytes(up.size)}) in {fmt_seconds(took)}")
    record_event(agent.run, "env-publish", t0, time.time(), "built", bytes=up.size, detail=up.digest)
