"""Prewarm signs only what it computed (issue 45, item 1). The containers used to publish unsigned into a
`prewarm-<hex>/` domain of the shared store, with the store's write credentials, and the host then signed
every ref found there: a ref the setup (any dependency's build script) or a store writer put there came out
signed by CI. Now each container publishes into a store inside its own filesystem, without credentials or
key, and the host takes back only the env ref of the key it derived and the image's hot ref, with the
blobs they name checked by digest, and uploads and signs those itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.containers.conftest import docker_client, project, registry, test_image  # noqa: F401 - fixtures
from tests.support import images

FAKE = "ab" * 32
PLANT = (
    'd="${BOOTSEER_STORE#file://}/$BOOTSEER_STORE_DOMAIN/refs"; mkdir -p "$d/env" "$d/compile/k"; '
    f'echo \'{{"blob": "{FAKE}", "size": 1}}\' > "$d/env/planted.json"; '
    f'echo \'{{"blob": "{FAKE}", "size": 1}}\' > "$d/compile/k/planted.json"'
)
HOST_SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAHOSTONLY",
    "AWS_SECRET_ACCESS_KEY": "host-secret-never-in-a-container",
    "AWS_SHARED_CREDENTIALS_FILE": "/host/aws/credentials",
    "GOOGLE_APPLICATION_CREDENTIALS": "/host/gcs.json",
}


@pytest.mark.integration
def test_a_planted_ref_is_not_signed_and_the_setup_gets_no_credentials(
    test_image: images.TestImage,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    from bootseer_cli.trust import keygen

    cfg = project(tmp_path, setup=["env", PLANT, "pip install --no-index --no-deps -r requirements.txt"])
    keygen(str(tmp_path / "ci.key"), str(tmp_path / "ci.pub"), "ci")
    with cfg.open("a") as f:
        f.write(f'\n[store]\ndomain = "ci"\n[trust]\nsigning_key = "{tmp_path}/ci.key"\n')
        f.write(f'verify_keys = ["{tmp_path}/ci.pub"]\n')
    store_dir = tmp_path / "store"
    (store_dir / "prewarm-0123456789abcdef" / "refs" / "env").mkdir(parents=True)  # a store writer's plant
    (store_dir / "prewarm-0123456789abcdef" / "refs" / "env" / "writer.json").write_text(json.dumps({"blob": FAKE}))
    argv = ["bootseer", "prewarm", "--image", test_image.ref, "-c", str(cfg), "--store", store_dir.as_uri(), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **HOST_SECRETS})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    signed = sorted(str(p.relative_to(store_dir / "ci")) for p in (store_dir / "ci" / "refs").rglob("*.json"))
    assert signed == [f"refs/env/{out['keys']['env']}.json"], signed  # the one ref prewarm computed the key of
    assert not list(store_dir.rglob("planted.json"))
    # The setup's own view of its environment (its `env`, streamed into prewarm's output).
    dump = [line.strip() for line in r.stderr.splitlines() if "=" in line and line.strip()[:1].isupper()]
    names = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in dump}
    assert names.get("BOOTSEER_STORE") == "file:///bootseer/staging", dump
    assert not [n for n in names if n.startswith(("AWS_", "GOOGLE_"))], dump
    assert not names.get("BOOTSEER_TRUST_SIGNING_KEY") and not [v for v in names.values() if str(store_dir) in v]
    assert "host-secret-never-in-a-container" not in r.stderr


def test_the_containers_environment_holds_no_store_credential(tmp_path: Path) -> None:
    from bootseer_cli.config import load
    from bootseer_cli.containers.handback import stage_uri
    from bootseer_cli.containers.prewarm import container_environment
    from bootseer_cli.settings import Settings

    (tmp_path / "bootseer.toml").write_text('[env]\nsetup = ["true"]\n')
    settings = Settings.from_config(load(tmp_path / "bootseer.toml", environ={}))
    host = {
        **HOST_SECRETS,
        "BOOTSEER_STORE": "s3://KEY:SECRET@bucket/p",
        "BOOTSEER_TRUST_SIGNING_KEY": "/ci/key",
        "BOOTSEER_CHECKPOINT_TARGETS": "s3://KEY:SECRET@other/p",
        "BOOTSEER_ENV_WAIT_S": "30",
    }
    env = container_environment(settings, "r/x@sha256:11", stage_uri(), host)
    assert env["BOOTSEER_STORE"] == stage_uri() and env["BOOTSEER_ENV_WAIT_S"] == "30"
    assert env["BOOTSEER_TRUST_SIGNING_KEY"] == "" and "BOOTSEER_CHECKPOINT_TARGETS" not in env
    assert not [k for k in env if k.startswith(("AWS_", "GOOGLE_"))]
    assert "SECRET" not in json.dumps(env)
