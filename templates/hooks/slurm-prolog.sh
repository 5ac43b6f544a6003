#!/bin/sh
# bootseer Slurm prolog: warm this node's bootseer cache while the job is being allocated.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/bootseer.sh     PrologFlags=Alloc
# (Alloc runs the prolog at allocation, so the fetch overlaps the rest of the allocation.)
#
# Site settings come from $BOOTSEER_PROLOG_ENV (default /etc/bootseer/prolog.env), a shell file
# setting e.g. BOOTSEER_STORE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and BOOTSEER_NODE_CACHE
# (default /var/cache/bootseer). The job's bootseer.toml is $BOOTSEER_CONFIG when set, else the
# bootseer.toml in the job's working directory (from `scontrol show job`). The prolog does not see the
# job's environment, so the image must be pinned in that file (`[image] ref = "repo@sha256:…"`, the same
# value the sbatch template exports as BOOTSEER_IMAGE), else the keys are the node's, not the image's.
#
# Blobs land in $BOOTSEER_NODE_CACHE/<job user>, owned by that user; the job uses the same directory
# (the sbatch template sets BOOTSEER_STORE_CACHE_DIR to it). The prolog always exits 0: a non-zero
# prolog drains the node, and a cold cache only makes the start slower.
set -u

log() { echo "bootseer-prolog[${SLURM_JOB_ID:-?}]: $*" >&2; }

site="${BOOTSEER_PROLOG_ENV:-/etc/bootseer/prolog.env}"
if [ -r "$site" ]; then
    set -a  # its assignments are for bootseer: export them
    # shellcheck source=/dev/null
    . "$site"
    set +a
fi

if ! command -v bootseer >/dev/null 2>&1; then
    log "bootseer is not installed on this node; nothing prefetched"
    exit 0
fi

config="${BOOTSEER_CONFIG:-}"
if [ -z "$config" ] && [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol >/dev/null 2>&1; then
    workdir=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^WorkDir=//p' | head -n 1)
    if [ -n "$workdir" ] && [ -r "$workdir/bootseer.toml" ]; then
        config="$workdir/bootseer.toml"
    fi
fi
if [ -z "$config" ]; then
    log "no bootseer.toml for this job; nothing prefetched"
    exit 0
fi

user="${SLURM_JOB_USER:-$(id -un)}"
cache="${BOOTSEER_NODE_CACHE:-/var/cache/bootseer}/$user"
if ! mkdir -p "$cache"; then
    log "cannot create $cache; nothing prefetched"
    exit 0
fi

limit="${BOOTSEER_PREFETCH_TIMEOUT:-600}"
if command -v timeout >/dev/null 2>&1; then
    timeout "$limit" bootseer prefetch --config "$config" --cache-dir "$cache"
else
    bootseer prefetch --config "$config" --cache-dir "$cache"
fi
status=$?
[ "$status" -eq 0 ] || log "prefetch ended with status $status; the job will fetch what is missing"

# The job runs as its user: hand the cache over (the start refreshes the blobs' times on every hit).
if [ -n "${SLURM_JOB_UID:-}" ]; then
    chown -R "$SLURM_JOB_UID" "$cache" 2>/dev/null || log "cannot chown $cache to uid $SLURM_JOB_UID"
fi
exit 0
