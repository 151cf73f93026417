#!/usr/bin/env bash
# `k8s_cluster.sh status`: each recorded process (alive or not), apiserver readiness, nodes. Exit 0 when all is up,
# 3 when nothing runs, 1 when partly up.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
ALL=(etcd kube-apiserver kube-controller-manager kube-scheduler)
for n in $(seq "$NODES"); do ALL+=("containerd-$n" "kubelet-$n"); done
alive=0
for p in "${ALL[@]}"; do
    if pid_alive "$p"; then
        alive=$((alive + 1)); printf '%-26s running  pid %s\n' "$p" "$(cat "$PIDS/$p")"
    elif [ -f "$PIDS/$p" ]; then printf '%-26s DEAD     log %s\n' "$p" "$LOGS/$p.log"
    else printf '%-26s stopped\n' "$p"; fi
done
if [ "$alive" -eq 0 ]; then echo "cluster: down (cache ${CACHE})"; exit 3; fi
if curl -sf --cacert "$PKI/ca.crt" "$API/readyz" >/dev/null 2>&1; then
    echo "apiserver: ready at $API; kubeconfig $KUBECONFIG_OUT"
    kubectl_admin get nodes -o wide 2>&1 || true
else
    echo "apiserver: not ready (log $LOGS/kube-apiserver.log)"
fi
[ "$alive" -eq "${#ALL[@]}" ] && echo "cluster: up" && exit 0
echo "cluster: partly up ($alive of ${#ALL[@]} processes)"; exit 1
