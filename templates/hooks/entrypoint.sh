#!/bin/sh
# bootseer container entrypoint: runs the image's command through `bootseer exec`.
#
#   ENTRYPOINT ["/usr/local/bin/bootseer-entrypoint"]
#   CMD ["torchrun", "--nproc-per-node=8", "train.py"]
#
# - BOOTSEER_DISABLE=1 runs the command directly (to rule bootseer out when debugging).
# - When a warm cache was prepared on this node (the Kubernetes init container or the Slurm prolog
#   wrote it to $BOOTSEER_WARM_DIR, default /bootseer-cache), it becomes the node's blob cache, so the
#   snapshot and the hot-block record are found there instead of being fetched again.
# - The config is named, never searched for: $BOOTSEER_CONFIG when set, else the workdir's bootseer.toml,
#   else none (/dev/null: defaults and BOOTSEER_* only). A config is code, and a walk up from the workdir
#   could meet one that a mounted volume or a shared parent put there.
# - When bootseer is not installed, the command still runs, with a warning: never a blocked job.
set -u

if [ "$#" -eq 0 ]; then
    echo "bootseer-entrypoint: no command given (set the image's CMD or the pod's args)" >&2
    exit 2
fi

if [ "${BOOTSEER_DISABLE:-0}" = "1" ]; then
    exec "$@"
fi

warm="${BOOTSEER_WARM_DIR:-/bootseer-cache}"
if [ -z "${BOOTSEER_STORE_CACHE_DIR:-}" ] && [ -d "$warm/blobs" ]; then
    BOOTSEER_STORE_CACHE_DIR="$warm/blobs"
    export BOOTSEER_STORE_CACHE_DIR
fi

if [ -z "${BOOTSEER_CONFIG:-}" ]; then
    if [ -f "$PWD/bootseer.toml" ]; then BOOTSEER_CONFIG="$PWD/bootseer.toml"; else BOOTSEER_CONFIG=/dev/null; fi
    export BOOTSEER_CONFIG
fi

if command -v bootseer >/dev/null 2>&1; then
    exec bootseer exec -- "$@"
fi

echo "bootseer-entrypoint: warning: bootseer is not installed in this image; running the command without it" >&2
exec "$@"
