#!/usr/bin/env bash
# `k8s_cluster.sh build`: everything a test cluster needs, from Debian's packages only, into $ABX_K8S_CACHE.
# Steps (each skipped when its stamp matches its outputs):
#   packages  apt: Go 1.19, containerd, runc, CNI plugins, Debian's reflect2 1.0.2 source, gcc, openssl
#   source    Debian's source package `kubernetes` (upstream v1.20.2 with vendor/), reflect2 1.0.1 -> 1.0.2
#   kube      make kube-apiserver kubelet kube-controller-manager kube-scheduler (nice 19, ~6-10 min on 2 cores)
#   debs      etcd 3.4 and kubectl 1.20 extracted from Debian's .debs (not installed: no init scripts run)
#   images    pause (static, from the kubernetes tree) and busybox as docker-archive tars
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
need_root
mkdir -p "$CACHE" "$BIN" "$IMAGES" "$STAMPS" "$CACHE/logs"
BLOG=$CACHE/logs
T0=$SECONDS

# ---- packages
PKGS=(golang-1.19-go rsync make gcc libc6-dev golang-github-modern-go-reflect2-dev containerd runc
      containernetworking-plugins openssl curl iproute2 python3 dpkg-dev)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$BLOG/apt.log" 2>&1 || {
        run_logged "apt-get update" "$BLOG/apt.log" apt-get update -q
        run_logged "apt-get install" "$BLOG/apt.log" apt-get install -y -q --no-install-recommends "${missing[@]}"
    }
    # containerd's package starts the system containerd; the cluster runs its own per node and needs none.
else
    say "packages: all present"
fi

# ---- private apt config for deb-src and .deb downloads: made from the system's own sources, leaves them untouched
A=$CACHE/apt
aptp() {
    apt-get -o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts="$A/sources.list.d" \
        -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" "$@"
}
apt_private() {
    [ -f "$A/ready" ] && return 0
    mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/sources.list.d"
    : >"$A/sources.list"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] && grep -h '^deb ' "$f" | sed 's/^deb /deb-src /' >>"$A/sources.list"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && sed -E 's/^Types:.*/Types: deb deb-src/' "$f" >"$A/sources.list.d/$(basename "$f")"
    done
    run_logged "apt-get update (private deb-src lists)" "$BLOG/apt.log" aptp update -q
    touch "$A/ready"
}

# ---- source
SRCROOT=$CACHE/src
SRC=$SRCROOT/kubernetes-$K8S_VERSION
RF=/usr/share/gocode/src/github.com/modern-go/reflect2
SRC_KEY="kubernetes $K8S_VERSION debian-source reflect2=$(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
if stamp_ok source "$SRC_KEY"; then
    say "source: cached ($SRC)"
else
    say "source: Debian's source package kubernetes"
    apt_private
    rm -rf "$SRCROOT" && mkdir -p "$SRCROOT"
    (cd "$SRCROOT" && run_logged "apt-get source kubernetes" "$BLOG/source.log" aptp source --download-only kubernetes)
    orig=$(find "$SRCROOT" -maxdepth 1 -name "kubernetes_*.orig.tar.gz" | head -n1)
    [ -f "$orig" ] || die_log "no kubernetes_*.orig.tar.gz after apt-get source" "$BLOG/source.log"
    mkdir "$SRCROOT/unpack"
    run_logged "unpack $(basename "$orig")" "$BLOG/source.log" tar -C "$SRCROOT/unpack" -xzf "$orig"
    mv "$SRCROOT/unpack/"* "$SRC" && rmdir "$SRCROOT/unpack"
    grep -q 'modern-go/reflect2 v1.0.1' "$SRC/go.mod" || die "unexpected $SRC/go.mod: no reflect2 v1.0.1 to swap"
    # reflect2 1.0.1 (vendored) breaks at run time on Go >= 1.18; Debian ships the fixed 1.0.2 source.
    rm -rf "$SRC/vendor/github.com/modern-go/reflect2" && mkdir "$SRC/vendor/github.com/modern-go/reflect2"
    cp "$RF"/*.go "$RF"/*.s "$SRC/vendor/github.com/modern-go/reflect2/"
    sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#g' \
        "$SRC/go.mod" "$SRC/vendor/modules.txt"
    rm -f "$SRCROOT"/kubernetes_*.debian.tar.* "$SRCROOT"/kubernetes_*.dsc
    stamp_write source "$SRC_KEY" "$SRC/go.mod" "$SRC/vendor/modules.txt" "$SRC/build/pause/linux/pause.c"
fi

# ---- kube binaries
KUBE_CMDS=(kube-apiserver kubelet kube-controller-manager kube-scheduler)
GO=/usr/lib/go-1.19/bin
KUBE_KEY="$SRC_KEY go=$($GO/go version | awk '{print $3}') tags=providerless"
if stamp_ok kube "$KUBE_KEY"; then
    say "kube: cached (${KUBE_CMDS[*]})"
else
    say "kube: building ${KUBE_CMDS[*]} with Go 1.19 at nice 19 (about 6-10 min on 2 cores)"
    printf "KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'\nKUBE_GIT_TREE_STATE='clean'\nKUBE_GIT_VERSION='v%s'\nKUBE_GIT_MAJOR='1'\nKUBE_GIT_MINOR='20'\n" \
        "$K8S_VERSION" >"$CACHE/version.env"
    what=""; for c in "${KUBE_CMDS[@]}"; do what+="cmd/$c "; done
    (cd "$SRC" && export PATH=$GO:$PATH GOPROXY=off GOSUMDB=off GOFLAGS=-tags=providerless \
        KUBE_GIT_VERSION_FILE=$CACHE/version.env &&
        run_logged "make ${what% }" "$BLOG/kube-build.log" nice -n 19 make WHAT="${what% }")
    out=$SRC/_output/local/bin/linux/amd64
    outs=()
    for c in "${KUBE_CMDS[@]}"; do
        [ -x "$out/$c" ] || die_log "make finished but $out/$c is missing" "$BLOG/kube-build.log"
        install -m 0755 "$out/$c" "$BIN/$c"; outs+=("$BIN/$c")
    done
    stamp_write kube "$KUBE_KEY" "${outs[@]}"
fi

# ---- etcd, kubectl (and busybox for the image) from .debs
DEBS=(etcd-server kubernetes-client busybox-static)
DEB_KEY="debs"; for d in "${DEBS[@]}"; do DEB_KEY+=" $d=$(apt-cache policy "$d" | awk '/Candidate:/{print $2}')"; done
if stamp_ok debs "$DEB_KEY"; then
    say "debs: cached (etcd, kubectl)"
else
    say "debs: ${DEBS[*]} (extracted, not installed)"
    rm -rf "$CACHE/debs" "$CACHE/pkg" && mkdir -p "$CACHE/debs" "$CACHE/pkg"
    (cd "$CACHE/debs" && run_logged "apt-get download" "$BLOG/debs.log" apt-get download "${DEBS[@]}")
    for d in "$CACHE"/debs/*.deb; do n=$(basename "$d"); n=${n%%_*}; dpkg-deb -x "$d" "$CACHE/pkg/$n"; done
    install -m 0755 "$CACHE/pkg/etcd-server/usr/bin/etcd" "$BIN/etcd"
    install -m 0755 "$CACHE/pkg/kubernetes-client/usr/bin/kubectl" "$BIN/kubectl"
    install -m 0755 "$CACHE/pkg/busybox-static/bin/busybox" "$CACHE/busybox"
    stamp_write debs "$DEB_KEY" "$BIN/etcd" "$BIN/kubectl" "$CACHE/busybox"
fi

# ---- images
IMG_KEY="images $(sha256sum "$HERE/mkimage.py" "$HERE/../../agent_sandbox/backends/kubernetes/image_archive.py" "$SRC/build/pause/linux/pause.c" "$CACHE/busybox" | awk '{printf "%s ", substr($1,1,16)}')"
if stamp_ok images "$IMG_KEY"; then
    say "images: cached (k8s.local/pause:3.6, k8s.local/busybox:1.35)"
else
    say "images: pause and busybox"
    w=$CACHE/imgwork; rm -rf "$w" && mkdir -p "$w/pause/" "$w/busybox/bin" "$w/busybox/tmp" "$w/busybox/workspace"
    gcc -Os -static -o "$w/pause/pause" "$SRC/build/pause/linux/pause.c" >>"$BLOG/images.log" 2>&1 \
        || die_log "gcc -static pause.c failed" "$BLOG/images.log"
    strip "$w/pause/pause"
    cp "$CACHE/busybox" "$w/busybox/bin/busybox"
    for a in $("$w/busybox/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$w/busybox/bin/$a"; done
    chmod 1777 "$w/busybox/tmp"
    python3 "$HERE/mkimage.py" "$w/pause" k8s.local/pause:3.6 "$IMAGES/pause.tar" --cmd '["/pause"]' >>"$BLOG/images.log" 2>&1 \
        || die_log "mkimage.py pause failed" "$BLOG/images.log"
    python3 "$HERE/mkimage.py" "$w/busybox" k8s.local/busybox:1.35 "$IMAGES/busybox.tar" >>"$BLOG/images.log" 2>&1 \
        || die_log "mkimage.py busybox failed" "$BLOG/images.log"
    rm -rf "$w"
    stamp_write images "$IMG_KEY" "$IMAGES/pause.tar" "$IMAGES/busybox.tar"
fi

say "build done in $((SECONDS - T0)) s; binaries in $BIN, images in $IMAGES"
