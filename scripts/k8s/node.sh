#!/usr/bin/env bash
# `up` helper: node N (1..9) = its own containerd (CRI, runc, bridge CNI 10.244.N.0/24 on bridge abxk8sbrN)
# + a kubelet named 127.0.0.N serving on 127.0.0.N:10250, its cgroups under /abxk8snodeN.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
N=${1:?node number}
R=$RUN/node$N
SOCK=$R/containerd/containerd.sock
mkdir -p "$R/cni" "$R/containerd"

cat >"$R/containerd.toml" <<T
version = 2
root = "$R/containerd/root"
state = "$R/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$R/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s.local/pause:3.6"
  enable_selinux = false
  # Where root lacks CAP_SYS_RESOURCE (this VM), lowering oom_score_adj (pause asks -998) kills runc init:
  # "runc create failed: ... can't get final child's PID from pipe: EOF" for every pod.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$R/cni"
T
cat >"$R/cni/10-abxk8s.conflist" <<T
{"cniVersion": "0.4.0", "name": "abxk8s$N", "plugins": [
  {"type": "bridge", "bridge": "abxk8sbr$N", "isGateway": true, "ipMasq": false, "hairpinMode": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$N.0/24"}]], "dataDir": "$R/cni-ipam"}}]}
T

# The kubelet's --cgroup-root must already exist in every hierarchy: on a v1/hybrid host that is one
# directory per mounted controller (cpuset needs its cpus/mems filled in before anything can join it).
if [ -d /sys/fs/cgroup/memory ]; then
    for c in $CGROUP_CONTROLLERS; do
        [ -d "/sys/fs/cgroup/$c" ] && mkdir -p "/sys/fs/cgroup/$c/abxk8snode$N"
    done
    cs=/sys/fs/cgroup/cpuset
    cat $cs/cpuset.cpus >"$cs/abxk8snode$N/cpuset.cpus"
    cat $cs/cpuset.mems >"$cs/abxk8snode$N/cpuset.mems"
else  # unified v2 only
    mkdir -p "/sys/fs/cgroup/abxk8snode$N"
fi

start_bg "containerd-$N" /usr/bin/containerd --config "$R/containerd.toml"
wait_until 30 "containerd-$N socket" "containerd-$N" test -S "$SOCK"
for img in "$IMAGES"/*.tar; do
    ctr --address "$SOCK" -n k8s.io images import "$img" >>"$LOGS/containerd-$N.log" 2>&1 \
        || die_log "ctr images import $img into node $N failed" "$LOGS/containerd-$N.log"
done

cat >"$R/kubelet.yaml" <<T
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.$N
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.$N
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $PKI/ca.crt}}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-$N-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-$N-serving.key
cgroupDriver: cgroupfs
cgroupRoot: /abxk8snode$N
cgroupsPerQOS: true
failSwapOn: false
makeIPTablesUtilChains: false
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
maxPods: 60
# every pod's processes capped (a fork bomb in a sandbox stays in its pod)
podPidsLimit: 1024
serializeImagePulls: false
# report a change of node condition within 2 s (default 10 s): a node registers NotReady, its CNI config
# loads a moment later, and Ready then came one full period after
nodeStatusUpdateFrequency: 2s
T
start_bg "kubelet-$N" "$BIN/kubelet" --config="$R/kubelet.yaml" --kubeconfig="$PKI/kubelet-$N.kubeconfig" \
    --root-dir="$R/kubelet" --hostname-override="127.0.0.$N" \
    --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" --v=1
