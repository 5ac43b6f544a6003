#!/bin/sh
# bootseer Slurm prolog: warm this node's bootseer cache while the job is being allocated.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/bootseer.sh     PrologFlags=Alloc
# (Alloc runs the prolog at allocation, so the fetch overlaps the rest of the allocation.)
#
# Site settings come from $BOOTSEER_PROLOG_ENV (default /etc/bootseer/prolog.env, root 0600): KEY=VALUE
# lines, read literally (no shell evaluation: `&`, `$`, spaces and quotes inside a value stay as they are;
# one pair of surrounding quotes is stripped; blank lines and # comments are skipped), e.g.
#   BOOTSEER_STORE=s3://bucket/bootseer?endpoint_override=10.0.0.1:9000&scheme=http
#   AWS_ACCESS_KEY_ID=…   AWS_SECRET_ACCESS_KEY=…   (the store's write credentials)
#   BOOTSEER_NODE_CACHE=/var/cache/bootseer
#   BOOTSEER_STORE_DOMAIN=site   BOOTSEER_TRUST_SIGNING_KEY=/etc/bootseer/domain.key   (root 0600)
#   BOOTSEER_TRUST_VERIFY_KEYS=/etc/bootseer/keys/site.pub,/etc/bootseer/keys/ci.pub   BOOTSEER_TRUST_READ_FROM=ci
# The signing key and the write credentials stay here, with root: the batch job (the job's user) gets the
# public keys and, where reading needs any, a read-only credentials file (see slurm-job.sbatch; docs/trust.md).
# These settings override the job's bootseer.toml (environment over file). The job's bootseer.toml is
# $BOOTSEER_CONFIG when set, else the bootseer.toml in the job's working directory (from `scontrol show
# job`). The prolog does not see the job's environment, so the image must be pinned in that file (`[image] ref = "repo@sha256:…"`, the same
# value the sbatch template exports as BOOTSEER_IMAGE), else the keys are the node's, not the image's.
#
# Blobs land in $BOOTSEER_NODE_CACHE/<job user>, owned by that user; the job uses the same directory
# (the sbatch template sets BOOTSEER_STORE_CACHE_DIR to it). The prolog always exits 0: a non-zero
# prolog drains the node, and a cold cache only makes the start slower.
set -u

log() { echo "bootseer-prolog[${SLURM_JOB_ID:-?}]: $*" >&2; }

# load_site_env FILE: export each KEY=VALUE line of FILE, the value taken literally (never evaluated).
load_site_env() {
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%"$(printf '\r')"}
        case "$line" in
            '' | '#'*) continue ;;
        esac
        key=${line%%=*}
        key=${key#export }
        case "$line" in
            *=*) ;;
            *) log "$1: ignoring a line without '=': $key"; continue ;;
        esac
        case "$key" in
            '' | [0-9]* | *[!A-Za-z0-9_]*) log "$1: ignoring a line that is not KEY=VALUE: $key"; continue ;;
        esac
        value=${line#*=}
        case "$value" in
            \"*\") value=${value#\"}; value=${value%\"} ;;
            \'*\') value=${value#\'}; value=${value%\'} ;;
        esac
        export "$key=$value"
    done < "$1"
}

site="${BOOTSEER_PROLOG_ENV:-/etc/bootseer/prolog.env}"
if [ -r "$site" ]; then
    if [ -n "$(find "$site" -prune -perm -004 2>/dev/null)" ]; then
        log "warning: $site is readable by every user, and it holds the store's credentials: chmod 600 it"
    fi
    load_site_env "$site"
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
