#!/bin/sh
# bootseer Slurm prolog: warm this node's bootseer cache while the job is being allocated.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/bootseer.sh     PrologFlags=Alloc
# (Alloc runs the prolog at allocation, so the fetch overlaps the rest of the allocation.)
#
# Site settings come from $BOOTSEER_PROLOG_ENV (default /etc/bootseer/prolog.env, root 0600, owned by the
# prolog's user, else ignored): KEY=VALUE lines, read literally (no shell evaluation: `&`, `$`, spaces and
# quotes inside a value stay as they are; one pair of surrounding quotes is stripped; blank lines and
# # comments are skipped), e.g.
#   BOOTSEER_STORE=s3://bucket/bootseer?endpoint_override=10.0.0.1:9000&scheme=http
#   BOOTSEER_NODE_CACHE=/var/cache/bootseer
#   BOOTSEER_READ_CREDENTIALS=/etc/bootseer/read-credentials   (read-only, as the batch job gets)
#   BOOTSEER_STORE_DOMAIN=site   BOOTSEER_TRUST_VERIFY_KEYS=/etc/bootseer/keys/site.pub,/etc/bootseer/keys/ci.pub
#   BOOTSEER_TRUST_READ_FROM=ci   BOOTSEER_STORE_CACHE_MAX_GB=500   BOOTSEER_CHECKPOINT_TARGETS=…
#
# Root never acts inside the job user's paths (issue 26): the prefetch runs as the job's user
# (SLURM_JOB_UID/SLURM_JOB_GID, `setpriv --reuid --regid --init-groups`), with a clean environment: the
# site's BOOTSEER_* settings (which override the job's bootseer.toml: the site decides the store, the
# cache bound, the targets and the peers) and the read-only credentials file, never the store's write
# credentials (AWS_ACCESS_KEY_ID/…) or the signing key, which stay with root. Root only creates
# $BOOTSEER_NODE_CACHE/<user> (0700, owned by the user) when it is missing, and refuses one that is a
# link or someone else's; it never opens the job's files (the user's prefetch reads the job's
# bootseer.toml: $BOOTSEER_CONFIG when set, else the bootseer.toml in the job's working directory, from
# `scontrol show job`). The prolog does not see the job's environment, so the image must be pinned in
# that file (`[image] ref = "repo@sha256:…"`, the same value the sbatch template exports as
# BOOTSEER_IMAGE), else the keys are the node's, not the image's.
#
# It fetches the env snapshot, the hot-block record and, where the job pulls its checkpoint through the
# swarm (`[checkpoint] mode = "pull"`, or a node that cannot mount, with `[p2p] enabled`), the
# checkpoint's stripes: a mount, or a pull without the swarm, reads them from the store, never this cache.
#
# The job uses the same cache (the sbatch template sets BOOTSEER_STORE_CACHE_DIR to it). The prolog always
# exits 0: a non-zero prolog drains the node, and a cold cache only makes the start slower.
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
if [ -f "$site" ] && [ -r "$site" ]; then
    if [ -z "$(find -L "$site" -prune -user "$(id -u)" 2>/dev/null)" ]; then
        log "warning: $site is not owned by uid $(id -u): ignored (anyone who can write it steers this prolog)"
    else
        if [ -n "$(find -L "$site" -prune -perm -004 2>/dev/null)" ]; then
            log "warning: $site is readable by every user, and it may hold the store's credentials: chmod 600 it"
        fi
        load_site_env "$site"
    fi
fi
cd / || exit 0 # the prefetch runs as the job's user, who may not enter slurmd's directory

bootseer=$(command -v bootseer 2>/dev/null || true)
if [ -z "$bootseer" ]; then
    log "bootseer is not installed on this node; nothing prefetched"
    exit 0
fi

me=$(id -u)
uid="${SLURM_JOB_UID:-$me}"
gid="${SLURM_JOB_GID:-}"
user="${SLURM_JOB_USER:-$(id -un "$uid" 2>/dev/null || echo "$uid")}"
case "$uid" in '' | *[!0-9]*) log "SLURM_JOB_UID is not a number; nothing prefetched"; exit 0 ;; esac
if [ -z "$gid" ]; then gid=$(id -g "$uid" 2>/dev/null || true); fi
case "$gid" in '' | *[!0-9]*) log "no group for uid $uid; nothing prefetched"; exit 0 ;; esac
case "$user" in '' | . | .. | */*) log "job user '$user' cannot name a cache directory; nothing prefetched"; exit 0 ;; esac

# as_user SECONDS VAR=VALUE... CMD...: CMD as the job's user with only that environment, killed after
# SECONDS (0: no limit) by root's `timeout` (a job user's process cannot outlive it by ignoring SIGTERM).
as_user() {
    t=$1
    shift
    if [ "$uid" = "$me" ]; then
        set -- env -i "$@"
    elif [ "$me" = 0 ]; then
        set -- setpriv --reuid="$uid" --regid="$gid" --init-groups -- env -i "$@"
    else
        log "running as uid $me, not root: cannot act as uid $uid"
        return 1
    fi
    if [ "$t" -gt 0 ] && command -v timeout >/dev/null 2>&1; then
        timeout -k 10 "$t" "$@"
    else
        "$@"
    fi
}

# The environment the user's prefetch gets: the site's settings, nothing secret.
home=$(getent passwd "$uid" 2>/dev/null | cut -d: -f6)
set -- "PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}" "HOME=${home:-/}" "USER=$user" "LOGNAME=$user"
for k in $(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' | sort -u); do
    case "$k" in
        BOOTSEER_TRUST_SIGNING_KEY | BOOTSEER_PROLOG_ENV | BOOTSEER_NODE_CACHE | BOOTSEER_PREFETCH_TIMEOUT) continue ;;
        BOOTSEER_READ_CREDENTIALS | BOOTSEER_CONFIG) continue ;;
        BOOTSEER_* | SLURM_JOB_ID | SLURM_JOB_USER | SLURM_JOB_UID | SLURM_JOB_GID | LANG | LC_ALL | TZ) ;;
        AWS_EC2_METADATA_DISABLED | AWS_REGION | AWS_DEFAULT_REGION | AWS_ENDPOINT_URL) ;;
        *) continue ;;
    esac
    v=
    eval "v=\${$k}" # k is a plain name (checked above): no user text is evaluated
    case "$v" in
        *://*:*@* | *[?\&]secret_key=* | *[?\&]access_key=* | *[?\&]session_token=*)
            # a secret in a value would reach the user's process (and env's argv): never handed over
            log "$k carries credentials: not given to the job user's prefetch (name a read-only file in BOOTSEER_READ_CREDENTIALS)"
            [ "$k" = BOOTSEER_STORE ] && exit 0 # without the site's store, nothing is prefetched
            continue
            ;;
    esac
    set -- "$@" "$k=$v"
done
read_credentials="${BOOTSEER_READ_CREDENTIALS:-/etc/bootseer/read-credentials}"
if [ -f "$read_credentials" ]; then
    case "${BOOTSEER_STORE:-}" in
        s3://*) set -- "$@" "AWS_SHARED_CREDENTIALS_FILE=$read_credentials" ;;
        gs://*) set -- "$@" "GOOGLE_APPLICATION_CREDENTIALS=$read_credentials" ;;
    esac
fi
if [ -z "${BOOTSEER_STORE:-}" ]; then
    log "warning: the site names no store (BOOTSEER_STORE in $site): the job's own config chooses it"
fi

config="${BOOTSEER_CONFIG:-}"
if [ -z "$config" ] && [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol >/dev/null 2>&1; then
    workdir=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^WorkDir=//p' | head -n 1)
    if [ -n "$workdir" ]; then
        config="$workdir/bootseer.toml"
    fi
fi
if [ -z "$config" ] || ! as_user 30 "$@" test -f "$config"; then
    log "no bootseer.toml for this job; nothing prefetched"
    exit 0
fi

# The cache: $BOOTSEER_NODE_CACHE/<user>, the user's own directory. Made here when missing (root makes
# it, then hands the empty directory over); an existing one must be a real directory of that user.
base="${BOOTSEER_NODE_CACHE:-/var/cache/bootseer}"
cache="$base/$user"
if [ ! -d "$base" ] && ! mkdir -p "$base"; then
    log "cannot create $base; nothing prefetched"
    exit 0
fi
if [ -n "$(find "$base" -prune -perm -002 ! -perm -1000 2>/dev/null)" ]; then
    log "warning: $base is writable by every user (and not sticky): another user can replace $cache"
fi
if [ -L "$cache" ]; then
    log "$cache is a symlink: refused, nothing prefetched (remove it; the prolog makes the directory)"
    exit 0
fi
if [ ! -e "$cache" ]; then
    if ! { mkdir -m 0700 "$cache" && chown "$uid:$gid" "$cache"; }; then
        log "cannot create $cache for uid $uid; nothing prefetched"
        exit 0
    fi
fi
owner=$(stat -c %u "$cache" 2>/dev/null || true)
if [ ! -d "$cache" ] || [ -L "$cache" ] || [ "$owner" != "$uid" ]; then
    log "$cache is not a directory of uid $uid (owner ${owner:-?}): refused, nothing prefetched"
    exit 0
fi

limit="${BOOTSEER_PREFETCH_TIMEOUT:-600}"
case "$limit" in '' | *[!0-9]*) limit=600 ;; esac
as_user "$limit" "$@" "$bootseer" prefetch --config "$config" --cache-dir "$cache"
status=$?
[ "$status" -eq 0 ] || log "prefetch ended with status $status; the job will fetch what is missing"
exit 0
