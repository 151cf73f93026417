"""What a network policy costs: connection setup and a 10 MB download from inside a
sandbox whose policy is `full`, a one-name allowlist and a long allowlist (the registries
preset plus 200 names), and the same client on the host as the floor.

Every connection of a networked sandbox goes through its host-side proxy whatever the
policy, so `full` is the reference: the allowlist's added latency is the cost of the
policy itself (matching the name, checking the address). "The internet" is an HTTP server
on 127.0.0.77, opened to sandboxes with ABX_NETWORK_OPEN_RANGES and named `bench.test`
with ABX_NETWORK_HOSTS (set by this script). The client inside reaches it through the
explicit proxy (10.255.255.1:3128, absolute-form HTTP) by default; ``--transparent``
connects to the name directly instead (DNS answered by the proxy, TCP redirected to it).

Run by hand, as root, from the repository root::

    .venv/bin/python bench/network.py [--n 50] [--downloads 7] [--mb 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ms, median, progress, table  # noqa: E402

ADDRESS, NAME = "127.0.0.77", "bench.test"
GATEWAY, PROXY_PORT = "10.255.255.1", 3128  # the design's fixed names
SETUP_TARGET_MS = 1.0  # an allowlist adds at most this to a connection's setup (p50)
DOWNLOAD_TARGET = 0.05  # ...and at most 5% to a 10 MB download (p50)
CHUNK = 1 << 16

# Inside the sandbox (and on the host for the floor): time N fresh connections, each a
# tiny GET, then K downloads of /blob; print the milliseconds as JSON.
CLIENT = r"""
import http.client, json, sys, time
mode, host, gateway = sys.argv[1], sys.argv[2], sys.argv[3]
port, proxy_port, n, k = (int(a) for a in sys.argv[4:8])
def get(path):
    if mode == "proxy":
        conn = http.client.HTTPConnection(gateway, proxy_port, timeout=30)
        conn.request("GET", f"http://{host}:{port}{path}")
    else:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", path)
    r = conn.getresponse()
    size = 0
    while True:
        chunk = r.read(1 << 16)
        if not chunk:
            break
        size += len(chunk)
    conn.close()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status} {r.reason}")
    return size
out = {"setup": [], "download": [], "bytes": 0}
get("/tiny")  # warm: the name resolved, the proxy's first connection made
for _ in range(n):
    t = time.perf_counter(); get("/tiny"); out["setup"].append((time.perf_counter() - t) * 1000)
for _ in range(k):
    t = time.perf_counter(); out["bytes"] = get("/blob")
    out["download"].append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def start_server(size: int) -> tuple[ThreadingHTTPServer, int]:
    blob = os.urandom(size)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = blob if self.path == "/blob" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            view = memoryview(body)
            for start in range(0, len(body), CHUNK):
                self.wfile.write(view[start:start + CHUNK])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((ADDRESS, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def in_sandbox(policy: object, mode: str, port: int, n: int, k: int) -> dict[str, Any]:
    from agent_sandbox import Sandbox

    with Sandbox.create(network=policy, memory_mb=256) as sb:
        sb.files.write("/tmp/client.py", CLIENT)
        host = NAME
        r = sb.commands.run(f"python3 /tmp/client.py {mode} {host} {GATEWAY} {port} "
                            f"{PROXY_PORT} {n} {k}", timeout=600)
        if r.exit_code != 0:
            raise RuntimeError(f"the client in a sandbox with network {policy!r} failed "
                               f"(exit {r.exit_code}): {(r.stderr or r.stdout)[-600:]}")
        return json.loads(r.stdout)


def on_host(port: int, n: int, k: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(CLIENT)
        f.flush()
        out = subprocess.run([sys.executable, f.name, "direct", ADDRESS, GATEWAY, str(port),
                              str(PROXY_PORT), str(n), str(k)], capture_output=True, text=True,
                             timeout=600, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50, help="connections timed per policy")
    parser.add_argument("--downloads", type=int, default=7, help="downloads per policy")
    parser.add_argument("--mb", type=int, default=10, help="download size (MB)")
    parser.add_argument("--transparent", action="store_true",
                        help="connect to the name directly, not through the explicit proxy")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the embedded engine)")
    server, port = start_server(args.mb * 1024 * 1024)
    # Read by the engine's settings when the first sandbox is made.
    os.environ["ABX_NETWORK_OPEN_RANGES"] = f"{ADDRESS}/32"
    os.environ["ABX_NETWORK_HOSTS"] = f"{NAME}={ADDRESS}"
    mode = "direct" if args.transparent else "proxy"
    filler = [f"host{i}.example.org" for i in range(200)]
    policies: dict[str, object] = {
        "full": "full",
        "allowlist (1 name)": NAME,
        "allowlist (registries + 201 names)": ["registries", *filler, NAME],
    }
    results: dict[str, dict[str, Any]] = {}
    try:
        progress("host (no sandbox, no proxy) ...")
        results["host, direct (floor)"] = on_host(port, args.n, args.downloads)
        for label, policy in policies.items():
            progress(f"sandbox, network {label} ...")
            results[label] = in_sandbox(policy, mode, port, args.n, args.downloads)
    except Exception as exc:  # noqa: BLE001 - say what failed, in one line
        raise SystemExit(f"bench failed: {exc}. It needs the engine's network policies "
                         "(backends/runc/netproxy and netns).") from None
    finally:
        server.shutdown()
    figures = {label: {"setup_p50_ms": median(r["setup"]),
                       "download_p50_ms": median(r["download"]),
                       "mb_per_s": r["bytes"] / 1e6 / (median(r["download"]) / 1000)}
               for label, r in results.items()}
    full = figures["full"]
    for f in figures.values():
        f["setup_added_ms"] = f["setup_p50_ms"] - full["setup_p50_ms"]
        f["download_added"] = f["download_p50_ms"] / full["download_p50_ms"] - 1
    if args.json:
        print(json.dumps({"mode": mode, "mb": args.mb, "figures": figures}, indent=2))
        return
    route = "explicit proxy" if mode == "proxy" else "transparent: stand-in addresses"
    rows = []
    for label, f in figures.items():
        policy_row = label.startswith("allowlist")
        rows.append([
            label, fmt_ms(f["setup_p50_ms"]),
            f"{f['setup_added_ms']:+.2f} ms" if policy_row else "-",
            f"<= +{SETUP_TARGET_MS:g} ms" if policy_row else "",
            fmt_ms(f["download_p50_ms"]), f"{f['mb_per_s']:.0f} MB/s",
            f"{f['download_added'] * 100:+.1f}%" if policy_row else "-",
            f"<= +{DOWNLOAD_TARGET * 100:g}%" if policy_row else ""])
    print(table(["network", "connect+GET p50", "added vs full", "target",
                 f"{args.mb} MB p50", "rate", "added vs full", "target"], rows,
                title=f"network policy cost ({route}; n={args.n}, {args.downloads} downloads)"))


if __name__ == "__main__":
    main()
