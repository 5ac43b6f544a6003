"""The first compiled step on a restart into a fresh "container", with and without the compile stage,
and with PyTorch's own warm cache (goal: ≥ 5× faster with the stage than without, and ≥ 90 % of the
warm cache's speed; the stage's own cost with nothing to restore ≤ 0.2 s).

A fresh container is a fresh bootseer cache (XDG_CACHE_HOME), a fresh HOME, fresh compile cache
directories and its own empty TMPDIR (Inductor keeps its precompiled headers, ~150 MB, in
`$TMPDIR/torchinductor_<user>/`, outside TORCHINDUCTOR_CACHE_DIR: nodes sharing one /tmp share them).
One warm-up start through `bootseer exec` publishes the cache into a file:// store, and one plain
start fills a "warm" node (its own TMPDIR and cache directory, kept). Then each round runs, side by
side so machine noise hits all alike: the model alone on a fresh node (without the stage), the model
through `bootseer exec` with `[compile] enabled = true` on a fresh node (it restores the published
cache), and the model alone on the warm node again (PyTorch's own warm cache: the best a restore
can do). Prints the first compiled call of each (the model's own timing), their medians and ratios,
the stage's time from the summary line, and the load average.
Do not run it while other tests run. Usage: python tests/benchmarks/bench_compile.py [--runs N]

On a GPU node, `--model gpt --device cuda` compiles a small GPT (12 layers, bf16, forward and
backward) instead of the CPU MLP: there Triton's kernels, not Inductor's C++ headers, are what a
fresh node lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = """
import json, time, torch
from torch import nn
from torch._dynamo.utils import compilation_time_metrics, counters
torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [nn.Linear(64, 64), nn.ReLU()]
model = torch.compile(nn.Sequential(*layers))
x = torch.randn(32, 64)
t_wall, t0 = time.time(), time.perf_counter()
model(x).sum().backward()
print(json.dumps({"first_s": time.perf_counter() - t0, "t_wall": t_wall, "inductor": dict(counters["inductor"]),
                  "aot": dict(counters["aot_autograd"]),
                  "phases": {k: sum(v) for k, v in compilation_time_metrics.items()}}))
"""


GPT = """
import json, time, torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import compilation_time_metrics, counters
torch.manual_seed(0)
DEV, D, H, T, V = "{device}", 512, 8, 256, 8192
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = (t.view(B, L, H, C // H).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

class GPT(nn.Module):
    def __init__(self, layers=12):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))

model = torch.compile(GPT().to(DEV, DTYPE))
idx = torch.randint(0, V, (8, T), device=DEV)
if DEV == "cuda":
    torch.ones(1, device=DEV).sum().item()  # the CUDA context is not the compile's
t_wall, t0 = time.time(), time.perf_counter()
F.cross_entropy(model(idx).float().view(-1, V), idx.view(-1)).backward()
if DEV == "cuda":
    torch.cuda.synchronize()
print(json.dumps({{"first_s": time.perf_counter() - t0, "t_wall": t_wall, "inductor": dict(counters["inductor"]),
                  "aot": dict(counters["aot_autograd"]),
                  "phases": {{k: sum(v) for k, v in compilation_time_metrics.items()}}}}))
"""


def _env(work: Path, node: str) -> dict[str, str]:
    """A node's environment: its own (empty on first use) TMPDIR, HOME and bootseer cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "TORCHINDUCTOR_", "TRITON_"))}
    env["XDG_CACHE_HOME"] = str(work / f"xdg-{node}")
    for var, name in (("TMPDIR", "tmp"), ("HOME", "home")):
        (work / f"{name}-{node}").mkdir(exist_ok=True)
        env[var] = str(work / f"{name}-{node}")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict[str, object], str]:
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def caches(doc: dict[str, object]) -> str:
    """What the run's caches answered: FX graph and AOTAutograd hits/misses (a restored node that
    misses recompiles part of the model, however fast Triton's own cache then is)."""
    ind, aot = doc.get("inductor") or {}, doc.get("aot") or {}
    assert isinstance(ind, dict) and isinstance(aot, dict)
    fx = f"fx {ind.get('fxgraph_cache_hit', 0)}/{ind.get('fxgraph_cache_miss', 0)}"
    return f"{fx}, aot {aot.get('autograd_cache_hit', 0)}/{aot.get('autograd_cache_miss', 0)} hit/miss"


LAST_CACHES: dict[str, str] = {}  # node → `caches()` of its last run, for the round's line
LAST_PHASES: dict[str, dict[str, float]] = {}  # node → its last run's compile phases (dynamo_timed, s)


def with_stage(work: Path, node: str) -> tuple[float, float]:
    """(first compiled call, the compile stage's own time) through `bootseer exec` on a fresh node."""
    (work / "bootseer.toml").write_text(
        f'[store]\nuri = "{(work / "store").as_uri()}"\n[compile]\nenabled = true\ncache_dir = "compile-{node}"\n'
    )
    doc, err = _run(
        [sys.executable, "-m", "bootseer_cli", "exec", "--", sys.executable, "model.py"], work, _env(work, node)
    )
    m = re.search(r"compile ([0-9.]+) (ms|s) ", err)
    stage = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1) if m else float("nan")
    wait_agent(work / f"xdg-{node}")  # its publish (nothing new) is not to load the next start
    _note(work, node, doc, "compile")
    return float(doc["first_s"]), stage  # type: ignore[arg-type]


def _note(work: Path, node: str, doc: dict[str, object], caches_at: str) -> None:
    """Keep what the round's line says of a run: its caches' hits and what it wrote after its first
    compiled step began, in its compile caches (`<caches_at>-<node>`), its HOME and its TMPDIR (a
    restored node that still compiles something, rewrites what it found, or fills a cache the stage
    does not carry, such as the CUDA driver's JIT cache under HOME, shows it here; the warm node
    should write nothing)."""
    since = float(doc["t_wall"])  # type: ignore[arg-type]
    written = {d: _written(work / f"{d}-{node}", since) for d in (caches_at, "home", "tmp")}
    LAST_CACHES[node] = caches(doc) + "; " + "; ".join(f"{d}: {w}" for d, w in written.items())
    LAST_PHASES[node] = dict(doc.get("phases") or {})  # type: ignore[call-overload]


def _written(root: Path, since: float) -> str:
    """What a run wrote below `root` after `since`: a count per top directory (two levels: the compile
    caches are `<key>/<cache>/…`) and the first few names; locks left out."""
    new = sorted(
        str(f.relative_to(root))
        for f in (root.rglob("*") if root.is_dir() else ())
        if f.is_file()
        and not f.is_symlink()
        and f.stat().st_mtime > since
        and "locks" not in f.parts
        and not f.name.endswith((".lock", ".tmp"))  # no part of a cache
    )
    if not new:
        return "nothing"
    per: dict[str, int] = {}
    for rel in new:
        top = "/".join(rel.split("/")[:2]) if rel.count("/") > 1 else rel.split("/")[0]
        per[top] = per.get(top, 0) + 1
    return f"{per} (e.g. {', '.join(new[:3])})"


def slower_phases(node: str, than: str, at_least_s: float = 0.05) -> str:
    """The compile phases where `node`'s run took longer than `than`'s (the warm node's), largest first."""
    a, b = LAST_PHASES.get(node, {}), LAST_PHASES.get(than, {})
    diff = sorted(((a[k] - b.get(k, 0.0), k) for k in a), reverse=True)
    shown = [f"{k} +{d:.2f} s" for d, k in diff[:5] if d >= at_least_s]
    return ", ".join(shown) or "none"


def without_stage(work: Path, node: str) -> float:
    """The model alone; on a fresh node its caches are empty, on the warm node they are its own."""
    env = _env(work, node)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-{node}")
    doc, _ = _run([sys.executable, "model.py"], work, env)
    _note(work, node, doc, "inductor")
    return float(doc["first_s"])  # type: ignore[arg-type]


def wait_agent(xdg: Path, timeout_s: float = 120.0) -> None:
    """A start's agent publishes when the launcher has ended: wait for it to finish, so that its work
    never loads the next start (`xdg`: that node's XDG_CACHE_HOME)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        logs = list(xdg.glob("bootseer/runs/*/agent.log"))
        if logs and "agent done" in logs[0].read_text():
            return
        time.sleep(0.1)
    sys.exit(f"the agent under {xdg} did not finish within {timeout_s:g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (~150 MB a node: its TMPDIR)")
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp", help="gpt: a 12-layer GPT (for a GPU)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs")
    args = ap.parse_args()
    if args.model == "mlp" and args.device != "cpu":
        sys.exit("--device cuda needs --model gpt")
    work = Path(tempfile.mkdtemp(prefix="bench-compile-"))
    try:
        _bench(work, args.runs, MODEL if args.model == "mlp" else GPT.format(device=args.device))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _bench(work: Path, runs: int, model: str) -> None:
    (work / "model.py").write_text(model)
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores; {_device()}")
    cold, _ = with_stage(work, "warmup")
    print(f"warm-up (publishes): first compiled call {cold:.1f} s")
    print(f"warm-up of the warm node: first compiled call {without_stage(work, 'warm'):.1f} s")
    plain, restored, warm, stages = [], [], [], []
    for i in range(runs):
        plain.append(without_stage(work, f"plain-{i}"))
        first, stage = with_stage(work, f"node-{i}")
        restored.append(first)
        stages.append(stage)
        warm.append(without_stage(work, "warm"))
        print(
            f"round {i}: without {plain[-1]:.2f} s, with {restored[-1]:.2f} s (stage {stage:.2f} s), "
            f"warm {warm[-1]:.2f} s; load {os.getloadavg()[0]:.2f}; caches: with ({LAST_CACHES[f'node-{i}']}), "
            f"warm ({LAST_CACHES['warm']}); compile phases slower than warm: {slower_phases(f'node-{i}', 'warm')}"
        )
    a, b, c = statistics.median(plain), statistics.median(restored), statistics.median(warm)
    stage = statistics.median(stages)
    print(
        f"median first compiled call: without {a:.2f} s, with {b:.2f} s, warm {c:.2f} s: "
        f"{a / b:.1f}x faster than without (goal >= 5x), {c / b:.0%} of the warm cache's speed (goal >= 90%); "
        f"stage {stage:.2f} s"
    )
    # the rounds' own ratios: the three starts of a round ran back to back, under the same load
    speedup = statistics.median(p / r for p, r in zip(plain, restored, strict=True))
    of_warm = statistics.median(w / r for w, r in zip(warm, restored, strict=True))
    with_stage_total = statistics.median(w / (r + s) for w, r, s in zip(warm, restored, stages, strict=True))
    print(
        f"median of the rounds' ratios: {speedup:.1f}x faster than without, {of_warm:.0%} of the warm cache's "
        f"speed ({with_stage_total:.0%} counting the stage's own time)"
    )
    print(f"load average after: {os.getloadavg()}")


def _device() -> str:
    """The GPU's name where there is one (nvidia-smi), for the figures' record."""
    try:
        argv = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        out = subprocess.run(argv, capture_output=True, text=True)
        return out.stdout.strip() or "no GPU"
    except OSError:
        return "no GPU"


if __name__ == "__main__":
    main()
