#!/bin/sh
# bootseer Kubernetes init container: warm the pod's shared volume before the training container starts.
#
# Runs in the job's own image (so it computes the same keys), with the same environment as the training
# container (BOOTSEER_IMAGE pinned by digest, BOOTSEER_STORE and read-only store credentials, BOOTSEER_CONFIG,
# the verify keys: it holds no signing key and publishes nothing),
# and the shared volume mounted at $BOOTSEER_WARM_DIR (default /bootseer-cache). It fetches the env
# snapshot, the hot-block record and the checkpoint stripes (only where the start pulls the checkpoint
# with [p2p] enabled: a mount reads the store, not the cache) into $BOOTSEER_WARM_DIR/blobs, which the entrypoint wrapper
# then hands to `bootseer exec` as the node cache.
#
# The pod's securityContext runs both containers as the job's uid and makes the volume group-owned by its
# fsGroup (setgid directory): what this script makes is group-readable and -writable (umask 002), never
# world-writable.
#
# It always exits 0: a cold cache only makes the start slower, it must never keep the pod from starting.
set -u
umask 002

warm="${BOOTSEER_WARM_DIR:-/bootseer-cache}"
limit="${BOOTSEER_PREFETCH_TIMEOUT:-600}"

if ! command -v bootseer >/dev/null 2>&1; then
    echo "bootseer-init: warning: bootseer is not installed in this image; nothing prefetched" >&2
    exit 0
fi
if ! mkdir -p "$warm/blobs"; then
    echo "bootseer-init: warning: cannot create $warm/blobs; nothing prefetched" >&2
    exit 0
fi

if command -v timeout >/dev/null 2>&1; then
    timeout "$limit" bootseer prefetch --cache-dir "$warm/blobs"
else
    bootseer prefetch --cache-dir "$warm/blobs"
fi
status=$?
if [ "$status" -ne 0 ]; then
    echo "bootseer-init: warning: prefetch ended with status $status; the start will fetch what is missing" >&2
fi
exit 0
