# shellcheck shell=bash disable=SC2034
# Shared settings and helpers for scripts/k8s_cluster.sh (sourced, not run).
# Cache (survives `down`, reused by every `build`): ABX_K8S_CACHE, default /var/cache/abx-k8s.
# Cluster state (pki, etcd, node dirs, logs, pids; `down` stops what it lists): ABX_K8S_STATE,
# default /var/lib/abx-k8s. The admin kubeconfig is always $STATE/kubeconfig.
CACHE=${ABX_K8S_CACHE:-/var/cache/abx-k8s}
STATE=${ABX_K8S_STATE:-/var/lib/abx-k8s}
NODES=${ABX_K8S_NODES:-3}
BIN=$CACHE/bin              # kube-apiserver kubelet kube-controller-manager kube-scheduler etcd kubectl
IMAGES=$CACHE/images        # docker-archive tars imported into every node's containerd
STAMPS=$CACHE/stamps
PKI=$STATE/pki
RUN=$STATE/run              # wiped by every `up`
LOGS=$STATE/logs
PIDS=$STATE/pids
KUBECONFIG_OUT=$STATE/kubeconfig
K8S_VERSION=1.20.2
ETCD_PORT=23790             # not 2379: leave a system etcd alone
API=https://127.0.0.1:6443
CGROUP_CONTROLLERS="cpu cpuacct cpuset memory pids freezer blkio devices hugetlb net_cls net_prio perf_event systemd unified"
# an unexpected failure (set -e) names the script, line and command instead of exiting silently
trap 'die "$(basename "$0"): line $LINENO: \"$BASH_COMMAND\" failed"' ERR
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31mk8s_cluster: %s\033[0m\n' "$*" >&2; exit 1; }

# die naming the log to read, with its last lines
die_log() { # message logfile
    { printf '\033[1;31mk8s_cluster: %s\033[0m\n   read %s; its last lines:\n' "$1" "$2"
      tail -n 15 "$2" 2>/dev/null | sed 's/^/   | /'; } >&2
    exit 1
}

need_root() { [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages, starts containerd and kubelets, mounts)"; }

# run_logged NAME LOG CMD...: run CMD with output to LOG, a progress line every 30 s, clear error on failure.
run_logged() {
    local name=$1 log=$2; shift 2
    local t0=$SECONDS rc
    mkdir -p "$(dirname "$log")"
    echo "---- $(date -Is) $*" >>"$log"
    "$@" >>"$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && say "  $name: still running, $((SECONDS - t0)) s (log $log)"
    done
    wait "$pid" && rc=0 || rc=$?
    [ "$rc" -eq 0 ] || die_log "$name failed (exit $rc) after $((SECONDS - t0)) s" "$log"
    say "  $name: done in $((SECONDS - t0)) s"
}

# Stamps: a step is skipped when its stamp holds the same key and every output it lists still has the
# recorded sha256. stamp_ok STEP KEY; stamp_write STEP KEY FILE...
stamp_ok() {
    local f=$STAMPS/$1
    [ -f "$f" ] && [ "$(head -n1 "$f")" = "key $2" ] || return 1
    tail -n +2 "$f" | (cd / && sha256sum --check --status) 2>/dev/null
}
stamp_write() {
    local step=$1 key=$2; shift 2
    mkdir -p "$STAMPS"
    { echo "key $key"; sha256sum "$@"; } >"$STAMPS/$step.tmp" && mv "$STAMPS/$step.tmp" "$STAMPS/$step"
}

# pid_alive NAME: the recorded process exists and is not a zombie (PID 1 here may be slow to reap)
# pid_alive NAME: its recorded PID runs, and runs NAME's program (after a reboot the PID may be another's).
pid_alive() {
    local pid st
    [ -f "$PIDS/$1" ] || return 1
    pid=$(cat "$PIDS/$1")
    { read -r _ _ st _ <"/proc/$pid/stat"; } 2>/dev/null || return 1
    [ "$st" != Z ] && [[ $(cmdline "$pid") == *"${1%-[0-9]}"* ]]
}

cmdline() { { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null || true; }

kubectl_admin() { "$BIN/kubectl" --kubeconfig="$KUBECONFIG_OUT" "$@"; }

# start_bg NAME CMD...: start CMD at nice 10 in its own session (it outlives the caller's shell and job),
# output to $LOGS/NAME.log, PID to $PIDS/NAME (what `down` stops).
start_bg() {
    local name=$1; shift
    mkdir -p "$LOGS" "$PIDS"
    rm -f "$PIDS/$name"
    # shellcheck disable=SC2016
    setsid bash -c 'echo $$ >"$0"; exec nice -n 10 "$@"' "$PIDS/$name" "$@" \
        >"$LOGS/$name.log" 2>&1 </dev/null &
    for _ in $(seq 50); do [ -s "$PIDS/$name" ] && break; sleep 0.1; done
    [ -s "$PIDS/$name" ] || die_log "$name did not start" "$LOGS/$name.log"
    say "  started $name (pid $(cat "$PIDS/$name"), log $LOGS/$name.log)"
}

# wait_until SECONDS WHAT NAME CMD...: poll CMD every 0.5 s; fail at once if process NAME dies, or at the timeout.
wait_until() {
    local secs=$1 what=$2 name=$3; shift 3
    local i
    for i in $(seq $((secs * 2))); do
        "$@" >/dev/null 2>&1 && return 0
        pid_alive "$name" || die_log "$name exited while waiting for $what" "$LOGS/$name.log"
        [ $((i % 20)) -eq 0 ] && say "  waiting for $what: $((i / 2)) s"
        sleep 0.5
    done
    die_log "timed out after $secs s waiting for $what" "$LOGS/$name.log"
}
