#!/usr/bin/env bash
# `k8s_cluster.sh down [--purge]`: stop the cluster `up` started, only through the PIDs it recorded (plus the
# containerd shims of its own containerds, found by their socket path), then remove what it left: pod network
# namespaces (10.244.N.x), mounts under $ABX_K8S_STATE, bridges abxk8sbrN, cgroups /abxk8snodeN.
# Idempotent. --purge also removes $ABX_K8S_STATE (certificates included); the build cache stays.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
need_root
purge=0; [ "${1:-}" = --purge ] && purge=1

# stop NAME...: SIGTERM each recorded PID (if it still runs the recorded program) at once, SIGKILL what still
# runs after 10 s.
stop() {
    local name pid t=$SECONDS
    local -A pids=()
    for name in "$@"; do
        [ -f "$PIDS/$name" ] || continue
        pid=$(cat "$PIDS/$name")
        if pid_alive "$name"; then
            kill "$pid" 2>/dev/null || true
            pids[$name]=$pid
        fi
        rm -f "$PIDS/$name"
    done
    for name in "${!pids[@]}"; do
        while kill -0 "${pids[$name]}" 2>/dev/null && [ $((SECONDS - t)) -lt 10 ]; do sleep 0.2; done
        if kill -0 "${pids[$name]}" 2>/dev/null; then
            kill -9 "${pids[$name]}" 2>/dev/null || true; say "  killed $name (${pids[$name]}) after 10 s"
        else say "  stopped $name (${pids[$name]})"; fi
    done
}

# 1. pods first, through the API (immediate deletion: a graceful one waits on the kubelets' status sync,
#    10 s or more per pod), then a bounded wait (15 s) for the kubelets to tear down the containers and
#    their pod networks themselves (CNI DEL); what remains is killed below.
tasks_left() {
    local n S c=0
    for n in $(seq 9); do
        S=$RUN/node$n/containerd/containerd.sock
        [ -S "$S" ] && c=$((c + $( { ctr --address "$S" -n k8s.io tasks ls -q 2>/dev/null || true; } | wc -l)))
    done
    echo "$c"
}
if pid_alive kube-apiserver && [ -f "$KUBECONFIG_OUT" ]; then
    say "deleting every pod"
    kubectl_admin delete pods --all --all-namespaces --force --grace-period=0 >/dev/null 2>&1 || true
    t=$SECONDS
    for _ in $(seq 30); do [ "$(tasks_left)" -eq 0 ] && break; sleep 0.5; done
    say "  $(tasks_left) containers left after $((SECONDS - t)) s"
fi
say "stopping kubelets"
stop kubelet-{1..9}

# 2. whatever containers remain, through each node's own containerd, then the containerds and their shims
for n in $(seq 9 -1 1); do
    S=$RUN/node$n/containerd/containerd.sock
    if [ -S "$S" ] && pid_alive "containerd-$n"; then
        c="ctr --address $S -n k8s.io"
        for t in $($c tasks ls -q 2>/dev/null); do $c tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
        sleep 0.5
        for t in $($c tasks ls -q 2>/dev/null); do $c tasks rm -f "$t" >/dev/null 2>&1 || true; done
        for t in $($c containers ls -q 2>/dev/null); do $c containers rm "$t" >/dev/null 2>&1 || true; done
    fi
    stop "containerd-$n"
    [ -d "$RUN/node$n" ] || continue
    # shims outlive containerd by design; ours carry this node's socket path on their command line
    for p in /proc/[0-9]*; do
        read -r comm 2>/dev/null <"$p/comm" || continue
        [[ $comm == containerd-shim* ]] || continue
        [[ $(cmdline "${p#/proc/}") == *" -address $S "* ]] || continue
        if kill -9 "${p#/proc/}" 2>/dev/null; then say "  killed containerd-shim ${p#/proc/} of node $n"; fi
    done
done
say "stopping control plane"
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd

# 3. leftovers: pod netns the CNI could not tear down (only those holding our 10.244.N.x addresses)
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    if ip -n "$ns" -4 -br addr 2>/dev/null | grep -qE " 10\.244\.[1-9]\."; then
        if ip netns del "$ns" 2>/dev/null; then say "  removed netns $ns"; fi
    fi
done
{ grep " $STATE/" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "  could not unmount $m"
done
for n in $(seq 1 9); do
    if ip link show "abxk8sbr$n" >/dev/null 2>&1 && ip link del "abxk8sbr$n"; then say "  removed bridge abxk8sbr$n"; fi
    for c in $CGROUP_CONTROLLERS ""; do
        d=/sys/fs/cgroup/${c:+$c/}abxk8snode$n
        [ -d "$d" ] || continue
        find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        if [ -d "$d" ]; then say "  cgroup $d still has processes: $(tr '\n' ' ' <"$d/cgroup.procs")"; fi
    done
done
if [ "$purge" -eq 1 ]; then rm -rf "$STATE" && say "removed $STATE"; fi
rm -f "$KUBECONFIG_OUT"
left=$(find "$PIDS" -mindepth 1 -printf "%f " 2>/dev/null || true)
[ -z "$left" ] || die "still recorded (not stopped): $left"
say "down"
