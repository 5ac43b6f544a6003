"""`bootseer doctor`: can bootseer do its work on this machine? Each check says how to fix what fails."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import BootseerError
from .units import fmt_bytes

if TYPE_CHECKING:
    from .settings import ImageSettings, P2PSettings, Settings, StoreSettings


@dataclass
class Check:
    """One line of `bootseer doctor`: what was checked, how it went, and how to fix it when it did not."""

    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def check_store(settings: StoreSettings) -> Check:
    from .redact import redact, redact_text
    from .store import open_store

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


def check_fuse() -> Check:
    if not os.path.exists("/dev/fuse"):
        return Check(
            "fuse",
            "warn",
            "/dev/fuse is missing: checkpoints can be pulled, not mounted",
            "load the fuse module, or give the container --device /dev/fuse --cap-add SYS_ADMIN",
        )
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return Check(
            "fuse", "warn", "/dev/fuse is not readable and writable by this user", "add the user to group fuse"
        )
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return Check(
            "fuse", "warn", "fusermount3 is not installed (needed to unmount as non-root)", "apt-get install fuse3"
        )
    try:
        import ctypes.util

        if ctypes.util.find_library("fuse3") is None and ctypes.util.find_library("fuse") is None:
            return Check("fuse", "warn", "libfuse is not installed", "apt-get install fuse3")
    except OSError:  # find_library runs ldconfig/gcc; a machine without them is not a FUSE failure
        pass
    return Check("fuse", "ok", "/dev/fuse and libfuse are usable")


def check_cache(settings: StoreSettings) -> Check:
    from .cache import cache_for

    cache = cache_for(settings)
    path = cache.root
    while not path.exists() and path != path.parent:
        path = path.parent
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
    return Check(
        "docker",
        "warn",
        f"no Docker engine at {sock}: {type(e).__name__}",
        "start dockerd (only `bootseer prewarm` needs it)",
    )


def check_p2p(settings: P2PSettings) -> Check:
    spec = settings.port
    lo, _, hi = spec.partition("-")
    try:
        ports = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        return Check("p2p", "fail", f"[p2p] port {spec!r} is not a port or a range", 'use e.g. port = "6881-6891"')
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return Check("p2p", "ok", f"TCP port {port} is free for the swarm")
    return Check(
        "p2p",
        "warn" if not settings.enabled else "fail",
        f"no free TCP port in {spec}",
        "pick another [p2p] port range",
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


def check_image_roots(image: ImageSettings) -> list[Check]:
    """One line per image root: does its filesystem keep a file's pages across opens (hotblocks/probe.py)?"""
    from .hotblocks.probe import probe_roots
    from .hotblocks.roots import resolve_roots

    out = []
    for p in probe_roots(resolve_roots(image)):
        if p.keeps:
            out.append(Check("image root", "ok", p.line()))
        elif p.drops:
            fix = 'replay is skipped here; set [image] replay = "always" if the loader keeps its own cache'
            out.append(Check("image root", "warn", p.line(), fix))
        else:
            out.append(Check("image root", "warn", p.line(), "check that the root is readable"))
    return out


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order `bootseer doctor` prints them."""
    return [
        check_store(settings.store),
        check_fuse(),
        check_cache(settings.store),
        check_docker(),
        check_p2p(settings.p2p),
        check_hostname(),
        *check_image_roots(settings.image),
    ]
