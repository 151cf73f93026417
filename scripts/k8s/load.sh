#!/usr/bin/env bash
# `k8s_cluster.sh load FILE.tar...`: import docker-archive / OCI image tars into every node's containerd
# (namespace k8s.io, unpacked for its snapshotter), all nodes at once. Pods use them with imagePullPolicy: Never.
# Prints each imported reference. Exit 1 naming the node and its log when an import fails.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
need_root
[ "$#" -ge 1 ] || die "usage: k8s_cluster.sh load FILE.tar..."
for f in "$@"; do [ -f "$f" ] || die "$f is not a file (give docker-archive or OCI image tars)"; done
mkdir -p "$LOGS"
pids=()
for n in $(seq "$NODES"); do
    sock=$RUN/node$n/containerd/containerd.sock
    [ -S "$sock" ] || die "node $n has no containerd socket ($sock): is the cluster up? (k8s_cluster.sh status)"
    ( for f in "$@"; do
          echo "---- $(date -Is) import $f" >>"$LOGS/load-$n.log"
          ctr --address "$sock" -n k8s.io images import "$f" >>"$LOGS/load-$n.log" 2>&1 || exit 1
      done ) &
    pids+=("$!")
done
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        failed=1
        printf '\033[1;31mk8s_cluster: import into node %s failed\033[0m; read %s:\n' "$((i + 1))" "$LOGS/load-$((i + 1)).log" >&2
        tail -n 5 "$LOGS/load-$((i + 1)).log" | sed 's/^/   | /' >&2
    fi
done
[ "$failed" -eq 0 ] || exit 1
say "imported into $NODES nodes: $*"
