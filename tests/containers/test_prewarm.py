"""`bootseer prewarm` end to end with the real engine and registry, and its failure modes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootseer_cli.containers import engine
from bootseer_cli.containers.prewarm import WORKDIR
from bootseer_cli.store.core import open_store
from tests.support import images

from .conftest import Prewarmed, project


def prewarm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bootseer", "prewarm", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_prewarm_then_exec_in_the_image_hits(
    docker_client: Any, test_image: images.TestImage, prewarmed: Prewarmed
) -> None:
    out, store_dir, job = prewarmed.out, prewarmed.store_dir, prewarmed.job
    store_uri = store_dir.as_uri()
    assert out["image"]["digest"] == test_image.digest and out["image"]["pinned"] == test_image.pinned
    assert out["job_env"] == {"BOOTSEER_IMAGE": test_image.pinned}
    assert "Successfully installed tinypkg-1.0" in prewarmed.stderr  # the setup's output is shown
    store = open_store(store_uri)
    env_ref = store.read_ref("env", out["keys"]["env"])
    hot_ref = store.read_ref("hot", out["keys"]["image"])
    assert env_ref is not None and env_ref["blob"] == out["published"]["env"]["blob"]
    assert hot_ref is not None and hot_ref["blob"] == out["published"]["hot"]["blob"]

    # A node: a fresh container of the image, started the way the Kubernetes template starts it
    # (the image's entrypoint wrapper, BOOTSEER_IMAGE pinned, the job's files present).
    res = engine.run_container(
        docker_client,
        test_image.pinned,
        ["python3", "-c", "import tinypkg; print('tinypkg', tinypkg.VERSION)"],
        entrypoint=["/usr/local/bin/bootseer-entrypoint"],
        environment={
            "BOOTSEER_IMAGE": test_image.pinned,
            "BOOTSEER_STORE": store_uri,
            "BOOTSEER_JOB_ID": "node-check",
            "BOOTSEER_EXEC_AGENT": "0",
        },
        binds={str(store_dir): {"bind": str(store_dir), "mode": "rw"}, str(job): {"bind": WORKDIR, "mode": "ro"}},
        working_dir=WORKDIR,
    )
    assert res.exit_code == 0, res.output
    assert "tinypkg 1.0" in res.output  # restored, not installed: the setup never ran on the node
    assert "Successfully installed" not in res.output
    from tests.support.events_table import load_table

    rows = {r["stage"]: r for r in load_table(store, "node-check").to_pylist()}
    assert rows["env"]["cache"] == "hit" and rows["env"]["outcome"] == "restored", rows["env"]
    assert rows["image"]["cache"] == "hit", rows["image"]


@pytest.mark.integration
def test_failing_setup_and_probe_pass_their_status_on(test_image: images.TestImage, tmp_path: Path) -> None:
    cfg = project(tmp_path, setup=["echo boom-from-the-setup >&2; exit 7"])
    r = prewarm("--image", test_image.ref, "-c", str(cfg), "--store", (tmp_path / "s").as_uri())
    assert r.returncode == 7
    assert "boom-from-the-setup" in r.stderr  # streamed as it ran
    assert "the setup failed inside a container" in r.stderr and "Traceback" not in r.stderr

    cfg = project(tmp_path)
    r = prewarm(
        "--image", test_image.ref, "-c", str(cfg), "--store", (tmp_path / "s").as_uri(),
        "--probe", "python3 -c 'import sys; print(\"probe-says-hi\"); sys.exit(5)'",
    )  # fmt: skip
    assert r.returncode == 5, r.stderr
    assert "probe-says-hi" in r.stderr and "exit status 5" in r.stderr


def test_bad_arguments_fail_before_the_engine(tmp_path: Path) -> None:
    (tmp_path / "bootseer.toml").write_text("[env]\nsetup = []\n")
    r = prewarm("--image", "x:1", "-c", str(tmp_path / "bootseer.toml"))
    assert r.returncode == 2 and "nothing to prewarm" in r.stderr
    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["pip install -r missing.txt"]\n')
    r = prewarm("--image", "x:1", "-c", str(tmp_path / "bootseer.toml"), "--probe", "true")
    assert r.returncode == 2 and "missing.txt" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.integration
def test_prewarm_to_an_s3_store(test_image: images.TestImage, s3_server: Any, tmp_path: Path) -> None:
    """A non-file store: the containers use the host's network; this process uploads what they hand back."""
    cfg = project(tmp_path)
    uri = s3_server.uri("prewarm-s3")
    r = prewarm("--image", test_image.ref, "-c", str(cfg), "--store", uri, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert open_store(uri).read_ref("env", out["keys"]["env"])["blob"] == out["published"]["env"]["blob"]
    assert out["published"]["hot"] is None and out["notes"]  # no --probe: said so, nothing recorded


def test_what_the_containers_get(tmp_path: Path) -> None:
    """Settings go in; the store's credentials, facts of a run on this host and host paths do not."""
    from bootseer_cli.config import load
    from bootseer_cli.containers.prewarm import container_environment
    from bootseer_cli.settings import Settings

    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["true"]\nkey_env = ["TORCH_CUDA_ARCH_LIST"]\n')
    settings = Settings.from_config(load(tmp_path / "bootseer.toml", environ={}))
    host = {
        "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
        "AWS_ACCESS_KEY_ID": "k",
        "BOOTSEER_ENV_WAIT_S": "30",
        "BOOTSEER_RUN_DIR": "/host/run",
        "BOOTSEER_STORE_CACHE_DIR": "/host/cache",
        "BOOTSEER_IMAGE": "other@sha256:00",
        "HOME": "/root",
    }
    env = container_environment(settings, "r/x@sha256:11", "file:///s", host)
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0" and "AWS_ACCESS_KEY_ID" not in env
    assert env["BOOTSEER_ENV_WAIT_S"] == "30"
    assert env["BOOTSEER_IMAGE"] == "r/x@sha256:11" and env["BOOTSEER_STORE"] == "file:///s"
    assert env["BOOTSEER_CONFIG"] == f"{WORKDIR}/bootseer.toml" and env["BOOTSEER_EXEC_AGENT"] == "0"
    assert not {"BOOTSEER_RUN_DIR", "BOOTSEER_STORE_CACHE_DIR", "HOME"} & set(env)


@pytest.mark.integration
def test_prewarm_signs_on_the_host_and_the_key_stays_out(test_image: images.TestImage, tmp_path: Path) -> None:
    """With keys (issue 25): the containers publish into a store of their own, unsigned and without the
    key; this process signs the refs it computed into the CI domain, and no staging domain is made."""
    from bootseer_cli.config import load
    from bootseer_cli.settings import Settings
    from bootseer_cli.store.core import open_store_for
    from bootseer_cli.trust import keygen

    cfg = project(tmp_path)
    keygen(str(tmp_path / "ci.key"), str(tmp_path / "ci.pub"), "ci")
    with cfg.open("a") as f:
        f.write(f'\n[store]\ndomain = "ci"\n[trust]\nsigning_key = "{tmp_path}/ci.key"\n')
        f.write(f'verify_keys = ["{tmp_path}/ci.pub"]\n')
    store_dir = tmp_path / "store"
    r = prewarm("--image", test_image.ref, "-c", str(cfg), "--store", store_dir.as_uri(), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    settings = Settings.from_config(load(cfg, {("store", "uri"): store_dir.as_uri()}))
    ref = open_store_for(settings).read_ref("env", out["keys"]["env"])  # verified against ci.pub
    assert ref is not None and ref["blob"] == out["published"]["env"]["blob"]
    assert sorted(p.name for p in store_dir.iterdir()) == ["blobs", "ci"]  # no staging domain left behind


def test_a_local_store_runs_the_setup_offline_unless_network_is_asked(tmp_path: Path) -> None:
    """Issue 29: a local store meant network "none", and a setup that downloads failed in pip's words only."""
    from bootseer_cli.containers.prewarm import _Runner
    from bootseer_cli.errors import BootseerError

    image = engine.ResolvedImage(
        ref="img:1", digest="sha256:11", pinned="img@sha256:11", image_id="sha256:11", source="image id"
    )
    local = (tmp_path / "store").as_uri()

    def runner(uri: str, host_network: bool = False) -> _Runner:
        return _Runner.for_store(None, image, {}, uri, [], lambda line: None, host_network)  # type: ignore[arg-type]

    assert runner(local).network == "none"
    assert runner(local, host_network=True).network == "host"
    assert runner("s3://bucket/p").network == "host"

    for net, said in (("none", True), ("host", False)):
        run = runner(local, host_network=net == "host")
        out = "ERROR: No matching distribution found for x\n"
        run._start = lambda step, command, echo, out=out, **io: engine.RunResult(1, out)  # type: ignore[method-assign]
        with pytest.raises(BootseerError) as e:
            run("setup", ["bootseer", "exec", "--", "true"], "the setup")
        msg = str(e.value)
        assert "\n" not in msg and "No matching distribution" in msg
        assert ("no network because the store is local" in msg and "--network" in msg) is said, msg


def test_prewarm_has_a_network_option() -> None:
    import sys

    r = subprocess.run([sys.executable, "-m", "bootseer_cli", "prewarm", "--help"], capture_output=True, text=True)
    assert "--network" in r.stdout
