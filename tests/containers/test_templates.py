"""Templates render with the user's values into files their tools accept; hooks are shellcheck clean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootseer_cli.templates import available, render

REPO = Path(__file__).resolve().parents[2]
MINE = [
    "Dockerfile.bootseer",
    "k8s-job.yaml",
    "slurm-job.sbatch",
    "github-actions-prewarm.yml",
    "gitlab-ci-prewarm.yml",
]
PINNED = "registry.example:5000/team/train@sha256:" + "ab" * 32
VALUES = {"IMAGE": PINNED, "STORE": "s3://bucket/bootseer?endpoint_override=10.0.0.1:9000", "BASE_IMAGE": "x:1"}


def init(tmp_path: Path, name: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = ["bootseer", "init", str(tmp_path / name), "--template", name]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


def test_listed_and_rendered_by_init(tmp_path: Path) -> None:
    listed = subprocess.run(["bootseer", "init", "--list"], capture_output=True, text=True, check=True).stdout
    for name in MINE:
        assert name in listed and name in available()
    r = init(tmp_path, "k8s-job.yaml", f"IMAGE={PINNED}", "STORE=file:///shared/bootseer", "NODES=4", "gpus=2")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "k8s-job.yaml").read_text()
    assert "{{" not in text and "completions: 4" in text and 'nvidia.com/gpu: "2"' in text
    r = init(tmp_path, "slurm-job.sbatch", f"IMAGE={PINNED}", "STORE=x")
    assert r.returncode == 0 and (tmp_path / "slurm-job.sbatch").stat().st_mode & 0o111 == 0  # not *.sh


def test_a_missing_value_is_named(tmp_path: Path) -> None:
    r = init(tmp_path, "k8s-job.yaml", "STORE=x")
    assert r.returncode == 2 and "needs --set IMAGE=VALUE" in r.stderr
    assert not (tmp_path / "k8s-job.yaml").exists()


def test_kubernetes_job_wiring() -> None:
    service, job = yaml.safe_load_all(render("k8s-job.yaml", VALUES))
    assert service["kind"] == "Service" and job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    (init_c,) = pod["initContainers"]
    (train,) = pod["containers"]
    for c in (init_c, train):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert c["image"] == PINNED and env["BOOTSEER_IMAGE"] == c["image"]  # pinned, and the key follows it
        assert env["BOOTSEER_STORE"] == VALUES["STORE"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs["AWS_SECRET_ACCESS_KEY"] == {"name": "bootseer-store-read", "key": "AWS_SECRET_ACCESS_KEY"}
        assert {"name": "bootseer-cache", "mountPath": "/bootseer-cache"} in c["volumeMounts"]
    assert train["command"] == ["bootseer", "exec", "--"] and train["args"][0] == "torchrun"
    assert init_c["command"][-1] == "/usr/local/bin/bootseer-k8s-init"
    # What the init script fills is what exec reads.
    init_env = {e["name"]: e.get("value") for e in init_c["env"]}
    train_env = {e["name"]: e.get("value") for e in train["env"]}
    assert train_env["BOOTSEER_STORE_CACHE_DIR"] == init_env["BOOTSEER_WARM_DIR"] + "/blobs"
    # One node identity per pod (two pods on one host are two nodes), not the host's name.
    node = next(e for e in train["env"] if e["name"] == "BOOTSEER_NODE")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # No privileged container: checkpoints are pulled, and the FUSE device plugin route is documented.
    text = render("k8s-job.yaml", VALUES)
    assert not any("privileged" in line.split("#")[0] for line in text.splitlines())  # no field, any value
    assert not any("privileged" in str(k).lower() for k in _keys(job))
    assert train_env["BOOTSEER_CHECKPOINT_MODE"] == "pull"
    assert "smarter-devices/fuse" in render("k8s-job.yaml", VALUES)


def _keys(data: object) -> list[object]:
    """Every mapping key in a parsed YAML document, recursively."""
    if isinstance(data, dict):
        return [k for key, v in data.items() for k in (key, *_keys(v))]
    return [k for item in data for k in _keys(item)] if isinstance(data, list) else []


def _secret_names(c: dict[str, Any]) -> set[str]:
    """The Secrets a container reads through env (envFrom and mounted Secret volumes are checked apart)."""
    refs = [e["valueFrom"]["secretKeyRef"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
    return {r["name"] for r in refs}


def test_kubernetes_pods_hold_no_key_and_no_write_credentials() -> None:
    """The pods read CI's domain with its public key and a read-only Secret; the signing key, the write
    credentials and a world-writable cache never reach them; the cache volume is the job's group's."""
    values = VALUES | {"UID": "1234", "GID": "5678", "DOMAIN": "team-ci"}
    text = render("k8s-job.yaml", values)
    _, job = yaml.safe_load_all(text)
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsUser": 1234, "runAsGroup": 5678, "fsGroup": 5678}
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    (keys_vol,) = [v for v in pod["volumes"] if v["name"] == "bootseer-verify-keys"]
    assert keys_vol["configMap"]["name"] == "bootseer-verify-keys"  # public keys: a ConfigMap
    for c in (*pod["initContainers"], *pod["containers"]):
        assert _secret_names(c) == {"bootseer-store-read"}, c["name"]
        assert not c.get("envFrom") and not secret_volumes & {m["name"] for m in c["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert not any("SIGNING_KEY" in name for name in env), env
        assert env["BOOTSEER_TRUST_READ_FROM"] == "team-ci"
        assert env["BOOTSEER_TRUST_VERIFY_KEYS"] == "/etc/bootseer-keys/team-ci.pub"
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["bootseer-verify-keys"]["mountPath"] == "/etc/bootseer-keys"
        assert mounts["bootseer-verify-keys"]["readOnly"] is True
        assert c["securityContext"] == {"allowPrivilegeEscalation": False}
    code = [line.split("#")[0] for line in text.splitlines()]
    assert not any(w in line for line in code for w in ("signing", ".key", "privileged"))
    # The header says how to make what the pods read, and that pods publish nothing others trust.
    header = text.split("apiVersion")[0]
    assert "kubectl create secret generic bootseer-store-read" in header
    assert "kubectl create configmap bootseer-verify-keys --from-file=team-ci.pub" in header
    assert "kubectl create configmap train-bootseer --from-file=bootseer.toml" in header
    assert "publish nothing others trust" in header and "sidecar" in header


def test_kubernetes_init_hook_makes_nothing_world_writable() -> None:
    hook = (REPO / "hooks" / "k8s-init.sh").read_text()
    assert "chmod" not in hook and "a+rw" not in hook
    assert "umask 002" in hook and "fsGroup" in hook


def _check_fields(data: object, kind: str, where: str) -> None:
    """Every key of `data` is a field of the Kubernetes client's model `kind`, recursively (typos fail)."""
    import kubernetes.client

    if kind.lower().startswith("list["):
        assert isinstance(data, list), where
        for i, item in enumerate(data):
            _check_fields(item, kind[5:-1], f"{where}[{i}]")
        return
    model = getattr(kubernetes.client, kind, None)
    if model is None:  # str, int, bool, object, Dict[str, str]: a scalar or a free-form map
        return
    assert isinstance(data, dict), where
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, value in data.items():
        assert key in by_json, f"{where}.{key} is not a field of {kind}"
        _check_fields(value, model.openapi_types[by_json[key]], f"{where}.{key}")


def test_kubernetes_objects_match_the_api_schema() -> None:
    """The rendered objects deserialize into the Kubernetes client's models with no unknown field."""
    import kubernetes.client

    for doc in yaml.safe_load_all(render("k8s-job.yaml", VALUES)):
        kind = {"Service": "V1Service", "Job": "V1Job"}[doc["kind"]]
        _check_fields(doc, kind, doc["kind"])
        obj = getattr(kubernetes.client, kind).from_dict(doc)  # the client's own validation: types, required
        assert obj.metadata.name == "train"
    with pytest.raises(AssertionError, match="is not a field of V1Container"):
        _check_fields({"containers": [{"name": "x", "imagePullSecret": "y"}]}, "V1PodSpec", "spec")


def test_github_workflow_keeps_secrets_out_of_scripts() -> None:
    gh = yaml.safe_load(render("github-actions-prewarm.yml", {"IMAGE": "registry.example/train"}))
    steps = gh["jobs"]["prewarm"]["steps"]
    for step in steps:
        assert "secrets." not in step.get("run", ""), step["run"]  # an inline ${{ secrets.X }} lands in the script
    login = next(s for s in steps if "docker login" in s.get("run", ""))
    assert login["env"]["REGISTRY_PASSWORD"] == "${{ secrets.REGISTRY_PASSWORD }}"


def test_ci_jobs_run_prewarm() -> None:
    gh = yaml.safe_load(render("github-actions-prewarm.yml", {"IMAGE": "registry.example/train"}))
    job = gh["jobs"]["prewarm"]
    assert job["env"]["IMAGE"] == "registry.example/train:${{ github.sha }}"  # GitHub's own ${{ }} kept
    step = next(s for s in job["steps"] if s.get("id") == "prewarm")
    assert 'bootseer prewarm --image "$IMAGE" --config bootseer.toml --probe "$PROBE" --json' in step["run"]
    gl = yaml.safe_load(render("gitlab-ci-prewarm.yml", {"IMAGE": "registry.example/train"}))["bootseer-prewarm"]
    assert any('bootseer prewarm --image "$IMAGE"' in line for line in gl["script"])
    assert gl["artifacts"]["reports"]["dotenv"] == "prewarm.env"
    assert gl["variables"]["IMAGE"] == "registry.example/train:$CI_COMMIT_SHA"


def test_slurm_script_is_shellcheck_clean(tmp_path: Path) -> None:
    script = tmp_path / "train.sbatch"
    script.write_text(render("slurm-job.sbatch", VALUES))
    subprocess.run(["bash", "-n", str(script)], check=True)
    r = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    text = script.read_text()
    assert f'export BOOTSEER_IMAGE="{PINNED}"' in text and "bootseer exec --" in text
    assert "#SBATCH --nodes=2" in text


def test_slurm_script_speaks_pyxis(tmp_path: Path) -> None:
    """Run the batch script with stand-ins for Slurm's srun/scontrol (no Slurm here) that record their argv:
    the image is in enroot's REGISTRY#IMAGE form and the job directory is mounted as the workdir."""
    bin_dir, job = tmp_path / "bin", tmp_path / "job dir"
    bin_dir.mkdir()
    job.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGV"\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "train.sbatch"
    script.write_text(render("slurm-job.sbatch", VALUES | {"KEYS_DIR": ""}))  # unsigned on purpose: no keys here
    argv_file = tmp_path / "argv"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SRUN_ARGV": str(argv_file), "SLURM_SUBMIT_DIR": str(job)}
    subprocess.run(["bash", str(script)], env=env | {"USER": "u"}, check=True, cwd=job)
    argv = argv_file.read_text().splitlines()
    assert "--container-image=registry.example:5000#team/train@sha256:" + "ab" * 32 in argv
    mounts = next(a for a in argv if a.startswith("--container-mounts="))
    assert f"{job}:{job}" in mounts.split("=", 1)[1].split(",")
    assert f"--container-workdir={job}" in argv
    assert argv[argv.index("--") + 1] == "torchrun"


@pytest.mark.parametrize("hook", sorted(p.name for p in (REPO / "hooks").glob("*.sh")))
def test_hooks_are_shellcheck_clean(hook: str) -> None:
    assert shutil.which("shellcheck"), "apt-get install shellcheck"
    r = subprocess.run(["shellcheck", "-s", "sh", str(REPO / "hooks" / hook)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert (REPO / "hooks" / hook).stat().st_mode & 0o111  # executable


def test_dockerfile_snippet_renders() -> None:
    text = render("Dockerfile.bootseer", {"BASE_IMAGE": "registry.example/train:1.0"})
    assert "\nFROM registry.example/train:1.0\nCOPY bootseer-dist /tmp/bootseer-dist\n" in text
    assert "python3 -m venv  /opt/bootseer" in text  # its own venv: a PEP 668 base refuses a system install
    # the wheel the user built, never `bootseer` from the package index (there is none there)
    assert "/opt/bootseer/bin/python -m pip install --no-cache-dir  /tmp/bootseer-dist/bootseer-*.whl" in text
    assert "ln -sf /opt/bootseer/bin/bootseer /usr/local/bin/bootseer" in text
    assert 'ENTRYPOINT ["/usr/local/bin/bootseer-entrypoint"]' in text


def test_wheel_ships_the_hooks(tmp_path: Path) -> None:
    """`pip install bootseer` carries the hooks: they are package data, not files of a checkout."""
    import sys
    import zipfile

    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("bootseer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for hook in ("entrypoint.sh", "k8s-init.sh", "slurm-prolog.sh"):
        assert f"bootseer_cli/templates/hooks/{hook}" in names


@pytest.mark.parametrize("hook", ["entrypoint.sh", "k8s-init.sh", "slurm-prolog.sh"])
def test_init_renders_the_hooks(tmp_path: Path, hook: str) -> None:
    dest = tmp_path / "bin" / "bootseer-hook"
    r = subprocess.run(["bootseer", "init", str(dest), "--template", hook], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert dest.stat().st_mode & 0o111 and dest.read_bytes() == (REPO / "hooks" / hook).read_bytes()
    subprocess.run(["bash", "-n", str(dest)], check=True)
    subprocess.run(["sh", "-n", str(dest)], check=True)


def test_dockerfile_installs_the_hooks_from_the_wheel() -> None:
    text = render("Dockerfile.bootseer", {"BASE_IMAGE": "x:1"})
    copies = [line for line in text.splitlines() if line.startswith("COPY")]
    assert copies == ["COPY bootseer-dist /tmp/bootseer-dist"]  # bootseer's wheel, nothing else from a checkout
    assert "bootseer init /usr/local/bin/bootseer-entrypoint --template entrypoint.sh" in text


def test_init_rejects_an_unknown_name(tmp_path: Path) -> None:
    r = init(tmp_path, "k8s-job.yaml", f"IMAGE={PINNED}", "STORE=x", "bogus=1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "has no BOGUS" in r.stderr and "IMAGE" in r.stderr and "NODES" in r.stderr  # what it does know
    assert not (tmp_path / "k8s-job.yaml").exists()


def test_init_list_describes_each_template() -> None:
    about = available()
    assert about["slurm-job.sbatch"].startswith("Slurm batch script")
    assert about["entrypoint.sh"].startswith("bootseer container entrypoint")
    assert not any(line.startswith("!") for line in about.values())


def test_init_creates_missing_folders(tmp_path: Path) -> None:
    dest = tmp_path / ".github" / "workflows" / "x.yml"
    r = subprocess.run(
        ["bootseer", "init", str(dest), "--template", "github-actions-prewarm.yml", "--set", "IMAGE=r/t"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(dest.read_text())["name"] == "bootseer prewarm"
    assert [p.name for p in dest.parent.iterdir()] == ["x.yml"]  # no temp file left behind


def _stub_bootseer(tmp_path: Path) -> tuple[Path, Path]:
    """A `bootseer` on PATH that writes the environment it was given (one NAME=VALUE per line) and exits 0."""
    bin_dir, dump = tmp_path / "bin", tmp_path / "env.dump"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "bootseer").write_text(f'#!/bin/sh\nenv > "{dump}"\n')  # the prolog clears the environment
    (bin_dir / "bootseer").chmod(0o755)
    return bin_dir, dump


def test_slurm_prolog_reads_its_site_file_literally(tmp_path: Path) -> None:
    """prolog.env is KEY=VALUE lines, never shell: an unquoted S3 URI keeps everything after its `&`, a `$(…)`
    is text, not a command; one pair of surrounding quotes is stripped; what is not KEY=VALUE is skipped."""
    bin_dir, dump = _stub_bootseer(tmp_path)
    ran = tmp_path / "ran"
    site = tmp_path / "prolog.env"
    site.write_text(
        "# the site's settings\n\n"
        "BOOTSEER_STORE=s3://b/p?a=1&b=2\n"
        "AWS_SECRET_ACCESS_KEY='se cret$HOME'\n"
        'export BOOTSEER_TRUST_SIGNING_KEY="/etc/bootseer/domain.key"\r\n'
        f"BOOTSEER_NODE_CACHE={tmp_path / 'nc'}\n"
        f"BOOTSEER_TEST_CMD=$(touch {ran})\n"
        "not a setting\n"
        "1BAD=x\n"
        "BOOTSEER_TEST_LAST=no newline at the end"
    )
    site.chmod(0o600)
    (tmp_path / "bootseer.toml").write_text("")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "ENV_DUMP": str(dump), "BOOTSEER_PROLOG_ENV": str(site),
        "BOOTSEER_CONFIG": str(tmp_path / "bootseer.toml"), "SLURM_JOB_ID": "7", "SLURM_JOB_USER": "u",
    }  # fmt: skip
    r = subprocess.run(["sh", str(REPO / "hooks" / "slurm-prolog.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert got["BOOTSEER_STORE"] == "s3://b/p?a=1&b=2"
    # The write credentials and the signing key stay with the prolog (issue 26): the prefetch gets neither.
    assert "AWS_SECRET_ACCESS_KEY" not in got and "BOOTSEER_TRUST_SIGNING_KEY" not in got
    assert got["BOOTSEER_TEST_CMD"] == f"$(touch {ran})" and not ran.exists()
    assert got["BOOTSEER_TEST_LAST"] == "no newline at the end"
    assert "1BAD" not in got and "not a setting" in r.stderr
    assert (tmp_path / "nc" / "u").is_dir()
    assert "readable by every user" not in r.stderr
    site.chmod(0o644)
    r = subprocess.run(["sh", str(REPO / "hooks" / "slurm-prolog.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "readable by every user" in r.stderr


def test_slurm_job_gets_public_keys_never_the_signing_key(tmp_path: Path) -> None:
    """The batch job (the user) gets the verify keys and a read-only credentials file, mounted into the
    container; it never names the prolog's key or its prolog.env."""
    keys, creds, job = tmp_path / "keys", tmp_path / "read-credentials", tmp_path / "job"
    keys.mkdir()
    job.mkdir()
    (keys / "ci.pub").write_text("bootseer-ed25519 AAAA ci\n")
    (keys / "site.pub").write_text("bootseer-ed25519 BBBB site\n")
    creds.write_text("[default]\naws_access_key_id = r\n")
    values = VALUES | {"KEYS_DIR": str(keys), "READ_CREDENTIALS": str(creds), "READ_FROM": "ci,site"}
    text = render("slurm-job.sbatch", values)
    code = [line.split("#")[0] for line in text.splitlines() if not line.startswith("#")]
    assert not any(w in line for line in code for w in ("SIGNING_KEY", "prolog.env", "domain.key", "AWS_SECRET"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = '#!/bin/sh\nenv > "$SRUN_ENV"\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGV"\n'
    (bin_dir / "srun").write_text(srun)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "train.sbatch"
    script.write_text(text)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "SRUN_ARGV": str(tmp_path / "argv"), "SRUN_ENV": str(tmp_path / "env"),
        "SLURM_SUBMIT_DIR": str(job), "USER": "u",
    }  # fmt: skip
    subprocess.run(["bash", str(script)], env=env, check=True, cwd=job)
    got = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert got["BOOTSEER_TRUST_VERIFY_KEYS"] == f"{keys}/ci.pub,{keys}/site.pub"
    assert got["BOOTSEER_TRUST_READ_FROM"] == "ci,site"
    assert got["AWS_SHARED_CREDENTIALS_FILE"] == str(creds)
    assert got["BOOTSEER_STORE"] == VALUES["STORE"]
    assert not any(k.startswith("BOOTSEER_TRUST_SIGNING") or k == "AWS_SECRET_ACCESS_KEY" for k in got)
    argv = (tmp_path / "argv").read_text().splitlines()
    mounts = next(a for a in argv if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert f"{keys}:{keys}:ro" in mounts and f"{creds}:{creds}:ro" in mounts
    # Unsigned on purpose (KEYS_DIR=), no credentials file on the node: nothing verified or mounted, the job
    # runs (a configured KEYS_DIR without a readable key fails closed: tests/security/test_unsigned_start.py).
    script.write_text(render("slurm-job.sbatch", VALUES | {"KEYS_DIR": ""}))
    subprocess.run(["bash", str(script)], env=env, check=True, cwd=job)
    got = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert "BOOTSEER_TRUST_VERIFY_KEYS" not in got and "AWS_SHARED_CREDENTIALS_FILE" not in got


def test_ci_prewarm_signs_with_the_ci_key(tmp_path: Path) -> None:
    """CI's key comes from a CI secret into a 0600 file that BOOTSEER_TRUST_SIGNING_KEY names; what prewarm
    publishes lands in the CI domain; the public key goes out as an artifact."""
    gh = yaml.safe_load(render("github-actions-prewarm.yml", {"IMAGE": "r/t", "DOMAIN": "team-ci"}))
    job = gh["jobs"]["prewarm"]
    assert job["env"]["BOOTSEER_STORE_DOMAIN"] == "team-ci"
    names = [s.get("name") for s in job["steps"]]
    step = job["steps"][names.index("Signing key")]
    assert names.index("Signing key") < names.index("Pre-warm")
    assert step["env"] == {"SIGNING_KEY": "${{ secrets.BOOTSEER_SIGNING_KEY }}"}
    runner_temp = tmp_path / "runner"
    runner_temp.mkdir()
    github_env = tmp_path / "github_env"
    pem = "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----"
    env = {"PATH": "/usr/bin:/bin", "SIGNING_KEY": pem, "RUNNER_TEMP": str(runner_temp), "GITHUB_ENV": str(github_env)}
    subprocess.run(["bash", "-e", "-c", step["run"]], env=env, check=True)
    name, path = github_env.read_text().strip().split("=", 1)
    assert name == "BOOTSEER_TRUST_SIGNING_KEY" and Path(path).read_text() == pem + "\n"
    assert Path(path).stat().st_mode & 0o777 == 0o600
    upload = next(s for s in job["steps"] if "upload-artifact" in s.get("uses", ""))
    assert "bootseer/ci.pub" in upload["with"]["path"].split()
    gl = yaml.safe_load(render("gitlab-ci-prewarm.yml", {"IMAGE": "r/t", "DOMAIN": "team-ci"}))["bootseer-prewarm"]
    assert gl["variables"]["BOOTSEER_STORE_DOMAIN"] == "team-ci"
    assert any("BOOTSEER_TRUST_SIGNING_KEY" in line and "mktemp" in line for line in gl["before_script"])
    assert "bootseer/ci.pub" in gl["artifacts"]["paths"]
