"""`bootseer doctor`: can bootseer do its work on this machine? Each check says how to fix what fails."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def check_store(cfg: Any) -> Check:
    from .store import store_from_config

    uri = cfg.get("store", "uri") or "(local default)"
    try:
        store = store_from_config(cfg)
        store.check_writable()
    except Exception as e:
        return Check("store", "fail", f"{uri}: {e}", "check [store] uri, the credentials and that the server is up")
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
    except Exception:
        pass
    return Check("fuse", "ok", "/dev/fuse and libfuse are usable")


def check_cache(cfg: Any) -> Check:
    from .cache import cache_from_config

    cache = cache_from_config(cfg)
    path = cache.root
    while not path.exists() and path != path.parent:
        path = path.parent
    free = shutil.disk_usage(path).free
    need = min(cache.max_bytes, 10 << 30)
    detail = f"{cache.root}: {free / 2**30:.1f} GiB free (limit {cache.max_bytes / 2**30:.1f} GiB)"
    if free < need:
        return Check("cache", "warn", detail, "free space, or lower [store] cache_max_gb / move cache_dir")
    return Check("cache", "ok", detail)


def check_docker() -> Check:
    sock = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        import docker

        client = docker.from_env(timeout=5)
        version = client.version().get("Version", "?")
        client.close()
    except Exception as e:
        return Check(
            "docker",
            "warn",
            f"no Docker engine at {sock}: {type(e).__name__}",
            "start dockerd (only `bootseer prewarm` needs it)",
        )
    return Check("docker", "ok", f"engine {version} at {sock}")


def check_p2p(cfg: Any) -> Check:
    spec = str(cfg.get("p2p", "port"))
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
        "warn" if not cfg.get("p2p", "enabled") else "fail",
        f"no free TCP port in {spec}",
        "pick another [p2p] port range",
    )


def run_checks(cfg: Any) -> list[Check]:
    return [check_store(cfg), check_fuse(), check_cache(cfg), check_docker(), check_p2p(cfg)]
