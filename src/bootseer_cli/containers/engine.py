"""The Docker engine, through the `docker` SDK: image digests and the containers `prewarm` runs.

Why digests: the image key must be the same number outside a container (CI, `prewarm`) and inside it
(every node at run time). A registry digest (`RepoDigests`) names the image wherever it was pulled;
an image that never left this engine has only its id, which is stable on this engine, so that is
the fallback. Both are `sha256:…` strings, which `keys.image_key_doc` hashes.

Why labels: a prewarm that is killed (CI timeout, Ctrl-C twice) leaves its container behind. Every
container bootseer creates carries `LABEL` with the owner (host, pid), so the next prewarm finds and
removes those whose owner is gone, and never touches a container of a prewarm still running.

The SDK is imported inside functions only: `identity.resolve_image` imports this module on
`bootseer exec` (to ask a mounted engine for the image's digest).
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BootseerError
from ..procs import pid_alive

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.errors import APIError
    from docker.models.containers import Container
    from docker.models.images import Image

LABEL = "io.bootseer.prewarm"  # value: "<host>:<pid>"
LABEL_CREATED = "io.bootseer.created"  # unix time, for containers of other hosts sharing an engine
LEFTOVER_AGE_S = 6 * 3600.0  # a container owned by another host is a leftover after this long
DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def engine_address() -> str:
    """Where the SDK will look for the engine (what the user must fix when it is not there)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def _socket_path() -> str | None:
    addr = engine_address()
    return addr[len("unix://") :] if addr.startswith("unix://") else None


def connect(timeout: float = 60.0) -> DockerClient:
    """A connected `docker.DockerClient`, or a one-line error naming the socket."""
    addr = engine_address()
    sock = _socket_path()
    if sock is not None and not os.path.exists(sock):
        raise BootseerError(
            f"no Docker engine: {sock} does not exist (start dockerd, mount the socket, or set DOCKER_HOST)"
        )
    try:
        import docker
        import docker.errors
    except ImportError:
        raise BootseerError("the docker Python package is missing: pip install docker") from None
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except (docker.errors.DockerException, OSError) as e:  # requests' connection errors are OSErrors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BootseerError(f"cannot reach the Docker engine at {addr}: {reason}") from None
    return client


# --- image references and digests -------------------------------------------------------------


def split_ref(ref: str) -> tuple[str, str | None, str | None]:
    """`repo[:tag][@digest]` → (repo, tag, digest). The tag's colon is the one after the last slash."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref, tag = ref[:colon], ref[colon + 1 :]
    return ref, tag, digest


def _normalise_repo(repo: str) -> str:
    """Docker Hub names appear both with and without `docker.io/` and `library/`."""
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        if repo.startswith(prefix):
            return repo[len(prefix) :]
    return repo


@dataclass(frozen=True)
class ResolvedImage:
    ref: str  # what the user gave
    digest: str  # sha256:… (registry manifest digest, or the image id for a local-only image)
    pinned: str  # a reference that names exactly this image: repo@digest, or the image id
    image_id: str
    source: str  # "registry digest" | "image id"


def digest_of(image_attrs: dict[str, Any], ref: str) -> tuple[str, str, str]:
    """(digest, pinned reference, source) for an inspected image, preferring the registry digest.

    Pure, so that the choice can be tested without an engine. Among several `RepoDigests` the one of
    the repository the user named wins; the others name the same manifest in another registry.
    """
    repo, _, pinned_digest = split_ref(ref)
    if pinned_digest:
        return pinned_digest, f"{repo}@{pinned_digest}", "registry digest"
    repo_digests = sorted(image_attrs.get("RepoDigests") or [])
    want = _normalise_repo(repo)
    for rd in repo_digests:
        r, _, d = split_ref(rd)
        if d and _normalise_repo(r) == want:
            return d, rd, "registry digest"
    if repo_digests:
        r, _, d = split_ref(repo_digests[0])
        if d:
            return d, repo_digests[0], "registry digest"
    image_id = image_attrs["Id"]
    return image_id, image_id, "image id"


def resolve_image(client: DockerClient, ref: str, pull: bool = True) -> ResolvedImage:
    """Find `ref` on the engine (pulling it when absent) and name its digest.

    Errors are one line: an image that does not exist, or a registry that cannot be reached.
    """
    import docker.errors

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        if not pull:
            raise BootseerError(f"image {ref} is not on this engine") from None
        image = _pull(client, ref)
    except docker.errors.APIError as e:
        raise BootseerError(f"image {ref}: {_api_reason(e)}") from None
    digest, pinned, source = digest_of(image.attrs, ref)
    return ResolvedImage(ref=ref, digest=digest, pinned=pinned, image_id=image.id, source=source)


def _api_reason(e: APIError) -> str:
    text = getattr(e, "explanation", None) or str(e)
    return str(text).splitlines()[0] if text else type(e).__name__


def _pull(client: DockerClient, ref: str) -> Image:
    import docker.errors

    repo, tag, digest = split_ref(ref)
    try:
        if digest:
            return client.images.pull(f"{repo}@{digest}")
        return client.images.pull(repo, tag=tag or "latest")
    except docker.errors.APIError as e:
        raise BootseerError(f"image {ref} is not on this engine and cannot be pulled: {_api_reason(e)}") from None


def _engine_answer(ask: Callable[[DockerClient], str | None]) -> str | None:
    """`ask(client)` on a short-lived client, or None when no engine can answer: the key path must
    never fail for want of an engine, and must not import the SDK when there is no socket."""
    sock = _socket_path()
    if sock is not None and not os.path.exists(sock):
        return None
    try:
        import docker
        import docker.errors
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=5)
        try:
            return ask(client)
        finally:
            client.close()
    # no engine, no such image or container, or an inspect without the field (an odd engine)
    except (docker.errors.DockerException, OSError, KeyError):
        return None


def resolve_local_digest(ref: str) -> str | None:
    """The digest the engine has for a tag `ref` now, or None (no engine, no such image).

    Called by `identity.resolve_image` for an `[image] ref` given as a tag; never pulls, never
    raises, and does not import the SDK when no engine socket exists.
    """
    return _engine_answer(lambda client: digest_of(client.images.get(ref).attrs, ref)[0])


def own_container_id() -> str | None:
    """This process's container id, when it runs in a Docker container (else None).

    The cgroup v1 path names it; under cgroup v2 the mount table of /etc/hostname does.
    """
    if not os.path.exists("/.dockerenv"):
        return None
    for path, marker in (("/proc/self/cgroup", "/docker/"), ("/proc/self/mountinfo", "/containers/")):
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            i = line.find(marker)
            if i >= 0:
                cid = line[i + len(marker) :][:64]
                if len(cid) == 64 and all(c in "0123456789abcdef" for c in cid):
                    return cid
    return None


def own_image_digest() -> str | None:
    """The digest of the image this container was started from, asked of a mounted engine socket.

    This is the middle rung of the image key (after `BOOTSEER_IMAGE`, before the root-filesystem
    fingerprint): it agrees with what `prewarm` resolves outside for the same image.
    """
    sock = _socket_path()
    if sock is None or not os.path.exists(sock):
        return None
    cid = own_container_id()
    if cid is None:
        return None

    def ask(client: DockerClient) -> str:
        container = client.containers.get(cid)
        image_ref = container.attrs.get("Config", {}).get("Image", "")
        image = client.images.get(container.attrs["Image"])
        return digest_of(image.attrs, image_ref or image.id)[0]

    return _engine_answer(ask)


# --- labelled containers ----------------------------------------------------------------------


def owner_label() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"  # gethostname(2)'s name: no `socket` import at every start


def is_leftover(labels: dict[str, str], now: float | None = None) -> bool:
    """A labelled container whose prewarm is gone: same host and a dead pid, or another host and old."""
    owner = labels.get(LABEL, "")
    host, _, pid = owner.rpartition(":")
    if host == os.uname().nodename and pid.isdigit():
        return int(pid) != os.getpid() and not pid_alive(int(pid))
    try:
        created = float(labels.get(LABEL_CREATED, "0"))
    except ValueError:
        created = 0.0
    return (now or time.time()) - created > LEFTOVER_AGE_S


def remove_leftovers(client: DockerClient, warn: Callable[[str], None] | None = None) -> list[str]:
    """Remove the containers interrupted prewarms left behind; returns their names.

    A removal the engine refuses (e.g. while it is still stopping the container) is retried a few
    times; one removed by someone else meanwhile is fine.
    """
    import docker.errors

    removed = []
    # the SDK lists, then inspects each container: one removed in between (another prewarm's
    # cleanup, the engine's auto-remove) is not there to clean up, not an error
    for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
        if not is_leftover(c.labels):
            continue
        for attempt in range(5):
            try:
                c.remove(force=True)
                removed.append(c.name)
                break
            except docker.errors.NotFound:
                break
            except (docker.errors.APIError, OSError) as e:  # e.g. 409 while the engine still stops it
                if attempt == 4:
                    if warn is not None:
                        warn(f"could not remove container {c.name} left by an interrupted prewarm: {e}")
                    break
                time.sleep(1.0)
    return removed


def tar_of(files: Iterable[tuple[str, Path | bytes, int]]) -> bytes:
    """A tar archive of (path in container, source file or bytes, mode) for `put_archive` at /."""
    import tarfile  # here: this module is imported at every start (the image's identity), tarfile rarely

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for dest, src, mode in files:
            rel = dest.lstrip("/")
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            data = src if isinstance(src, bytes) else Path(src).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class RunResult:
    exit_code: int
    output: str


def _stream_logs(container: Container, chunks: list[str], echo: Callable[[str], None] | None) -> None:
    """Collect the container's output into `chunks` and echo it line by line as it comes (CI logs)."""
    pending = ""
    for raw in container.logs(stream=True, follow=True):
        text = raw.decode("utf-8", errors="replace")
        chunks.append(text)
        if echo is not None:
            pending += text
            *lines, pending = pending.split("\n")
            for line in lines:
                echo(line)
    if echo is not None and pending:
        echo(pending)


def _create(client: DockerClient, image: str, command: list[str], name: str, **options: object) -> Container:
    """A container of `image` labelled as prewarm's (so an interrupted run's is found and removed later)."""
    import docker.errors

    labels = {LABEL: owner_label(), LABEL_CREATED: f"{time.time():.0f}"}
    try:
        return client.containers.create(image, command, name=name, labels=labels, detach=True, **options)
    except docker.errors.APIError as e:
        raise BootseerError(f"cannot create a container of {image}: {_api_reason(e)}") from None


def _start_and_wait(
    container: Container,
    chunks: list[str],
    *,
    files: bytes | None,
    seed: Path | None,
    echo: Callable[[str], None] | None,
    after: Callable[[Container], None] | None,
) -> int:
    """Unpack the archives, start, stream the output into `chunks`, wait; `after` reads what a container
    that exited 0 made. Returns its exit code."""
    if files:
        container.put_archive("/", files)
    if seed is not None:
        with open(seed, "rb") as f:
            container.put_archive("/", f)
    container.start()
    _stream_logs(container, chunks, echo)
    code = int(container.wait().get("StatusCode", 1))
    if code == 0 and after is not None:
        after(container)
    return code


def run_container(
    client: DockerClient,
    image: str,
    command: list[str],
    *,
    environment: dict[str, str] | None = None,
    binds: dict[str, dict[str, str]] | None = None,
    files: bytes | None = None,
    network_mode: str = "none",
    working_dir: str | None = None,
    name_hint: str = "step",
    echo: Callable[[str], None] | None = None,
    entrypoint: list[str] | None = None,
    seed: Path | None = None,
    after: Callable[[Container], None] | None = None,
) -> RunResult:
    """Run `command` in a fresh labelled container, stream its output, remove it however this ends.

    `files` is a tar archive unpacked at / before the start (the setup's requirement files), `seed`
    another one on disk (streamed: it may hold a snapshot). The network is `none` unless asked
    (`host`): prewarm never uses the default bridge. The image's entrypoint is bypassed unless
    `entrypoint` names one (bootseer is the command here). `after` reads what the container made
    (`containers.handback`) once it exited 0, before it is removed.
    """
    import docker.errors

    name = f"bootseer-prewarm-{name_hint}-{os.getpid()}-{os.urandom(3).hex()}"
    container = _create(
        client,
        image,
        command,
        name,
        environment=environment or {},
        volumes=binds or {},
        network_mode=network_mode,
        working_dir=working_dir,
        entrypoint=entrypoint if entrypoint is not None else [],
    )
    chunks: list[str] = []
    try:
        code = _start_and_wait(container, chunks, files=files, seed=seed, echo=echo, after=after)
    except docker.errors.APIError as e:
        reason = _api_reason(e)
        if "executable file not found" in reason or "no such file or directory" in reason:
            raise BootseerError(f"{command[0]} is not found in {image} (not on its PATH)", 127) from None
        raise BootseerError(f"container {name}: {reason}") from None
    finally:
        try:
            container.remove(force=True)
        except (docker.errors.DockerException, OSError):  # the engine went away or refuses: say so, go on
            from ..redact import warn

            warn(f"could not remove container {name}")
    return RunResult(exit_code=code, output="".join(chunks))
