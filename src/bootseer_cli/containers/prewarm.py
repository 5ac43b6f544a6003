"""`bootseer prewarm`: build the env snapshot and the hot-block record of an image before any GPU waits.

The flow runs bootseer *inside* containers of the image, through the same code paths a node takes
at run time, so what is published is exactly what a node will look for:

1. resolve the image's digest on the engine (pulling it if needed) and compute the keys here, with
   `[image] ref` pinned to that digest: the same keys a node computes with `BOOTSEER_IMAGE` set;
2. container 1: `bootseer exec --skip image,checkpoint -- true` with the config and the files the
   setup names copied in: on a miss the env stage runs the setup, captures and publishes;
3. container 2 (fresh, same image): `bootseer exec --skip image,checkpoint -- bootseer hot record --
   PROBE`: the env stage restores the snapshot, then the probe's start is recorded and published;
4. this process takes back out of each container the one ref it computed the key of (the env key,
   the image's hot key) and the blob it names, checks the blob's digest, uploads it with its own
   credentials and writes the ref, signed where it holds the key (`handback.py`).

The containers never see the store, its credentials or the signing key: each publishes into a store of
its own inside its filesystem, which nobody else can list or write, and the setup (every build script of
every dependency) cannot get a ref of its choosing signed. The network is "none" for a local store
(unless `--network` asks for the host's: a setup that downloads, `pip install -r requirements.txt`,
needs it) and the host's for any other, as before. Containers never use the default bridge.
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
from .handback import STAGE_DOMAIN, Handback, stage_uri

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

    from ..keys import Keys
    from ..settings import Settings
    from ..store.core import Store

WORKDIR = "/bootseer/work"  # where the config and the setup's files are copied in the container
# Host variables handed to the containers: bootseer's own settings, never the store's (its URI and
# credentials), the trust's (the key), the swarm's or a checkpoint target's (URIs that may carry keys).
_PASS_PREFIXES = ("BOOTSEER_",)
_NOT_PASSED = {"BOOTSEER_CONFIG", "BOOTSEER_IMAGE", "BOOTSEER_EXEC_TIME", "BOOTSEER_READ_CREDENTIALS"}
_NOT_PASSED_PREFIXES = (
    "BOOTSEER_RUN_", "BOOTSEER_CKPT_",  # facts of a run on this host, not settings
    "BOOTSEER_STORE", "BOOTSEER_TRUST_", "BOOTSEER_P2P_", "BOOTSEER_CHECKPOINT_",
)  # fmt: skip


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
    """The containers' environment: the host's bootseer settings, the key_env variables, the pinned image
    and the container's own store (`store_uri`, its stage); never the real store, its credentials, the
    signing key, or facts of a run on this host."""
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
            "BOOTSEER_STORE_DOMAIN": STAGE_DOMAIN,
            "BOOTSEER_TRUST_VERIFY": "off",  # its own stage, which only it and this process write
            "BOOTSEER_TRUST_SIGNING_KEY": "",  # over the config file's (a host path, never in a container)
            "BOOTSEER_TRUST_VERIFY_KEYS": "",
            "BOOTSEER_TRUST_READ_FROM": "",
            "BOOTSEER_P2P_ENABLED": "0",
            "BOOTSEER_EXEC_AGENT": "0",  # the container ends with its command: upload events inline
            # The probe's launcher is `bootseer hot record`, which publishes into the stage.
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
    from ..store.core import open_store_for

    environ = dict(os.environ) if environ is None else environ
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    probe_argv = _probe_argv(settings, probe)
    files = setup_files(settings)  # bad config fails before the engine is asked anything
    store = open_store_for(settings)
    client = connect()
    back = Handback()
    try:
        removed = remove_leftovers(client, warn=lambda msg: say(f"bootseer: warning: {msg}"))
        for name in removed:
            say(f"bootseer: removed container {name} left behind by an interrupted prewarm")
        image = resolve_image(client, image_ref)
        keys = keys_for(settings, image.pinned)
        out = Published(image=image, image_key=keys.image.digest, env_key=None, removed_leftovers=removed)
        say(f"bootseer: image {image_ref} is {image.pinned} ({image.source})")
        env = container_environment(settings, image.pinned, stage_uri(), environ)
        run = _Runner.for_store(client, image, env, store.uri, files, say, host_network)
        if settings.env.setup:
            _publish_env(run, store, back, run.env_key(), out, say)
        if probe_argv:
            _record_probe(run, store, back, keys, out, str(probe), probe_argv, with_setup=bool(settings.env.setup))
        else:
            out.notes.append("no --probe: the first start of a job records the hot blocks instead")
        return out
    finally:
        back.close()
        client.close()


def _probe_argv(settings: Settings, probe: str | None) -> list[str]:
    """The probe's argv; a prewarm with neither a setup nor a probe is a usage error, found before any engine."""
    probe_argv = shlex.split(probe) if probe else []
    if probe and not probe_argv:
        raise ConfigError("--probe is empty")
    if not settings.env.setup and not probe_argv:
        raise ConfigError("nothing to prewarm: the config has no [env] setup and no --probe was given")
    return probe_argv


def _publish_env(
    run: _Runner, store: Store, back: Handback, env_key: str, out: Published, say: Callable[[str], None]
) -> None:
    """Container 1: `bootseer exec` runs the setup (on a miss) into its stage; this process takes back the
    ref of the key it derived and its blob, uploads and signs them. A snapshot the store holds already is
    seeded into the container instead, whose restore is then the check."""
    out.env_key = env_key
    there = store.read_ref("env", env_key)
    out.env_was_there = there is not None
    if there is not None:
        say(f"bootseer: the store already holds the env snapshot for {env_key[:16]}; checking it")
        back.add(store, "env", env_key, there)
    cmd = ["bootseer", "exec", "--skip", "image,checkpoint", "--", "true"]
    take = None if there else (lambda c: back.take(c, "env", env_key))
    run("setup", cmd, "the setup", seed=back.seed_archive("env", env_key), after=take)
    if there is not None:
        out.env_ref = there
        return
    if ("env", env_key) not in back.refs:
        raise BootseerError(
            f"the setup ran in the container but no env snapshot was published under {env_key[:16]} "
            f"(its output is above); `bootseer keys` inside the image shows the key it computed"
        )
    out.env_ref = back.publish(store, "env", env_key)


def _record_probe(
    run: _Runner,
    store: Store,
    back: Handback,
    keys: Keys,
    out: Published,
    probe: str,
    probe_argv: list[str],
    *,
    with_setup: bool,
) -> None:
    """Container 2: the env stage restores the snapshot (seeded), then the probe's start is recorded into
    the stage; this process takes back the hot ref of the image's key and its blob, uploads and signs them."""
    inner = ["bootseer", "hot", "record", "--", *probe_argv]
    cmd = ["bootseer", "exec", "--skip", "image,checkpoint", "--", *inner] if with_setup else inner
    seed = back.seed_archive("env", out.env_key) if with_setup and out.env_key else None
    run("probe", cmd, f"the probe {probe!r}", seed=seed, after=lambda c: back.take(c, "hot", keys.image.digest))
    if ("hot", keys.image.digest) not in back.refs:
        raise BootseerError(
            f"the probe ran but no hot-block record was published under {keys.image.digest[:16]} (its output is above)"
        )
    out.hot_ref = back.publish(store, "hot", keys.image.digest)


class _Runner:
    """Runs one prewarm step in a fresh container and turns a failure into the step's error."""

    def __init__(
        self,
        client: DockerClient,
        image: ResolvedImage,
        env: dict[str, str],
        archive: bytes | None,
        network: str,
        say: Callable[[str], None],
    ) -> None:
        self.client, self.image, self.env = client, image, env
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
        """No network at all for a file:// store (unless `host_network`); the host's for any other (a
        setup that downloads worked so before the containers stopped reaching the store themselves).
        The setup's files go in as one archive unpacked before each start."""
        network = "host" if host_network or _file_store_dir(store_uri) is None else "none"
        archive = tar_of([(dest, src, 0o644) for dest, src in files]) if files else None
        return cls(client, image, env, archive, network, say)

    def __call__(
        self,
        step: str,
        command: list[str],
        what: str,
        seed: Path | None = None,
        after: Callable[[Any], None] | None = None,
    ) -> None:
        """Run `command` with `seed` unpacked into the container first, and `after` reading what it made."""
        self.say(f"bootseer: prewarm {step}: {shlex.join(command)}")
        res = self._run(step, command, seed=seed, after=after)
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

    def _run(
        self,
        step: str,
        command: list[str],
        echo: bool = True,
        seed: Path | None = None,
        after: Callable[[Container], None] | None = None,
    ) -> RunResult:
        try:
            return self._start(step, command, echo, seed=seed, after=after)
        except BootseerError as e:
            if e.exit_code == 127 and command[0] == "bootseer":
                raise BootseerError(
                    f"bootseer is not installed in {self.image.ref} (install it in the image: "
                    "bootseer init --template Dockerfile.bootseer)",
                    127,
                ) from None
            raise

    def _start(
        self,
        step: str,
        command: list[str],
        echo: bool,
        *,
        seed: Path | None,
        after: Callable[[Container], None] | None,
    ) -> RunResult:
        return run_container(
            self.client,
            self.image.pinned,
            command,
            environment=self.env,
            files=self.archive,
            network_mode=self.network,
            working_dir=WORKDIR,
            name_hint=step,
            echo=(lambda line: self.say(f"  {line}")) if echo else None,
            seed=seed,
            after=after,
        )
