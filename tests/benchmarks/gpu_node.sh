#!/bin/bash
# Issue 28's GPU-node figures in one call, for a lent GPU machine (16 cores; no network there):
#   1. the compile stage on the GPU: a 12-layer GPT, bf16, forward and backward, each "node" with
#      its own empty TMPDIR and HOME (bench_compile.py --model gpt --device cuda);
#   2. env restore and capture against tar on the machine's own CUDA torch tree (torch, nvidia,
#      triton), the page cache dropped before every step, each into a new ext4 where a loop
#      device mounts (bench_envsnap.py --vs-tar --copy-dirs), and beside the capture (on 16 cores:
#      four large-file writers, appended as they report) the capture with one large-file writer,
#      its part appended at its end (--big-writers 1: as before session 15) and with two, in the
#      same rounds. ENV_ONLY=capture (the default; the restore was measured in session 14 and has
#      not changed since) or restore, or empty for both.
# Every step is time-boxed so the whole call ends inside the device's 600 s; the per-step lines
# are written as they come, so a step cut short still leaves its rounds. Logs go to $OUT.
#
# Prepare here (the machine's image has torch, triton, pyarrow, typer and tqdm, not the rest):
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl zstandard \
#     platformdirs 'libtorrent>=2.0.9,<2.2' 'docker>=7,<8' 'mfusepy>=3,<4' 'cryptography>=42,<51' \
#     cffi pycparser 'obstore>=0.12,<0.13'
#   cp "$(command -v zstd)" .whl/zstd    # tar -I zstd needs the CLI; the image may lack it
# then run `bash tests/benchmarks/gpu_node.sh` there, carrying `.whl`. Both steps take ~10 min on
# an H200 node (the compile's warm-ups ~75 s and ~45 s a round; the env's ~70 s a round): to get
# every round, run them as two calls on the warm machine, `STEPS=compile …`, then `STEPS=envsnap …`.
set -u
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
OUT=${OUT:-/tmp/gpu-node-out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-585}
STEPS=${STEPS:-compile envsnap}
COMPILE_S=${COMPILE_S:-}  # empty: beside the env step 230 s (2 rounds on session 14's H200); alone, the
                          # rest of the budget (warm-ups ~75 s, then ~45 s a round: 3 rounds ~5 min)
ENV_ONLY=${ENV_ONLY-capture}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site
command -v zstd >/dev/null || install -m 0755 .whl/zstd /usr/local/bin/zstd
SP=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
{
  echo "cores $(nproc)"; uptime; grep -m1 'model name' /proc/cpuinfo; uname -r
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
  tar --version | head -1; zstd --version; df -h /tmp | tail -1
  du -sh "$SP/torch" "$SP/nvidia" "$SP/triton"
  python3 -c 'import bootseer_cli.envsnap.capture, bootseer_cli.compilecache, zstandard; print("bootseer imports")'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
FRESH=--fresh-fs
if ! (truncate -s 64M /tmp/probe.img && mkfs.ext4 -q -F /tmp/probe.img && mkdir -p /tmp/probe.mnt \
      && mount -o loop /tmp/probe.img /tmp/probe.mnt && umount /tmp/probe.mnt); then
  FRESH=""; echo "no loop mount: each step into the same filesystem" | tee -a "$OUT/env.txt"
fi
rm -f /tmp/probe.img
if [[ " $STEPS " == *" compile "* ]]; then
  echo "== compile $(date +%T)"
  [[ -n "$COMPILE_S" ]] || { [[ "$STEPS" == compile ]] && COMPILE_S=$(( BUDGET_S - ($(date +%s) - t0) )) || COMPILE_S=230; }
  timeout "$COMPILE_S" python3 tests/benchmarks/bench_compile.py --model gpt --device cuda --runs 3 2>&1 \
    | tee "$OUT/compile.txt"
fi
if [[ " $STEPS " == *" envsnap "* ]]; then
  echo "== envsnap $(date +%T) (+$(( $(date +%s) - t0 )) s)"
  timeout $(( BUDGET_S - ($(date +%s) - t0) )) python3 tests/benchmarks/bench_envsnap.py --vs-tar $FRESH --reps 5 \
    --json "$OUT/envsnap.json" --copy-dirs "$SP/torch" "$SP/nvidia" "$SP/triton" --target /tmp/bsb/venv \
    --big-writers 1 2r ${ENV_ONLY:+--only "$ENV_ONLY"} 2>&1 \
    | tee "$OUT/envsnap.txt"
fi
echo "== done $(date +%T) (+$(( $(date +%s) - t0 )) s)"
