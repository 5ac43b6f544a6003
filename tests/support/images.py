"""Test images without Docker Hub: a root filesystem assembled from this machine, and a local registry.

The base image holds this machine's Python (moved to /usr/local, as official python images have it),
the distributions bootseer depends on, dash as /bin/sh, a few coreutils and the shared libraries all
of these need (found with `ldd`). It is `docker import`ed once and tagged with a hash of its inputs,
so later sessions and runs reuse it. bootseer itself is installed on top by rendering the
Dockerfile snippet from templates/ (the way a user installs it), keyed by a hash of the source tree.

`Registry` runs Debian's `docker-registry` on a free loopback port with its own config; its storage
directory is kept across runs (pushing a layer the registry already has costs nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.s3server import free_port

BUILDER_VERSION = "7"  # bump when the way the base rootfs is assembled changes
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("BOOTSEER_TEST_CACHE", Path.home() / ".cache" / "bootseer-tests"))
PY_VER = f"{sys.version_info.major}.{sys.version_info.minor}"

# Host tools copied into the image, with the libraries they need.
TOOLS = ["dash", "cat", "cp", "mv", "rm", "ls", "mkdir", "ln", "env", "true", "false", "sleep", "chmod", "echo",
         "head", "tail", "wc", "id", "test", "touch", "uname", "sync", "readlink", "dirname", "basename", "sha256sum",
         "grep", "sed", "tar", "timeout", "tr"]  # fmt: skip
# Standard library parts nobody imports at run time.
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
EXTRA_DISTS = ["pip", "setuptools", "wheel"]  # to `pip install` bootseer inside the image
# Parts of the distributions bootseer never loads (headers, test suites, Arrow Flight and Gandiva):
# a smaller image is a faster first push on a CI machine.
SITE_SKIP = re.compile(r"(^|/)(tests?|include)/|flight|gandiva|\.(pyx|pxd|pxi|h|hpp|cc|cpp)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(roots: list[str]) -> list[md.Distribution]:
    """The installed distributions `roots` need (their requirements, without extras), recursively."""
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = _norm(name)
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [seen[k] for k in sorted(seen)]


def _base_dists() -> list[md.Distribution]:
    return [d for d in dependency_closure(["bootseer", *EXTRA_DISTS]) if _norm(d.metadata["Name"]) != "bootseer"]


def base_inputs() -> dict[str, Any]:
    return {
        "builder": BUILDER_VERSION,
        "python": sys.version,
        "prefix": sys.base_prefix,
        "dists": sorted(f"{d.metadata['Name']}=={d.version}" for d in _base_dists()),
        "tools": TOOLS,
    }


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _ldd(paths: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for p in paths:
        out = subprocess.run(["ldd", str(p)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+)\s+\(0x", line)
            if m:
                libs.add(Path(m.group(1)))
    return libs


def _copy(src: Path, root: Path, dest: str | None = None) -> Path:
    target = root / (dest or str(src)).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copy2(src, target, follow_symlinks=True)
    return target


def assemble_rootfs(root: Path) -> None:
    """Lay out the base image's files under `root` (see the module docstring)."""
    prefix = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
    dest_stdlib = root / "usr/local/lib" / f"python{PY_VER}"
    # The interpreter and its shared library.
    exe = prefix / "bin" / f"python{PY_VER}"
    _copy(exe, root, f"/usr/local/bin/python{PY_VER}")
    for name in ("python3", "python"):
        (root / "usr/local/bin" / name).symlink_to(f"python{PY_VER}")
    elf: list[Path] = [exe]
    for lib in (prefix / "lib").glob("libpython*.so*"):  # symlinks stay symlinks: one 25 MB copy
        target = root / "usr/local/lib" / lib.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target, follow_symlinks=False)
    # The standard library, without what nobody imports and without static archives.
    for entry in stdlib.iterdir():
        if entry.name in STDLIB_SKIP or entry.name == "site-packages":
            continue
        target = dest_stdlib / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, ignore=shutil.ignore_patterns("*.a"))
        else:
            _copy(entry, root, str(target.relative_to(root)))
    elf += list((dest_stdlib / "lib-dynload").glob("*.so"))
    # The distributions bootseer needs, file by file from their RECORDs (console scripts excluded:
    # their shebangs name this machine's interpreter; pip below gets a wrapper).
    site = dest_stdlib / "site-packages"
    site.mkdir(parents=True)
    for dist in _base_dists():
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            if ".." in Path(f).parts or not src.is_file() or ("__pycache__" in f.parts and src.suffix != ".pyc"):
                continue
            if SITE_SKIP.search(str(f)):
                continue
            target = site / f
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            if target.suffix == ".so" or ".so." in target.name:
                elf.append(target)
    pip = root / "usr/local/bin/pip"
    pip.write_text(
        f"#!/usr/local/bin/python{PY_VER}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
    )
    pip.chmod(0o755)
    (root / "usr/local/bin/pip3").symlink_to("pip")
    # A shell and the tools setups and hooks use.
    for tool in TOOLS:
        path = shutil.which(tool)
        if path is None:
            raise RuntimeError(f"{tool} is not installed on this machine")
        real = Path(path).resolve()
        _copy(real, root, f"/usr/bin/{tool}")
        elf.append(real)
    (root / "bin").mkdir(exist_ok=True)  # hooks are POSIX sh: dash is /bin/sh
    (root / "bin/sh").symlink_to("/usr/bin/dash")
    for lib in _ldd(elf):
        if str(lib).startswith((str(prefix), str(root))):
            continue  # libpython (copied above), or a library already inside the rootfs ($ORIGIN)
        _copy(lib.resolve(), root, str(lib))
    ld = Path("/lib64/ld-linux-x86-64.so.2")
    if ld.exists():
        _copy(ld.resolve(), root, str(ld))
    # The few files a Debian-like system is expected to have.
    for d in ("tmp", "var/tmp", "root", "etc", "proc", "sys", "dev", "run", "home"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "etc/os-release").write_text('PRETTY_NAME="bootseer test image"\nID=bootseer-test\nVERSION_ID="1"\n')
    (root / "etc/ld.so.conf").write_text("/usr/local/lib\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)


def _prune(client: Any, repo: str, keep: str) -> None:
    """Drop the images of `repo` other than `keep` (earlier inputs): the engine's disk is not endless."""
    for image in client.images.list(name=repo):
        for tag in image.tags:
            if tag.startswith(f"{repo}:") and tag != keep:
                with contextlib.suppress(Exception):  # in use by a container or a child image: keep it
                    client.images.remove(tag)


def ensure_base(client: Any) -> str:
    """The base image's tag, importing it when this engine does not have it yet."""
    import docker.errors

    tag = f"bootseer-test-base:{_digest(base_inputs())}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="bootseer-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        assemble_rootfs(root)
        # Three layers of similar size instead of one: a push compresses layers concurrently, and the
        # first push of this image to a fresh registry is the slowest step of a cold CI run.
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        site = root / "usr/local/lib" / f"python{PY_VER}" / "site-packages"
        shutil.move(site / "pyarrow", ctx / "pyarrow")
        shutil.move(site, ctx / "site-packages")
        site.mkdir()
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in sorted(root.iterdir()):
                tar.add(entry, arcname=entry.name)
        repo, _, version = tag.partition(":")
        client.api.import_image(src=str(archive), repository=f"{repo}-root", tag=version)
        site_in_image = f"/usr/local/lib/python{PY_VER}/site-packages"
        (ctx / "Dockerfile").write_text(
            f"FROM {repo}-root:{version}\n"
            f"COPY pyarrow {site_in_image}/pyarrow\n"
            f"COPY site-packages {site_in_image}/\n"
            "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8\n"
            'CMD ["python3"]\n'
        )
        client.images.build(path=str(ctx), tag=tag, network_mode="none", rm=True, forcerm=True)
        with contextlib.suppress(Exception):
            client.images.remove(f"{repo}-root:{version}")
    client.images.get(tag)
    _prune(client, "bootseer-test", keep="")
    _prune(client, "bootseer-test-base", keep=tag)
    return tag


def _source_files() -> list[Path]:
    """What the Dockerfile snippet installs from: the project as a user would check it out."""
    files = [p for p in (REPO_ROOT / "pyproject.toml", REPO_ROOT / "README.md") if p.is_file()]
    for top in ("src", "templates"):
        for p in sorted((REPO_ROOT / top).rglob("*")):
            if "__pycache__" in p.parts or ".egg-info" in str(p) or p.suffix == ".pyc":
                continue
            if p.is_file() and not p.is_symlink():
                files.append(p)
    return files


def ensure_app(client: Any, base: str) -> str:
    """The base image with bootseer installed through templates/Dockerfile.bootseer."""
    import docker.errors

    from bootseer_cli.templates import render

    files = _source_files()
    h = hashlib.sha256(base.encode())
    for p in files:
        h.update(str(p.relative_to(REPO_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    tag = f"bootseer-test:{h.hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    dockerfile = render(
        "Dockerfile.bootseer",
        {
            "BASE_IMAGE": base,
            "SOURCE": "COPY bootseer-src /tmp/bootseer-src",
            # bootseer's dependencies are the base's (its site-packages); pip too (no ensurepip here)
            "VENV_ARGS": "--system-site-packages --without-pip",
            "PIP_ARGS": "--no-index --no-deps --no-build-isolation",
            "BOOTSEER_SPEC": "/tmp/bootseer-src",
        },
    )
    with tempfile.TemporaryDirectory(prefix="bootseer-ctx-") as tmp:
        ctx = Path(tmp)
        for p in files:
            target = ctx / "bootseer-src" / p.relative_to(REPO_ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
        (ctx / "bootseer-src/src/bootseer_cli/templates").symlink_to("../../templates")
        readme = ctx / "bootseer-src/README.md"
        if not readme.exists():  # pyproject names it; a checkout always has one
            readme.write_text("bootseer\n")
        (ctx / "Dockerfile").write_text(dockerfile)
        try:
            client.images.build(path=str(ctx), tag=tag, network_mode="none", rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            log = "".join(str(x.get("stream", x.get("error", ""))) for x in e.build_log)
            raise RuntimeError(f"building {tag} failed: {e}\n{log}") from None
    _prune(client, "bootseer-test", keep=tag)
    return tag


class Registry:
    """Debian's docker-registry on 127.0.0.1:<free port>, with its own config and storage."""

    def __init__(self, workdir: Path, storage: Path | None = None) -> None:
        self.workdir = workdir
        self.storage = storage or workdir / "storage"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        log = open(self.workdir / "registry.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.workdir / 'registry.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("docker-registry did not answer within 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass(frozen=True)
class TestImage:
    """An image that went through the registry: `ref` (a tag there), `pinned` (repo@digest)."""

    __test__ = False  # not a test class for pytest

    ref: str
    digest: str
    image_id: str

    @property
    def pinned(self) -> str:
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


def publish(client: Any, registry: Registry, local: str, name: str) -> TestImage:
    """Push `local` to the registry as `name`, drop the local names, pull it back by digest."""
    repo = f"{registry.host}/{name}"
    tag = local.rsplit(":", 1)[1] if ":" in local else "latest"
    client.images.get(local).tag(repo, tag)
    digest = None
    for line in client.images.push(repo, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push {repo}:{tag}: {line['error']}")
        aux = line.get("aux") or {}
        digest = aux.get("Digest", digest)
    if not digest:
        raise RuntimeError(f"push {repo}:{tag}: the registry returned no digest")
    client.images.remove(f"{repo}:{tag}")
    image = client.images.pull(f"{repo}@{digest}")
    image.tag(repo, tag)
    return TestImage(ref=f"{repo}:{tag}", digest=digest, image_id=image.id)


def forget_registry(client: Any, registry: Registry) -> None:
    """Drop this session's names in the (stopping) registry, so old images do not pile up on the engine."""
    for image in client.images.list():
        for tag in image.tags:
            if tag.startswith(f"{registry.host}/"):
                with contextlib.suppress(Exception):
                    client.images.remove(tag)
    for image in client.images.list(name="bootseer-test-variant"):
        for tag in image.tags:
            with contextlib.suppress(Exception):
                client.images.remove(tag)


def variant(client: Any, base: str, label: str) -> str:
    """Another image: `base` plus one label (a different image id and registry digest)."""
    import io

    tag = f"bootseer-test-variant:{_digest([base, label])}"
    client.images.build(
        fileobj=io.BytesIO(f"FROM {base}\nLABEL io.bootseer.test.variant={label}\n".encode()),
        tag=tag,
        network_mode="none",
        rm=True,
    )
    return tag
