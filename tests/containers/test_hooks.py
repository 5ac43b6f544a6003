"""The hooks, run for real: the Kubernetes init container and the Slurm prolog warm a node cache from a
store that `bootseer prewarm` filled, and the start then restores from that cache, not the store."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootseer_cli.containers import engine
from bootseer_cli.store.cache import BlobCache
from bootseer_cli.store.core import open_store
from bootseer_cli.templates import render
from bootseer_cli.trust import default_domain
from tests.support import images
from tests.support.events_table import load_table

from .conftest import Prewarmed

REPO = Path(__file__).resolve().parents[2]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}


@pytest.mark.integration
def test_kubernetes_init_container_then_training_container(
    docker_client: Any, test_image: images.TestImage, prewarmed: Prewarmed, tmp_path: Path
) -> None:
    """The Job template's two containers, as the kubelet would run them (volumes as bind mounts). The pods
    read CI's domain, verified with its public key (the ConfigMap): here the pre-warm's refs signed by a CI key."""
    from bootseer_cli.trust import Trust, keygen, load_signer

    store_dir = tmp_path / "store"
    shutil.copytree(prewarmed.store_dir, store_dir)
    store_uri = store_dir.as_uri()
    keys = tmp_path / "keys"
    keys.mkdir()
    keygen(str(tmp_path / "ci.key"), str(keys / "ci.pub"), "ci")
    ci = open_store(store_uri, Trust("ci", signer=load_signer(str(tmp_path / "ci.key"))))
    for kind in ("env", "hot"):
        key = prewarmed.out["keys"]["image" if kind == "hot" else "env"]
        ref = open_store(prewarmed.store_dir.as_uri()).read_ref(kind, key)
        assert ref is not None, kind
        ci.write_ref(kind, key, ref)
    _, job = yaml.safe_load_all(render("k8s-job.yaml", {"IMAGE": test_image.pinned, "STORE": store_uri}))
    pod = job["spec"]["template"]["spec"]
    (init_c,) = pod["initContainers"]
    (train,) = pod["containers"]
    cache_vol = tmp_path / "emptydir"
    cache_vol.mkdir()
    volumes = {"bootseer-cache": str(cache_vol), "bootseer-config": str(prewarmed.job)}
    volumes["bootseer-verify-keys"] = str(keys)

    def binds(c: dict[str, Any]) -> dict[str, dict[str, str]]:
        out = {str(store_dir): {"bind": str(store_dir), "mode": "rw"}}
        for m in c["volumeMounts"]:
            if m["name"] in volumes:
                out[volumes[m["name"]]] = {"bind": m["mountPath"], "mode": "rw"}
        return out

    res = engine.run_container(
        docker_client, init_c["image"], init_c["command"], environment=_env(init_c), binds=binds(init_c)
    )
    assert res.exit_code == 0, res.output
    cache = BlobCache(cache_vol / "blobs", 1 << 30)
    assert cache.get(prewarmed.out["published"]["env"]["blob"]) is not None
    assert cache.get(prewarmed.out["published"]["hot"]["blob"]) is not None

    env = _env(train) | {"BOOTSEER_EXEC_AGENT": "0", "BOOTSEER_JOB_ID": "k8s-check"}
    res = engine.run_container(
        docker_client,
        train["image"],
        [*train["command"], "python3", "-c", "import tinypkg; print('tinypkg', tinypkg.VERSION)"],
        environment=env,
        binds=binds(train),
        working_dir="/etc/bootseer",
    )
    assert res.exit_code == 0, res.output
    assert "tinypkg 1.0" in res.output
    rows = {r["stage"]: r for r in load_table(open_store(store_uri), "k8s-check").to_pylist()}
    assert rows["env"]["cache"] == "hit" and rows["env"]["bytes_from_store"] == 0, rows["env"]  # from the volume
    assert rows["image"]["cache"] == "hit", rows["image"]


@pytest.mark.integration
def test_init_script_never_blocks_the_pod(docker_client: Any, test_image: images.TestImage, tmp_path: Path) -> None:
    env = {
        "BOOTSEER_IMAGE": test_image.pinned,
        "BOOTSEER_STORE": "s3://nobucket/x?endpoint_override=127.0.0.1:9&scheme=http&connect_timeout=1",
        "BOOTSEER_WARM_DIR": "/bootseer-cache",
        "BOOTSEER_PREFETCH_TIMEOUT": "60",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    res = engine.run_container(
        docker_client, test_image.pinned, ["/bin/sh", "/usr/local/bin/bootseer-k8s-init"], environment=env
    )
    assert res.exit_code == 0, res.output
    assert "bootseer-init: warning: prefetch ended with status" in res.output


@pytest.mark.integration
def test_entrypoint_bypass(docker_client: Any, test_image: images.TestImage) -> None:
    cmd = ["python3", "-c", "import os; print('direct', os.environ.get('BOOTSEER_RUN_ID', '-'))"]
    res = engine.run_container(
        docker_client, test_image.pinned, cmd, entrypoint=["/usr/local/bin/bootseer-entrypoint"],
        environment={"BOOTSEER_DISABLE": "1", "BOOTSEER_ENV_SETUP": "false"},
    )  # fmt: skip
    assert res.exit_code == 0 and "direct -" in res.output and "bootseer:" not in res.output
    res = engine.run_container(docker_client, test_image.pinned, [], entrypoint=["/usr/local/bin/bootseer-entrypoint"])
    assert res.exit_code == 2 and "no command given" in res.output


def _prolog(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "SLURM_"))}
    return subprocess.run(
        ["sh", str(REPO / "hooks/slurm-prolog.sh")], env=base | env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.integration
def test_slurm_prolog_fills_the_node_cache(prewarmed: Prewarmed, tmp_path: Path) -> None:
    node_cache = tmp_path / "node-cache"
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "trainer", "SLURM_JOB_UID": str(os.getuid())}
    site = tmp_path / "prolog.env"
    # The site's settings, as KEY=VALUE lines (root 0600): the store and the domain the pre-warm published in
    # (else the prolog reads the job user's domain): the site decides, not the job's config.
    site.write_text(
        f"BOOTSEER_STORE={prewarmed.store_dir.as_uri()}\nBOOTSEER_NODE_CACHE={node_cache}\n"
        f"BOOTSEER_STORE_DOMAIN={default_domain()}\n"
    )
    site.chmod(0o600)
    # The prolog sees no job environment: the job's bootseer.toml pins the image, as the docs say.
    job = tmp_path / "job"
    shutil.copytree(prewarmed.job, job)
    text = (job / "bootseer.toml").read_text()
    pinned = prewarmed.out["image"]["pinned"]
    (job / "bootseer.toml").write_text(text.replace("[image]\n", f'[image]\nref = "{pinned}"\n'))
    r = _prolog(slurm | {"BOOTSEER_PROLOG_ENV": str(site), "BOOTSEER_CONFIG": str(job / "bootseer.toml")})
    assert r.returncode == 0, r.stderr
    cache = BlobCache(node_cache / "trainer", 1 << 30)
    for kind in ("env", "hot"):
        assert cache.get(prewarmed.out["published"][kind]["blob"]) is not None, r.stdout + r.stderr

    # No config for the job, and an unreachable store: a warning, exit 0 (a failing prolog drains the node).
    r = _prolog(slurm | {"BOOTSEER_PROLOG_ENV": "/nonexistent"})
    assert r.returncode == 0 and "no bootseer.toml for this job" in r.stderr
    r = _prolog(
        slurm
        | {
            "BOOTSEER_PROLOG_ENV": "/nonexistent",
            "BOOTSEER_CONFIG": str(prewarmed.job / "bootseer.toml"),
            "BOOTSEER_IMAGE": prewarmed.out["image"]["pinned"],
            "BOOTSEER_STORE": "s3://nobucket/x?endpoint_override=127.0.0.1:9&scheme=http&connect_timeout=1",
            "BOOTSEER_NODE_CACHE": str(tmp_path / "nc2"),
            "BOOTSEER_PREFETCH_TIMEOUT": "60",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    assert r.returncode == 0 and "prefetch ended with status" in r.stderr
