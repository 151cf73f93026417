#!/usr/bin/env bash
# `k8s_cluster.sh up`: certificates, etcd + control plane, $ABX_K8S_NODES (3) nodes; waits for every node Ready
# and the default service account. Writes the admin kubeconfig to $ABX_K8S_STATE/kubeconfig and prints its path
# on stdout (progress goes to stderr). Already up: prints the path again. Needs `build` first.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
need_root
T0=$(date +%s.%N)
since() { printf '%.1f s' "$(echo "$(date +%s.%N) - $T0" | bc)"; }
ALL=(etcd kube-apiserver kube-controller-manager kube-scheduler)
for n in $(seq "$NODES"); do ALL+=("containerd-$n" "kubelet-$n"); done

# ---- already running?
alive=0; for p in "${ALL[@]}"; do pid_alive "$p" && alive=$((alive + 1)); done
if [ "$alive" -eq "${#ALL[@]}" ] && [ -f "$KUBECONFIG_OUT" ]; then
    say "already up ($alive processes); status: $(dirname "$0")/../k8s_cluster.sh status"
    echo "$KUBECONFIG_OUT"; exit 0
fi
[ "$alive" -eq 0 ] || die "partly up ($alive of ${#ALL[@]} processes alive): run 'scripts/k8s_cluster.sh down' first"
if grep -q " $STATE/" /proc/mounts; then
    die "mounts left under $STATE from an earlier cluster: run 'scripts/k8s_cluster.sh down' first"
fi

# ---- preflight: what `build` makes, what the host must offer
for b in kube-apiserver kubelet kube-controller-manager kube-scheduler etcd kubectl; do
    [ -x "$BIN/$b" ] || die "$BIN/$b missing: run 'scripts/k8s_cluster.sh build' first"
done
for f in "$IMAGES/pause.tar" "$IMAGES/busybox.tar" /usr/bin/containerd /usr/bin/ctr /usr/sbin/runc \
    /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
    [ -e "$f" ] || die "$f missing: run 'scripts/k8s_cluster.sh build' first"
done
[[ "$NODES" =~ ^[1-9]$ ]] || die "ABX_K8S_NODES must be 1..9 (got $NODES)"
busy=$(ss -Hltn 2>/dev/null | awk '{print $4}' \
    | grep -E "^127\.0\.0\.[0-9]+:(6443|$ETCD_PORT|23800|10257|10259|10250|10248)$" || true)
[ -z "$busy" ] || die "ports already in use (another cluster?): $(echo "$busy" | tr '\n' ' ')"

# ---- fresh run state (pki kept)
rm -rf "$RUN" "$LOGS" "$PIDS" "$KUBECONFIG_OUT"
mkdir -p "$RUN" "$LOGS" "$PIDS"
say "certificates ($PKI)"
"$HERE/certs.sh" >"$LOGS/certs.log" 2>&1 || die_log "certificate generation failed" "$LOGS/certs.log"
say "control plane (certificates ready at $(since))"
"$HERE/control_plane.sh"
for n in $(seq "$NODES"); do
    say "node $n (127.0.0.$n) at $(since)"
    "$HERE/node.sh" "$n"
done

# ---- wait: every node Ready, then the default service account (pods cannot be created before it exists)
cp "$PKI/admin.kubeconfig" "$KUBECONFIG_OUT.tmp" && mv "$KUBECONFIG_OUT.tmp" "$KUBECONFIG_OUT"
ready_count() { { kubectl_admin get nodes --no-headers 2>/dev/null || true; } | awk '$2 == "Ready"' | wc -l; }
say "waiting for $NODES Ready nodes (kubelets started at $(since))"
for i in $(seq 480); do
    [ "$(ready_count)" -eq "$NODES" ] && break
    for n in $(seq "$NODES"); do
        pid_alive "kubelet-$n" || die_log "kubelet-$n exited before its node was Ready" "$LOGS/kubelet-$n.log"
        pid_alive "containerd-$n" || die_log "containerd-$n exited" "$LOGS/containerd-$n.log"
    done
    if [ "$i" -eq 480 ]; then
        kubectl_admin get nodes >&2 || true
        die "timed out after 240 s: $(ready_count) of $NODES nodes Ready; read $LOGS/kubelet-N.log of the missing ones"
    fi
    [ $((i % 20)) -eq 0 ] && say "  $(ready_count) of $NODES Ready after $((i / 2)) s"
    sleep 0.5
done
say "  $NODES Ready at $(since)"
wait_until 60 "the default service account" kube-controller-manager kubectl_admin get serviceaccount default
kubectl_admin get nodes -o wide >&2
say "cluster up: $NODES nodes Ready and the default service account in $(since); kubeconfig:"
echo "$KUBECONFIG_OUT"
