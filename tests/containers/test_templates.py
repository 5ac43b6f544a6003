"""Templates render with the user's values into files their tools accept; hooks are shellcheck clean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
    assert "{{" not in text and "completions: 4" in text and "nvidia.com/gpu: 2" in text
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
        assert c["envFrom"][0]["secretRef"]["name"] == "bootseer-store"  # the store's credentials
        assert {"name": "bootseer-cache", "mountPath": "/bootseer-cache"} in c["volumeMounts"]
    assert train["command"] == ["bootseer", "exec", "--"] and train["args"][0] == "torchrun"
    assert init_c["command"][-1] == "/usr/local/bin/bootseer-k8s-init"
    # What the init script fills is what exec reads.
    init_env = {e["name"]: e.get("value") for e in init_c["env"]}
    train_env = {e["name"]: e.get("value") for e in train["env"]}
    assert train_env["BOOTSEER_STORE_CACHE_DIR"] == init_env["BOOTSEER_WARM_DIR"] + "/blobs"
    # FUSE for checkpoint mounts.
    assert "SYS_ADMIN" in train["securityContext"]["capabilities"]["add"]
    assert {"name": "fuse", "mountPath": "/dev/fuse"} in train["volumeMounts"]
    assert any(v.get("hostPath", {}).get("path") == "/dev/fuse" for v in pod["volumes"])


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


@pytest.mark.parametrize("hook", sorted(p.name for p in (REPO / "hooks").glob("*.sh")))
def test_hooks_are_shellcheck_clean(hook: str) -> None:
    assert shutil.which("shellcheck"), "apt-get install shellcheck"
    r = subprocess.run(["shellcheck", "-s", "sh", str(REPO / "hooks" / hook)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert (REPO / "hooks" / hook).stat().st_mode & 0o111  # executable


def test_dockerfile_snippet_renders() -> None:
    text = render("Dockerfile.bootseer", {"BASE_IMAGE": "registry.example/train:1.0"})
    assert text.splitlines()[3] == "FROM registry.example/train:1.0"
    assert "python3 -m venv  /opt/bootseer" in text  # its own venv: a PEP 668 base refuses a system install
    assert "/opt/bootseer/bin/python -m pip install --no-cache-dir  bootseer" in text
    assert "ln -sf /opt/bootseer/bin/bootseer /usr/local/bin/bootseer" in text
    assert 'ENTRYPOINT ["/usr/local/bin/bootseer-entrypoint"]' in text
