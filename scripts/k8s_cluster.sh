#!/usr/bin/env bash
# The project's test cluster: a real 3-node Kubernetes v1.20.2 on this host, built from Debian's packages only.
#   scripts/k8s_cluster.sh build   install apt packages, build/cache binaries and images (ABX_K8S_CACHE)
#   scripts/k8s_cluster.sh up      certs, etcd, control plane, 3 nodes; waits until Ready; kubeconfig path on stdout
#   scripts/k8s_cluster.sh down    stop everything by recorded PID; remove its mounts, bridges, netns, cgroups
#   scripts/k8s_cluster.sh status  what runs
#   scripts/k8s_cluster.sh load FILE.tar...  import image tars into every node's containerd (abx template push --load-lab)
# Root only. docs/kubernetes-lab.md says more.
set -euo pipefail
D=$(cd "$(dirname "$0")/k8s" && pwd)
case "${1:-}" in
    build | up | down | status | load) cmd=$1; shift; exec "$D/$cmd.sh" "$@" ;;
    *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
