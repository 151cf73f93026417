#!/usr/bin/env bash
# Sets up everything agent-sandbox needs on a Debian/Ubuntu host, then runs one job:
#   scripts/setup.sh mcp    - the MCP server (STDIO) on the embedded engine
#   scripts/setup.sh test   - the test suite
#   scripts/setup.sh        - set up only
# Idempotent: a second run only checks. Needs root (apt, mounts, runc).
set -euo pipefail
cd "$(dirname "$0")/.."

job="${1:-}"
[ $# -gt 0 ] && shift

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: run as root (it installs runc and mounts sandbox filesystems)" >&2
    exit 1
fi

say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }
# A step's output only if it fails: pip's chatter (notices of the build tools, this
# machine's index options) on success is noise.
quietly() {
    local log rc=0
    log=$(mktemp)
    "$@" >"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || cat "$log" >&2
    rm -f "$log"
    return "$rc"
}

# System packages: the OCI runtime, ext4 tools for sandbox disks, nft and ip (a sandbox's
# network policy is an nftables table in its netns sending every connection to the
# host-side policy proxy; docs/network.md), the distro Python that the base template's
# guest agent runs on, and newuidmap/newgidmap (uidmap) so that ordinary users' rootless
# sandboxes get their /etc/subuid ranges.
packages=(runc e2fsprogs util-linux iproute2 nftables python3 python3-venv uidmap)
# The test suite also builds templates from a static busybox and from OCI images, makes
# certificates for the network tests' stand-in HTTPS server, and runs the surface tests
# on the memory backend, whose sandboxes bwrap starts; port share links are opened in a
# real headless browser (Debian's Chromium, driven by Selenium through chromedriver).
[ "$job" = test ] && packages+=(busybox-static umoci skopeo openssl bubblewrap chromium
                                chromium-driver)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
        "${missing[@]}" >/dev/null
fi

# The project itself, in its own virtualenv.
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import agent_sandbox" 2>/dev/null \
        || [ pyproject.toml -nt .venv/.installed ]; then
    say "installing abx-sandbox (agent_sandbox, abx) and its dependencies"
    quietly .venv/bin/python -m pip install -q --upgrade pip
    # This package was the distribution agent-sandbox before; on the public index that name
    # is an unrelated project with the same import name. Neither may stay beside it.
    .venv/bin/python -m pip uninstall -q -y agent-sandbox >/dev/null 2>&1 || true
    quietly .venv/bin/python -m pip install -q -e '.[test]'
    touch .venv/.installed
fi
# Bytecode of the package, made once here: a Python told not to write it (CI runners set
# PYTHONDONTWRITEBYTECODE) still reads it, so no `abx` or server compiles the package
# at each start. A second or two; later runs compile only what changed.
.venv/bin/python -m compileall -q -j 0 agent_sandbox >/dev/null || true

# Keep the root engine's sandbox ids (100000+65536) out of the subordinate ranges that
# useradd hands to new users (their rootless sandboxes would share host ids otherwise).
.venv/bin/python -m agent_sandbox.backends.runc.host.subids

# runc gives each container its own session keyring, charged to root: the default quota
# (200 keys) would stop a host at ~200 sandboxes. Raised only, never lowered.
if [ "$(cat /proc/sys/kernel/keys/root_maxkeys 2>/dev/null || echo 0)" -lt 100000 ]; then
    sysctl -qw kernel.keys.root_maxkeys=100000 kernel.keys.root_maxbytes=25000000 \
        || say "warning: could not raise kernel.keys.root_maxkeys (sandboxes cap near 200)"
fi

# The code-interpreter-v1 template (a Python environment with a Jupyter kernel, Bash's
# kernel, Deno's for JavaScript and TypeScript from the npm registry where npm is, R and
# IRkernel from Debian's packages where apt can fetch them), from the package index once, into the shared templates directory (ABX_SHARED_TEMPLATES_DIR,
# default /var/lib/agent-sandbox-templates): every user of the host, rootless ones too,
# runs it without a copy of their own. Later runs only check it (well under a second).
# Offline the setup still succeeds: run_command and the file tools work on base.
say "code-interpreter-v1 template (pip output below; about a minute the first time)"
if ! .venv/bin/python -m agent_sandbox.backends.runc.templates.code_interpreter; then
    say "warning: code-interpreter-v1 is not built (see above): run_code needs it, the rest" \
        "works. Later, where the index is reachable: .venv/bin/abx template build" \
        "code-interpreter-v1 --index-url URL"
fi

# Memory snapshots (pause keeping memory, snapshot, fork) need CRIU >= 4.2: Debian's 3.17
# fails on recent kernels, so scripts/criu_build.sh builds 4.2 from sid's source package
# into /var/cache/abx-criu once (about a minute on 2 cores; seconds once cached), or uses a
# distro CRIU new enough. Without it everything else works; pause freezes instead and
# snapshot/fork say how to fix it (`abx doctor` too).
say "CRIU for memory snapshots (built once into /var/cache/abx-criu)"
bash scripts/criu_build.sh >/dev/null || say "warning: no working CRIU (see above): pause" \
    "freezes instead of checkpointing, snapshot and fork refuse until scripts/criu_build.sh works"

# The Kubernetes tests run on a real 3-node cluster the project builds from Debian's
# packages (scripts/k8s_cluster.sh, docs/kubernetes-lab.md): built once per machine into
# /var/cache/abx-k8s (about 6 minutes on 2 idle cores, seconds once cached), started for
# the run and stopped after it (left running if it already was). If it cannot be built or
# started here, the Kubernetes tests skip with the reason written below.
# The quick tier (`setup.sh test -m quick`: the unit tests and the surfaces on the memory
# backend, a few minutes) needs no cluster.
quick=""
for arg in "$@"; do [ "$arg" = quick ] && quick=1; done
k8s_started=""
if [ "$job" = test ] && [ -z "$quick" ]; then
    k8s_note=/var/lib/abx-k8s/setup-skip-reason
    mkdir -p /var/lib/abx-k8s && rm -f "$k8s_note"
    if bash scripts/k8s_cluster.sh status >/dev/null 2>&1; then
        say "test cluster: already up"
    else
        say "test cluster: build (cached after the first time) and start"
        if ! bash scripts/k8s_cluster.sh build; then
            echo "the test cluster could not be built (scripts/k8s_cluster.sh build failed;" \
                "its output is in the setup log above)" >"$k8s_note"
        else
            # What an unclean stop (a reboot, a killed run) left is cleared first; a failed start is
            # cleared and tried once more; a second failure's last words become the skip reason.
            up_log=/var/lib/abx-k8s/setup-up.log
            k8s_up() {
                bash scripts/k8s_cluster.sh down >/dev/null 2>&1 || true
                bash scripts/k8s_cluster.sh up 2> >(tee "$up_log" >&2)
            }
            if k8s_up || { say "test cluster: start failed; clearing and trying once more"; k8s_up; }; then
                k8s_started=1
            else
                echo "the test cluster did not start: $(grep -a 'k8s_cluster:' "$up_log" | tail -1 \
                    | sed 's/\x1b\[[0-9;]*m//g') (logs in /var/lib/abx-k8s/logs)" >"$k8s_note"
                bash scripts/k8s_cluster.sh down >/dev/null 2>&1 || true
            fi
        fi
    fi
fi

case "$job" in
    "") say "set up; run 'scripts/setup.sh mcp' or 'scripts/setup.sh test'" ;;
    mcp) exec .venv/bin/python -m agent_sandbox.surfaces.mcp "$@" ;;
    test)
        rc=0
        # Parallel workers: most tests wait (on sandboxes, servers, the cluster), so more
        # workers than cores pay; a test file is one group (tests/conftest.py).
        started=$(date +%s)
        .venv/bin/python -m pytest -q -rs --durations=25 -n "${ABX_TEST_WORKERS:-4}" "$@" || rc=$?
        say "tests took $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s"
        if [ -n "$k8s_started" ]; then
            bash scripts/k8s_cluster.sh down >/dev/null 2>&1 || say "warning: test cluster" \
                "not stopped cleanly (scripts/k8s_cluster.sh status)"
        fi
        exit "$rc" ;;
    *) echo "setup.sh: unknown job '$job' (use mcp or test)" >&2; exit 2 ;;
esac
