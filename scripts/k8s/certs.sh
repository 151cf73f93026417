#!/usr/bin/env bash
# `up` helper: a CA and every certificate/kubeconfig a loopback-only cluster of $NODES nodes needs (openssl only),
# into $ABX_K8S_STATE/pki. Kept across `up`s (reused while the CA has > 30 days left); `down --purge` removes it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
mkdir -p "$PKI" && cd "$PKI"
if [ -f ca.crt ] && [ -f "kubelet-$NODES.kubeconfig" ] && openssl x509 -checkend 2592000 -noout -in ca.crt >/dev/null; then
    exit 0
fi
rm -f ./*.crt ./*.key ./*.kubeconfig ./*.srl
openssl genrsa -out ca.key 2048 2>/dev/null
openssl req -x509 -new -nodes -key ca.key -subj "/CN=abx-k8s-ca" -days 365 -out ca.crt
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
sign() { # name CN O SANs(or empty) extendedKeyUsage
    local n=$1 cn=$2 o=$3 san=$4 eku=$5 subj
    openssl genrsa -out "$n.key" 2048 2>/dev/null
    subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
    openssl req -new -key "$n.key" -subj "$subj" -out "$n.csr"
    { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=$eku"; [ -n "$san" ] && echo "subjectAltName=$san"; } >"$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile "$n.ext" \
        -out "$n.crt" 2>/dev/null
    rm -f "$n.csr" "$n.ext"
}
sign apiserver kube-apiserver "" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1" serverAuth
sign apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" clientAuth
sign admin kubernetes-admin system:masters "" clientAuth
sign controller-manager system:kube-controller-manager "" "" clientAuth
sign scheduler system:kube-scheduler "" "" clientAuth
for i in $(seq "$NODES"); do
    sign "kubelet-$i" "system:node:127.0.0.$i" system:nodes "" clientAuth
    sign "kubelet-$i-serving" "127.0.0.$i" "" "IP:127.0.0.$i,DNS:localhost" serverAuth
done
b64() { base64 -w0 "$1"; }
kc() { # file user cert: self-contained kubeconfig (certificates embedded)
    cat >"$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: abx-k8s, cluster: {server: "$API", certificate-authority-data: $(b64 ca.crt)}}]
users: [{name: $2, user: {client-certificate-data: $(b64 "$3.crt"), client-key-data: $(b64 "$3.key")}}]
contexts: [{name: abx-k8s, context: {cluster: abx-k8s, user: $2, namespace: default}}]
current-context: abx-k8s
KC
    chmod 600 "$1.kubeconfig"
}
kc admin admin admin
kc controller-manager kube-controller-manager controller-manager
kc scheduler kube-scheduler scheduler
for i in $(seq "$NODES"); do kc "kubelet-$i" "system:node:127.0.0.$i" "kubelet-$i"; done
chmod 600 ./*.key
