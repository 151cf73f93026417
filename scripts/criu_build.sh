#!/usr/bin/env bash
# Builds a CRIU that works on this host's kernel into $ABX_CRIU_CACHE (default /var/cache/abx-criu):
# bin/criu, used by memory snapshots (pause keeping memory, snapshot, fork; docs/snapshots.md).
#   scripts/criu_build.sh          build once, then only check (seconds); path of the binary on stdout
# Bookworm's CRIU 3.17 fails `criu check` on recent kernels (vDSO layout) and trixie's 4.1 cannot dump
# an inet socket, so CRIU 4.2.x is built from Debian sid's source package (the upstream tarball) with
# bookworm's build dependencies. A distro CRIU >= 4.2 that passes `criu check` is used instead when present.
# The deb-src list for sid is private to this cache (apt -o Dir::Etc::...): the system's sources stay untouched.
# CRIU caches what it learns of the kernel (~50 ms of every dump and restore) only on a tmpfs: the build
# keeps it in $CACHE/run, which the engine mounts as one (a host whose /run is not a tmpfs has none).
set -euo pipefail
CACHE=${ABX_CRIU_CACHE:-/var/cache/abx-criu}
OUT=$CACHE/bin/criu
RUNDIR=$CACHE/run
LOG=$CACHE/build.log
say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31mcriu_build: %s\033[0m\n' "$*" >&2; [ -f "$LOG" ] && tail -n 15 "$LOG" | sed 's/^/   | /' >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (it installs build dependencies)"

works() { "$1" --version >/dev/null 2>&1 && "$1" check >/dev/null 2>&1; }
version_ok() { # CRIU >= 4.2
    local v; v=$("$1" --version 2>/dev/null | awk '/^Version:/ {print $2}')
    [ -n "$v" ] && [ "$(printf '%s\n4.2\n' "$v" | sort -V | head -n1)" = 4.2 ]
}
if [ -x "$OUT" ] && works "$OUT" && grep -aqF "$RUNDIR/criu.kdat" "$OUT"; then echo "$OUT"; exit 0; fi
for c in /usr/sbin/criu /usr/local/sbin/criu; do
    if [ -x "$c" ] && version_ok "$c" && works "$c"; then echo "$c"; exit 0; fi
done

mkdir -p "$CACHE/bin" && chmod 755 "$CACHE" "$CACHE/bin"
: >"$LOG"
DEPS=(gcc make pkg-config libc6-dev libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler
      python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev dpkg-dev)
missing=()
for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "criu: installing build dependencies ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 || {
        apt-get update -q >>"$LOG" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 \
            || die "apt-get install of CRIU's build dependencies failed (log $LOG)"
    }
fi

# sid's deb-src only, in a private apt state (lists, cache) under the cache directory.
A=$CACHE/apt
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/sources.list.d"
printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main\n' \
    >"$A/sources.list"
aptp() {
    apt-get -o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts="$A/sources.list.d" \
        -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" "$@"
}
say "criu: Debian sid's source package (private deb-src list in $A)"
aptp update -q >>"$LOG" 2>&1 || die "apt-get update of the private sid deb-src list failed (log $LOG)"
SRCROOT=$CACHE/src
rm -rf "$SRCROOT" && mkdir -p "$SRCROOT"
# Only the upstream tarball is built (the Debian packaging is not needed): a mirror missing
# the .debian.tar fails apt-get source after the tarball is down, which is enough.
(cd "$SRCROOT" && aptp source --download-only criu >>"$LOG" 2>&1) || true
orig=$(find "$SRCROOT" -maxdepth 1 -name 'criu_*.orig.tar.*' | head -n1)
[ -f "$orig" ] || die "no criu_*.orig.tar.* after apt-get source (log $LOG)"
mkdir "$SRCROOT/unpack" && tar -C "$SRCROOT/unpack" -xf "$orig"
src=$(find "$SRCROOT/unpack" -mindepth 1 -maxdepth 1 -type d | head -n1)
say "criu: make criu in $src (about 30-60 s on 2 cores)"
(cd "$src" && nice -n 10 make -j"$(nproc)" criu RUNDIR="$RUNDIR" >>"$LOG" 2>&1) || die "make criu failed (log $LOG)"
mkdir -p -m 0700 "$RUNDIR"
install -m 0755 "$src/criu/criu" "$OUT.new" && mv "$OUT.new" "$OUT"
rm -rf "$SRCROOT/unpack"
works "$OUT" || die "the built $OUT fails 'criu check' on this kernel: run '$OUT check' to see why"
say "criu: $("$OUT" --version | head -n1) built into $OUT"
echo "$OUT"
