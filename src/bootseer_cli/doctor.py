"""`bootseer doctor`: can bootseer do its work on this machine? Each check says how to fix what fails."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import BootseerError
from .units import fmt_bytes
from .upkeep import Check

if TYPE_CHECKING:
    from .settings import Settings, StoreSettings


def check_store(settings: StoreSettings) -> Check:
    from .redact import redact, redact_text
    from .store.core import open_store

    uri = redact(settings.uri) if settings.uri else "(local default)"
    try:
        store = open_store(settings.uri)
        store.check_writable()
    # StoreError for what bootseer recognises; pyarrow raises OSError for I/O and ValueError
    # (ArrowInvalid) for a URI or bucket it rejects.
    except (BootseerError, OSError, ValueError) as e:
        return Check(
            "store",
            "fail",
            f"{uri}: {redact_text(str(e))}",
            "check [store] uri, the credentials and that the server is up",
        )
    return Check("store", "ok", f"{store.uri} is reachable and writable")


def check_leases(settings: StoreSettings) -> Check:
    """How the store's single-flight leases are taken: compare-and-swap (a local store's exclusive create,
    S3 conditional writes) or, where the store offers neither, a claim per taker and Lamport's bakery."""
    from .redact import redact_text
    from .store.core import open_store
    from .store.leases import lease_protocol

    try:
        protocol, why = lease_protocol(open_store(settings.uri))
    except (BootseerError, OSError, ValueError) as e:
        return Check("leases", "warn", f"not checked: {redact_text(str(e))}")
    if protocol == "compare-and-swap":
        return Check("leases", "ok", f"compare-and-swap: {why}")
    return Check(
        "leases",
        "ok",
        f"a claim per taker and Lamport's bakery ({why}): exact unless a taker stalls for longer than the "
        "lease's TTL in the middle of taking it",
    )


def check_trust(settings: Settings) -> Check:
    """Which domain this node writes, what it reads, and whether refs are signed (one line to turn it on)."""
    from .trust import describe, trust_for

    try:
        status, detail, fix = describe(trust_for(settings))
    except BootseerError as e:
        return Check("trust", "fail", str(e), "fix [trust] (bootseer trust keygen writes a key pair)")
    return Check("trust", status, detail, fix)


def check_cache(settings: StoreSettings) -> Check:
    """The node cache's free space, and whether it can be written at all: a read-only cache is not a full
    one (freeing space would not help), and `exec` runs without it either way (`nodedirs`)."""
    from .nodedirs import why_unusable
    from .paths import configured_cache_root
    from .store.cache import BlobCache

    cache = BlobCache(settings.cache_dir or configured_cache_root() / "blobs", settings.cache_max_bytes)
    path = cache.root
    while not path.exists() and path != path.parent:
        path = path.parent
    why = why_unusable(cache.root)
    if why and why != "full":
        return Check(
            "cache",
            "warn",
            f"{cache.root} is {why}: bootseer exec runs without the node cache (every start fetches again)",
            "mount a writable volume there (Kubernetes: an emptyDir at XDG_CACHE_HOME) or set [store] cache_dir",
        )
    free = shutil.disk_usage(path).free
    need = min(cache.max_bytes, 10 << 30)
    detail = f"{cache.root}: {fmt_bytes(free)} free (limit {fmt_bytes(cache.max_bytes)})"
    if free < need:
        return Check("cache", "warn", detail, "free space, or lower [store] cache_max_gb / move cache_dir")
    return Check("cache", "ok", detail)


def check_docker() -> Check:
    sock = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        import docker
        import docker.errors
    except ImportError as e:
        return _no_docker(sock, e)
    try:
        client = docker.from_env(timeout=5)
        version = client.version().get("Version", "?")
        client.close()
    except (docker.errors.DockerException, OSError) as e:  # requests' connection errors are OSErrors
        return _no_docker(sock, e)
    return Check("docker", "ok", f"engine {version} at {sock}")


def _no_docker(sock: str, e: Exception) -> Check:
    """Why no engine answered: a socket this user may not open is not a missing engine (a plain user
    outside the docker group was told to start a dockerd that was running)."""
    path = sock.removeprefix("unix://") if sock.startswith("unix://") else ""
    if path and os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return Check(
            "docker",
            "warn",
            f"the Docker engine's socket {path} refuses this user (permission denied)",
            "add the user to the socket's group (usually `docker`), or run prewarm as root "
            "(only `bootseer prewarm` needs the engine)",
        )
    return Check(
        "docker",
        "warn",
        f"no Docker engine at {sock}: {type(e).__name__}",
        "start dockerd (only `bootseer prewarm` needs it)",
    )


def check_hostname(timeout_s: float = 2.0) -> Check:
    """Does this node's hostname resolve? torchrun's rendezvous looks it up and hangs for minutes when not
    (`--network none`, a container without --hostname/--add-host). Bounded: the lookup runs in a daemon
    thread, so a resolver that never answers costs `timeout_s`, not the resolver's own timeouts."""
    import threading

    name = socket.gethostname()
    outcome: list[BaseException | None] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            socket.getaddrinfo(name, None)
            outcome.append(None)
        except (OSError, UnicodeError) as e:
            outcome.append(e)
        done.set()

    threading.Thread(target=lookup, name="doctor-hostname", daemon=True).start()
    done.wait(timeout_s)
    if outcome and outcome[0] is None:
        return Check("hostname", "ok", f"{name} resolves")
    why = str(outcome[0]) if outcome else f"no answer within {timeout_s:g} s"
    return Check(
        "hostname",
        "warn",
        f"the hostname {name} does not resolve: {why}",
        "add the hostname to /etc/hosts or run the container with --hostname/--add-host; "
        "torchrun's rendezvous would hang on it",
    )


def run_checks(settings: Settings, command: Sequence[str] = ()) -> list[Check]:
    """The machine's checks, then each capability's (its `doctor` hook), in the order `bootseer doctor` prints them.
    `command` is the launcher (after `--`), for the hooks that read it (a `command` keyword)."""
    import inspect

    from .capabilities import CAPABILITIES, resolve

    checks = [check_store(settings.store), check_leases(settings.store), check_trust(settings)]
    checks += [check_cache(settings.store), check_docker()]
    checks.append(check_hostname())
    for cap in CAPABILITIES:  # each capability checks what it needs of this machine
        if cap.doctor:
            hook = resolve(cap.doctor)
            reads = "command" in inspect.signature(hook).parameters
            checks += hook(settings, command=tuple(command)) if reads else hook(settings)
    return checks
