#!/usr/bin/env bash
# `up` helper: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, all on 127.0.0.1.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
mkdir -p "$RUN"

start_bg etcd "$BIN/etcd" --name abx-k8s --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster abx-k8s=http://127.0.0.1:23800 --quota-backend-bytes=2147483648
etcd_healthy() { curl -sf "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
wait_until 30 "etcd /health" etcd etcd_healthy

# --endpoint-reconciler-type=none: the `kubernetes` service's endpoints would point at 127.0.0.1, useless in pods.
start_bg kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --secure-port=6443 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --service-cluster-ip-range=10.96.0.0/24 --allow-privileged=true --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" --profiling=false
api_ready() { [ "$(curl -sf --cacert "$PKI/ca.crt" "$API/readyz")" = ok ]; }
wait_until 300 "kube-apiserver /readyz" kube-apiserver api_ready

# No nodeipam/route/service controllers: pod CIDRs are fixed per node by its bridge CNI config; no cloud.
# The volume binder resyncs every 1 s (default 15 s: a new claim on its pre-made hostPath volume waited up to
# 15 s, so every sandbox create did); a node silent for 20 s is NotReady (default 40 s).
start_bg kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --controllers='*,-nodeipam,-cloud-node-lifecycle,-service,-route' --profiling=false \
    --pvclaimbinder-sync-period=1s --node-monitor-period=2s --node-monitor-grace-period=20s
start_bg kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig="$PKI/scheduler.kubeconfig" --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false
