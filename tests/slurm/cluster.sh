#!/bin/sh
# A one-node Slurm cluster (munge, slurmctld, slurmd) on this machine, for the tests in tests/slurm.
#   tests/slurm/cluster.sh start [PROLOG]   start it (idempotent); PROLOG becomes slurm.conf's Prolog=
#   tests/slurm/cluster.sh stop             stop the daemons it started (by their pid files)
#   tests/slurm/cluster.sh status           exit 0 when the node answers and is idle or allocated
# Needs root and Debian's slurm-wlm and munge (.ci/run installs them). No systemd, no cgroups:
# proctrack/linuxproc and task/none. A start with another PROLOG rewrites slurm.conf and restarts.
set -eu

conf_dir=/etc/slurm
conf=$conf_dir/slurm.conf
state=/var/spool/slurmctld
spool=/var/spool/slurmd
log_dir=/var/log/slurm
host=$(hostname)

say() { echo "slurm-cluster: $*" >&2; }

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if pid_alive /run/munge/munged.pid; then return 0; fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    runuser -u munge -- munged --force --pid-file=/run/munge/munged.pid
    for _ in $(seq 50); do pid_alive /run/munge/munged.pid && return 0; sleep 0.1; done
    say "munged did not start"
    return 1
}

write_conf() {
    prolog=$1
    cpus=$(nproc)
    mkdir -p "$conf_dir" "$state" "$spool" "$log_dir"
    tmp=$(mktemp "$conf_dir/.slurm.conf.XXXXXX")
    cat >"$tmp" <<CONF
# written by tests/slurm/cluster.sh
ClusterName=bootseer-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$state
SlurmdSpoolDir=$spool
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$log_dir/slurmctld.log
SlurmdLogFile=$log_dir/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
PrologFlags=Alloc
${prolog:+Prolog=$prolog}
NodeName=$host CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    if [ -f "$conf" ] && cmp -s "$tmp" "$conf"; then
        rm -f "$tmp"
        return 1 # unchanged
    fi
    mv "$tmp" "$conf"
    chmod 0644 "$conf"
    return 0
}

stop() {
    for f in /run/slurmd.pid /run/slurmctld.pid; do
        if pid_alive "$f"; then
            pid=$(cat "$f")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$f"
    done
}

node_ready() {
    st=$(sinfo -h -n "$host" -o %t 2>/dev/null) || return 1
    case "$st" in idle* | alloc* | mix* | comp*) return 0 ;; esac
    return 1
}

start() {
    prolog=${1:-}
    start_munge
    if write_conf "$prolog"; then
        stop # the configuration changed: restart with it
    fi
    if ! pid_alive /run/slurmctld.pid; then
        slurmctld -f "$conf"
    fi
    for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
    if ! pid_alive /run/slurmd.pid; then
        slurmd -f "$conf"
    fi
    for _ in $(seq 150); do
        if node_ready; then return 0; fi
        st=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
        case "$st" in down* | drain* | fail*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;; esac
        sleep 0.2
    done
    say "the node did not become idle: $(sinfo -h -n "$host" -o '%t %E' 2>&1)"
    tail -n 20 "$log_dir/slurmctld.log" "$log_dir/slurmd.log" >&2 2>/dev/null || true
    return 1
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    status) node_ready ;;
    *) echo "usage: $0 start [PROLOG] | stop | status" >&2; exit 2 ;;
esac
