"""The env snapshot's filesystem image: built at publish, named by the signed env ref, uploaded as a blob.

Why squashfs rather than EROFS: every kernel a training node runs has the squashfs driver (loop
mounts as root), and an unprivileged node has `squashfuse`/`squashfuse_ll` (Debian's `squashfuse`) for
a plain-user FUSE mount; `mksquashfs` (Debian's `squashfs-tools`) reads a tar stream and compresses
with zstd on every core. EROFS's kernel driver is newer and its FUSE side (`erofsfuse`) and
`mkfs.erofs` with zstd are missing or old in the distributions nodes run (Debian bookworm's
erofs-utils 1.5 has neither zstd nor a tar input), so squashfs is the image a node can mount
everywhere today; EROFS can be added as a second `format` of the same ref field.

What it holds: each root's whole tree as it stands after the capture, at its absolute path without
the leading '/', so the mount's lower directory for root `/opt/venv` is `<mount>/opt/venv`. A layer
built over a parent that has an image gets an image of its own (`LAYER_FORMAT`): the layer's blob as
it is (what changed over the parent) and a whiteout, a character device 0/0 as overlayfs and
fuse-overlayfs read one in a lower layer, for each topmost path it deleted; its ref field lists the
images below it (`below`, top first, down to a whole one), and a node mounts them all as the overlay's
lower directories (`image_stack`), so a bump publishes a small image, as extract mode publishes a
small layer. A layer over a parent without one gets a whole image of its tree, as before.

bootseer's own state (the node cache, a local store) and its per-tree files
(`.bootseer-env.*`: the stamp, the carried paths, the journal) stay out, as they stay out of the tar
snapshot. The tree is read by the capture's own writer (`envsnap.segments.write_blob`: each file
opened without following a link, component by component from the roots' directory descriptors; a
directory swapped for a link on the way is an error, never read through), into a snapshot-format
`.tar.zst` in the node cache's scratch; its tar stream, decompressed, is what `mksquashfs -tar` packs
(squashfs-tools 4.5.1's own `-cpiostyle` list input hangs). GNU tar, which built the image before,
opened the listed paths by name: a root capture could be made to read through a link a job swapped in.

A capture that is already the whole tree (`Captured.whole`: the setup made the roots from nothing) is
packed from its own blob instead (`whole`): the same writer over the same scan wrote it, so the tree is
not scanned, read and compressed a second time; in `exec` the agent packs it, from the pending blob,
behind the launcher (envsnap/agent_tasks.py).

The ref field is `fs_image: {digest, size, format}`; `format` is "squashfs-zstd", or for a layer's
image "squashfs-zstd-layer" with `below: [{digest, size, format}, ...]` (a bootseer that knows only
whole images sees no image it can mount there, and extracts). Before the ref is
written, `publish()` uploads the image (`upload_images`) from the node cache's pending area, where
the builder left it (a capture handed to the agent waits there too).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import BootseerError

if TYPE_CHECKING:
    from ..store.cache import BlobCache
    from ..store.core import Store

FIELD = "fs_image"
FORMAT = "squashfs-zstd"
# A layer's image: its changes and whiteouts only, stacked over the images its `below` lists. Its own
# format string, so a bootseer that knows only whole images never mounts it alone (it extracts).
LAYER_FORMAT = "squashfs-zstd-layer"
MAX_STACK = 64  # images one mount stacks at most, whatever a ref lists (chain.py's MAX_CHAIN)
SUFFIX = ".squashfs"
OWN_PREFIX = ".bootseer-env"  # the stamp, the carried paths, the journal: per tree, never in an image
BUILD_TIMEOUT_S = 3600.0
# mksquashfs's zstd default is level 15: on 2 cores it packed a CPU torch venv (939 MB) in 53 s against
# 2.2 s for `tar -I 'zstd -T0' -cf`. Level 3 (zstd's own default, the snapshot's level) packs it in
# 2.4 s into 260 MB instead of 224 MB, and a cold `import torch` from either image takes the same time
# (decompression speed hardly depends on the level): the measurements are in BENCHMARKS.md.
ZSTD_LEVEL = 3
PENDING_DIR = "pending"  # envsnap/publish.py's PENDING_DIR, named here: publish imports this module


@dataclass(frozen=True)
class Image:
    path: Path
    digest: str
    size: int
    below: tuple[dict[str, Any], ...] | None = None  # a layer's image: the images under it, top first

    def field(self) -> dict[str, Any]:
        """The ref's extra field naming this image (and, for a layer's, the images it stacks on)."""
        own: dict[str, Any] = {"digest": self.digest, "size": self.size, "format": FORMAT}
        if self.below is not None:
            own.update(format=LAYER_FORMAT, below=list(self.below))
        return {FIELD: own}


def _one(f: object, fmt: str) -> tuple[str, int] | None:
    """(digest, size) of one image entry of format `fmt`, else None."""
    from ..digests import is_digest

    if not isinstance(f, dict) or f.get("format") != fmt or not is_digest(f.get("digest")):
        return None
    size = f.get("size")
    return str(f["digest"]), int(size) if isinstance(size, int) and not isinstance(size, bool) else 0


def image_stack(ref: dict[str, Any]) -> list[tuple[str, int]] | None:
    """The images to mount for `ref`, top first: its whole image alone, or a layer's image and the
    ones it lists below it, layers down to one whole image (the overlay's lower directories in that
    order). None when the ref names none, or a malformed or too long list (it is the signed ref's)."""
    top = ref.get(FIELD)
    whole = _one(top, FORMAT)
    if whole is not None:
        return [whole]
    own = _one(top, LAYER_FORMAT)
    below = top.get("below") if isinstance(top, dict) else None
    if own is None or not isinstance(below, list) or not below or len(below) >= MAX_STACK:
        return None
    stack = [own]
    for i, f in enumerate(below):
        one = _one(f, FORMAT if i == len(below) - 1 else LAYER_FORMAT)
        if one is None:
            return None
        stack.append(one)
    return stack


def top_image(ref: dict[str, Any]) -> tuple[str, int] | None:
    """(digest, size) of the image the ref names itself (the one its publish uploads), else None."""
    stack = image_stack(ref)
    return stack[0] if stack else None


def below_of(parent_ref: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The `below` of a layer's image built over `parent_ref`: the parent's image, then its own
    `below`; None when the parent names no usable image (the layer's image is then a whole tree's)."""
    stack = image_stack(parent_ref)
    if stack is None or len(stack) + 1 >= MAX_STACK:
        return None
    last = len(stack) - 1
    return [{"digest": d, "size": n, "format": FORMAT if i == last else LAYER_FORMAT} for i, (d, n) in enumerate(stack)]


def missing_builder() -> str:
    """Why no image can be built here ("" when it can)."""
    if shutil.which("mksquashfs") is None:
        return "mksquashfs is not installed (apt-get install squashfs-tools)"
    return ""


def tree_paths(roots: list[str], exclude: list[str]) -> Iterator[str]:
    """Every path under the roots (the roots included), relative to '/', never through a link, less
    bootseer's own state (`exclude`) and its per-tree files."""
    skip = [os.path.normpath(p) for p in exclude]

    def excluded(p: str) -> bool:
        return any(p == s or p.startswith(s + "/") for s in skip)

    for root in roots:
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        yield root.lstrip("/")
        for top, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not excluded(os.path.join(top, d)))
            for name in sorted(dirs + files):
                p = os.path.join(top, name)
                if (top == root and name.startswith(OWN_PREFIX)) or excluded(p):
                    continue
                yield p.lstrip("/")


@dataclass(frozen=True)
class LayerSource:
    """A layer's image: packed from the layer's capture (its blob: what changed over the parent) with a
    whiteout for each path it deleted, stacked over `below` (the parent's images, `below_of`)."""

    blob: Path
    deletions: list[str]
    below: list[dict[str, Any]]


def build_image(
    roots: list[str],
    exclude: list[str],
    dest_dir: Path,
    whole: Path | None = None,
    layer: LayerSource | None = None,
) -> Image:
    """Pack the roots' trees into a squashfs image (zstd) under `dest_dir`, named by its digest.

    `whole`: a capture's blob that already holds every path of the trees (the capture of a setup that
    made them from nothing, `Captured.whole`): its tar stream is packed as it is, so the tree is not
    scanned, read and compressed a second time; written by the same no-follow writer from the same
    scan, it is the archive `_tree_archive` would write. `layer`: a layer's own image (`LayerSource`).
    With neither (a tree the setup only added to, a layer over a parent without an image) the trees
    are archived whole first."""
    from ..digests import sha256_file

    why = missing_builder()
    if why:
        raise BootseerError(f"no env image: {why}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f".image-{uuid.uuid4().hex}{SUFFIX}"
    source = dest_dir / f".image-{uuid.uuid4().hex}.tar.zst"
    mk = ["mksquashfs", "-", str(tmp), "-tar", "-comp", "zstd", "-Xcompression-level", str(ZSTD_LEVEL)]
    mk += ["-noappend", "-quiet", "-no-progress"]
    try:
        if whole is None and layer is None:
            _tree_archive(roots, exclude, source)
        # The snapshot format keeps no owners (a restore makes the files the restoring user's); the
        # image's files are the tree's owner's (its first root's), as an extraction by that user makes
        # them, so that user's writable layer may write into them (fuse-overlayfs checks the lower's owner).
        owner = os.lstat(roots[0]) if roots else None
        if owner is not None:
            mk += ["-force-uid", str(owner.st_uid), "-force-gid", str(owner.st_gid)]
        if layer is not None:
            _pack(mk, lambda out: _feed_tar(layer.blob, out, whiteouts(layer.deletions)))
        else:
            _pack(mk, lambda out: _feed_tar(whole or source, out))
        digest = sha256_file(tmp)
        final = dest_dir / f"{digest}{SUFFIX}"
        os.replace(tmp, final)
        below = tuple(layer.below) if layer is not None else None
        return Image(final, digest, final.stat().st_size, below)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BootseerError(f"no env image: {e}") from e
    finally:
        for scratch in (tmp, source):
            with contextlib.suppress(OSError):
                scratch.unlink()


def _pack(mk: list[str], feed: Callable[[IO[bytes]], None]) -> None:
    """Run mksquashfs (`mk`, reading a tar stream) with `feed` writing that stream; raises with its
    last line of error when it fails."""
    with subprocess.Popen(mk, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as m:
        assert m.stdin is not None and m.stderr is not None
        try:
            feed(m.stdin)
        except BrokenPipeError:  # mksquashfs stopped reading: its exit status and stderr say why
            pass
        finally:
            with contextlib.suppress(OSError):
                m.stdin.close()
        err = m.stderr.read()
        m.wait(timeout=BUILD_TIMEOUT_S)
    if m.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise BootseerError(f"mksquashfs failed: {lines[-1] if lines else f'exit {m.returncode}'}")


def whiteouts(deletions: list[str]) -> list[str]:
    """The paths that need a whiteout in a layer's image: each deleted path with no deleted ancestor
    (a whiteout on a directory hides all of it below; one under it would need it to be a directory)."""
    from ..envsnap.manifest import below_any

    deleted = set(deletions)
    return sorted(p for p in deleted if not below_any(p, deleted))


def _tree_archive(roots: list[str], exclude: list[str], dest: Path) -> None:
    """Every path of `tree_paths` written by the capture's no-follow writer into `dest` (snapshot format)."""
    from ..envsnap.manifest import scan
    from ..envsnap.segments import write_blob

    after = scan(roots, exclude)  # no-follow, from the roots' directory descriptors; `exclude` left out
    own = tuple(os.path.join(r, OWN_PREFIX) for r in roots)
    paths = sorted(p for p in after if not p.startswith(own))
    write_blob(dest, after, paths, {"roots": roots, "deletions": [], "image": FORMAT}, False)


END = 2 * 512  # the tar stream's end: two zero blocks, the last thing the snapshot's writer puts


def _feed_tar(source: Path, out: IO[bytes], whiteout: list[str] | None = None) -> None:
    """The tar stream of a snapshot-format blob (its zstd frames decompressed; the metadata trailer, a
    skippable frame, is skipped) written to `out`; with `whiteout`, an overlay whiteout (a character
    device 0/0) for each of those paths goes in before the stream's end."""
    import zstandard

    held = b""
    with open(source, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as r:
        while chunk := r.read(1 << 20):
            if whiteout is None:
                out.write(chunk)
                continue
            held += chunk
            out.write(held[:-END])
            held = held[-END:]
    if whiteout is None:
        return
    if held != b"\0" * END:
        raise BootseerError(f"snapshot {source.name}: its tar stream does not end as the snapshot's writer ends it")
    for path in whiteout:
        out.write(_whiteout_header(path))
    out.write(held)


def _whiteout_header(path: str) -> bytes:
    """The tar header of an overlay whiteout at `path` (a character device 0/0, as overlayfs and
    fuse-overlayfs read one in a lower layer)."""
    import tarfile

    ti = tarfile.TarInfo(path.lstrip("/"))
    ti.type, ti.devmajor, ti.devminor, ti.mode = tarfile.CHRTYPE, 0, 0, 0
    return ti.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape")


def pending_dir(cache: BlobCache) -> Path:
    """The node cache's pending area (publish.py): out of eviction until the upload adopts the image."""
    return cache.root / PENDING_DIR


def image_for_publish(
    roots: list[str],
    exclude: list[str],
    cache: BlobCache,
    warn: Callable[[str], None],
    whole: Path | None = None,
    layer: LayerSource | None = None,
) -> dict[str, Any]:
    """The ref field of a freshly built image of the roots (waiting in the pending area), or {} with a
    warning: a snapshot without an image is still restored, by extraction. `whole`, `layer`: see
    `build_image`."""
    try:
        return build_image(roots, exclude, pending_dir(cache), whole, layer).field()
    except BootseerError as e:
        warn(f"env: {e}; this snapshot will be extracted, not mounted")
        return {}


def upload_images(store: Store, cache: BlobCache, extra: dict[str, Any] | None) -> None:
    """Upload the image a ref is about to name (from the pending area) and adopt it into the node cache.
    An image that is no longer pending but in the store already is fine; one that is neither is an
    error (the ref would name a blob nobody can fetch)."""
    found = top_image(extra or {})  # a layer's own image: the ones below it are the parent's, stored
    if found is None:
        return
    digest, _ = found
    path = pending_dir(cache) / f"{digest}{SUFFIX}"
    if not path.exists():
        if cache.get(digest) is not None or store.has_blob(digest):
            return
        raise BootseerError(f"env image {digest[:12]} is neither pending nor stored")
    store.put_blob_file(path, digest, own=True)  # a local store links it: the cache adopts it next
    cache.adopt(path, digest, store)
