"""`bootseer prewarm`: build the env snapshot and the hot-block record of an image before any GPU waits.

The flow runs bootseer *inside* containers of the image, through the same code paths a node takes
at run time, so what is published is exactly what a node will look for:

1. resolve the image's digest on the engine (pulling it if needed) and compute the keys here, with
   `[image] ref` pinned to that digest: the same keys a node computes with `BOOTSEER_IMAGE` set;
2. container 1: `bootseer exec --skip image,checkpoint -- true` with the config and the files the
   setup names copied in: on a miss the env stage runs the setup, captures and publishes;
3. container 2 (fresh, same image): `bootseer exec --skip image,checkpoint -- bootseer hot record --
   PROBE`: the env stage restores the snapshot, then the probe's start is recorded and published;
4. check from here that the store holds both refs under the keys computed in step 1.

A file:// store is bind-mounted at the same path (network "none", unless `--network` asks for the
host's: a setup that downloads, `pip install -r requirements.txt`, needs it); any other store is reached
over the host's network ("host"). Containers never use the default bridge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from ..errors import BootseerError, ConfigError
from .engine import ResolvedImage, RunResult, connect, remove_leftovers, resolve_image, run_container, tar_of

if TYPE_CHECKING:
    from docker import DockerClient

    from ..keys import Keys
    from ..settings import Settings
    from ..store import Store

WORKDIR = "/bootseer/work"  # where the config and the setup's files are copied in the container
# Host variables handed to the containers: the store's credentials and bootseer's own settings.
_PASS_PREFIXES = ("AWS_", "BOOTSEER_", "HDFS_", "HADOOP_", "GOOGLE_")
_NOT_PASSED = {"BOOTSEER_CONFIG", "BOOTSEER_STORE", "BOOTSEER_IMAGE", "BOOTSEER_STORE_CACHE_DIR", "BOOTSEER_EXEC_TIME"}
_NOT_PASSED_PREFIXES = ("BOOTSEER_RUN_", "BOOTSEER_CKPT_")  # facts of a run on this host, not settings


@dataclass
class Published:
    """What a prewarm resolved and published: `bootseer prewarm --json` prints `as_dict()`."""

    image: ResolvedImage
    image_key: str
    env_key: str | None
    env_ref: dict[str, Any] | None = None
    hot_ref: dict[str, Any] | None = None
    env_was_there: bool = False
    removed_leftovers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "image": {
                "ref": self.image.ref,
                "digest": self.image.digest,
                "pinned": self.image.pinned,
                "id": self.image.image_id,
                "source": self.image.source,
            },
            "keys": {"image": self.image_key, "env": self.env_key},
            "published": {"env": self.env_ref, "hot": self.hot_ref},
            "env_was_there": self.env_was_there,
            "removed_leftovers": self.removed_leftovers,
            "notes": self.notes,
            "job_env": {"BOOTSEER_IMAGE": self.image.pinned},
        }


def pinned_settings(settings: Settings, pinned: str) -> Settings:
    """These settings with `[image] ref` set to the pinned reference (what BOOTSEER_IMAGE does in a job)."""
    return dataclasses.replace(settings, image=dataclasses.replace(settings.image, ref=pinned))


def keys_for(settings: Settings, pinned: str) -> Keys:
    """The keys a node computes for these settings inside a container of the pinned image."""
    from .. import identity

    return identity.keys_for(pinned_settings(settings, pinned))


def setup_files(settings: Settings) -> list[tuple[str, Path]]:
    """(path in the container, path here) for the config file, every file the setup names and every
    file those include (`-r base.txt`: where pip inside will look for it, relative to its includer)."""
    from ..identity import setup_files as named_files
    from ..keys import env_file_names

    out: list[tuple[str, Path]] = []
    if settings.config_path is not None:
        out.append((f"{WORKDIR}/{settings.config_path.name}", settings.config_path))
    for chain, (src, _) in named_files(env_file_names(settings.env), settings.env.base_dir).items():
        first, *included = chain.split(" > ")  # `requirements.txt > base.txt`: base.txt beside its includer
        dest = first if os.path.isabs(first) else posixpath.join(WORKDIR, first)
        for name in included:
            dest = name if os.path.isabs(name) else posixpath.join(posixpath.dirname(dest), name)
        out.append((posixpath.normpath(dest), src))
    return out


def _file_store_dir(uri: str) -> str | None:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else None


def container_environment(
    settings: Settings, pinned: str, store_uri: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """The containers' environment: the host's store credentials and bootseer settings, the key_env
    variables, and the pinned image and store; never facts of a run on this host."""
    env = {
        k: v
        for k, v in environ.items()
        if k.startswith(_PASS_PREFIXES) and k not in _NOT_PASSED and not k.startswith(_NOT_PASSED_PREFIXES)
    }
    for name in settings.env.key_env:  # part of the env key: must be the same inside
        if name in environ:
            env[name] = environ[name]
    env.update(
        {
            "BOOTSEER_IMAGE": pinned,
            "BOOTSEER_STORE": store_uri,
            "BOOTSEER_EXEC_AGENT": "0",  # the container ends with its command: upload events inline
            # The probe's launcher is `bootseer hot record`, which publishes: it needs the store.
            "BOOTSEER_EXEC_PASS_STORE_CREDENTIALS": "1",
            "BOOTSEER_EXEC_SKIP": "",
        }
    )
    if settings.config_path is not None:
        env["BOOTSEER_CONFIG"] = f"{WORKDIR}/{settings.config_path.name}"
    return env


def _tail(text: str, n: int = 5) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-n:])


def prewarm(
    settings: Settings,
    image_ref: str,
    probe: str | None = None,
    echo: Callable[[str], None] | None = None,
    environ: Mapping[str, str] | None = None,
    host_network: bool = False,
) -> Published:
    """The whole CI pre-warm of one image; raises BootseerError with the failing step's exit code."""
    from ..store import open_store_for

    environ = dict(os.environ) if environ is None else environ
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    probe_argv = _probe_argv(settings, probe)
    files = setup_files(settings)  # bad config fails before the engine is asked anything
    store = open_store_for(settings)
    client = connect()
    try:
        removed = remove_leftovers(client, warn=lambda msg: say(f"bootseer: warning: {msg}"))
        for name in removed:
            say(f"bootseer: removed container {name} left behind by an interrupted prewarm")
        image = resolve_image(client, image_ref)
        keys = keys_for(settings, image.pinned)
        out = Published(image=image, image_key=keys.image.digest, env_key=None, removed_leftovers=removed)
        say(f"bootseer: image {image_ref} is {image.pinned} ({image.source})")
        # The containers reach the store with its credentials through their environment only.
        env = container_environment(settings, image.pinned, store.uri_with_credentials(), environ)
        staging = _staging(store, env)
        run = _Runner.for_store(client, image, env, store.uri_with_credentials(), files, say, host_network)
        try:
            if settings.env.setup:
                _publish_env(run, staging, run.env_key(), out, say)
            if probe_argv:
                _record_probe(run, staging, keys, out, str(probe), probe_argv, with_setup=bool(settings.env.setup))
            else:
                out.notes.append("no --probe: the first start of a job records the hot blocks instead")
            if staging is not store:
                _sign_staged(staging, store, say)
        finally:
            if staging is not store:
                _drop_domain(staging)
        return out
    finally:
        client.close()


def _staging(store: Store, env: dict[str, str]) -> Store:
    """Where the containers publish. With keys in use, the key never enters a container (the setup runs
    whatever its packages' build scripts do): the containers publish unsigned into a private staging
    domain, and this process signs what they made into the real one (`_sign_staged`)."""
    if store.trust.signer is None and not store.trust.required:
        return store
    import uuid

    name = f"prewarm-{uuid.uuid4().hex[:16]}"
    env.update(
        {
            "BOOTSEER_STORE_DOMAIN": name,
            "BOOTSEER_TRUST_VERIFY": "off",
            "BOOTSEER_TRUST_SIGNING_KEY": "",
            "BOOTSEER_TRUST_VERIFY_KEYS": "",
            "BOOTSEER_TRUST_READ_FROM": "",
        }
    )
    return store.in_domain(name)


def _sign_staged(staging: Store, store: Store, say: Callable[[str], None]) -> None:
    """Every ref the containers published, signed into this store's domain (blobs are shared already)."""
    n = 0
    for f in staging.list_info("refs"):
        parts = f.rel.split("/")
        if len(parts) != 3 or not parts[2].endswith(".json"):
            continue
        doc = staging.read_ref(parts[1], parts[2].removesuffix(".json"))
        if doc is not None:
            store.write_ref(parts[1], parts[2].removesuffix(".json"), doc)
            n += 1
    say(f"bootseer: signed {n} ref(s) into domain {store.domain}")


def _drop_domain(view: Store) -> None:
    """Remove a staging domain, whatever it holds (best effort: it is private and unread)."""
    import contextlib

    from ..errors import StoreError

    with contextlib.suppress(StoreError, OSError):
        for f in view.list_info(""):
            view.delete(f.rel)
        view.delete_dir("")


def _probe_argv(settings: Settings, probe: str | None) -> list[str]:
    """The probe's argv; a prewarm with neither a setup nor a probe is a usage error, found before any engine."""
    probe_argv = shlex.split(probe) if probe else []
    if probe and not probe_argv:
        raise ConfigError("--probe is empty")
    if not settings.env.setup and not probe_argv:
        raise ConfigError("nothing to prewarm: the config has no [env] setup and no --probe was given")
    return probe_argv


def _publish_env(run: _Runner, store: Store, env_key: str, out: Published, say: Callable[[str], None]) -> None:
    """Container 1: `bootseer exec` runs the setup (on a miss) and publishes; then check the ref is there."""
    out.env_key = env_key
    out.env_was_there = store.read_ref("env", env_key) is not None
    if out.env_was_there:
        say(f"bootseer: the store already holds the env snapshot for {env_key[:16]}; checking it")
    run("setup", ["bootseer", "exec", "--skip", "image,checkpoint", "--", "true"], "the setup")
    out.env_ref = store.read_ref("env", env_key)
    if out.env_ref is None:
        raise BootseerError(
            f"the setup ran in the container but no env snapshot was published under {env_key[:16]} "
            f"(its output is above); `bootseer keys` inside the image shows the key it computed"
        )


def _record_probe(
    run: _Runner, store: Store, keys: Keys, out: Published, probe: str, probe_argv: list[str], *, with_setup: bool
) -> None:
    """Container 2: the env stage restores the snapshot, then the probe's start is recorded and published."""
    inner = ["bootseer", "hot", "record", "--", *probe_argv]
    cmd = ["bootseer", "exec", "--skip", "image,checkpoint", "--", *inner] if with_setup else inner
    run("probe", cmd, f"the probe {probe!r}")
    out.hot_ref = store.read_ref("hot", keys.image.digest)
    if out.hot_ref is None:
        raise BootseerError(
            f"the probe ran but no hot-block record was published under {keys.image.digest[:16]} (its output is above)"
        )


class _Runner:
    """Runs one prewarm step in a fresh container and turns a failure into the step's error."""

    def __init__(
        self,
        client: DockerClient,
        image: ResolvedImage,
        env: dict[str, str],
        binds: dict[str, dict[str, str]],
        archive: bytes | None,
        network: str,
        say: Callable[[str], None],
    ) -> None:
        self.client, self.image, self.env, self.binds = client, image, env, binds
        self.archive, self.network, self.say = archive, network, say

    @classmethod
    def for_store(
        cls,
        client: DockerClient,
        image: ResolvedImage,
        env: dict[str, str],
        store_uri: str,
        files: list[tuple[str, Path]],
        say: Callable[[str], None],
        host_network: bool = False,
    ) -> _Runner:
        """A file:// store is bind-mounted at its own path (no network at all, unless `host_network`);
        any other is reached over the host's network. The setup's files go in as one archive unpacked
        before each start."""
        store_dir = _file_store_dir(store_uri)
        binds: dict[str, dict[str, str]] = {}
        network = "host"
        if store_dir is not None:
            Path(store_dir).mkdir(parents=True, exist_ok=True)
            binds[store_dir] = {"bind": store_dir, "mode": "rw"}
            network = "host" if host_network else "none"
        archive = tar_of([(dest, src, 0o644) for dest, src in files]) if files else None
        return cls(client, image, env, binds, archive, network, say)

    def __call__(self, step: str, command: list[str], what: str) -> None:
        self.say(f"bootseer: prewarm {step}: {shlex.join(command)}")
        res = self._run(step, command)
        if res.exit_code == 0:
            return
        # Without a network a setup that downloads fails in its own words (pip's retries), which never
        # say that the container had none, nor why: the error line does.
        offline = (
            "; the container had no network because the store is local (`bootseer prewarm --network` "
            "runs it on the host's network)"
            if self.network == "none"
            else ""
        )
        raise BootseerError(
            f"{what} failed inside a container of {self.image.ref} with exit status {res.exit_code}: "
            f"{_tail(res.output, 3)}{offline}",
            res.exit_code,
        )

    def env_key(self) -> str:
        """The env key as a node of this image computes it (`bootseer keys --json` in a container).

        The key holds the env's roots as the node resolves them (the image's interpreter prefix, the
        container's working directory), which this host cannot know: the node's own answer is the key
        its starts will look up."""
        res = self._run("keys", ["bootseer", "keys", "--json"], echo=False)
        try:
            return str(json.loads(res.output[res.output.index("{") :])["env"]["digest"])
        except (ValueError, KeyError, TypeError):
            raise BootseerError(
                f"`bootseer keys --json` failed inside a container of {self.image.ref} "
                f"(exit status {res.exit_code}): {_tail(res.output, 3)}",
                res.exit_code or 1,
            ) from None

    def _run(self, step: str, command: list[str], echo: bool = True) -> RunResult:
        try:
            return self._start(step, command, echo)
        except BootseerError as e:
            if e.exit_code == 127 and command[0] == "bootseer":
                raise BootseerError(
                    f"bootseer is not installed in {self.image.ref} (install it in the image: "
                    "bootseer init --template Dockerfile.bootseer)",
                    127,
                ) from None
            raise

    def _start(self, step: str, command: list[str], echo: bool) -> RunResult:
        return run_container(
            self.client,
            self.image.pinned,
            command,
            environment=self.env,
            binds=self.binds,
            files=self.archive,
            network_mode=self.network,
            working_dir=WORKDIR,
            name_hint=step,
            echo=(lambda line: self.say(f"  {line}")) if echo else None,
        )
