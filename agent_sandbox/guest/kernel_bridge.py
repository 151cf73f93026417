"""Kernel bridge: the only thing that speaks ZeroMQ to a context's Jupyter kernel.

Runs inside the sandbox, on the kernel's own interpreter (which has ``pyzmq``),
as a foreground exec of the guest: ``python -I kernel_bridge.py <connection file>
<ready timeout>``. The host never touches the kernel's sockets (paths a sandbox could
swap, and a peer that could send it unbounded messages); it writes requests to this
process's stdin and reads one JSON object per line from its stdout, all through the
guest's bounded channel. Everything here is the sandbox's to break: the host treats
these lines as hostile input, and ZeroMQ's memory is charged to the sandbox.

Requests (stdin): ``{"op": "execute", "id": N, "code": "..."}``. Events (stdout):
``ready``, ``fatal`` (message), and per cell ``count``, ``stream``, ``result``,
``error``, ``clear``, ``idle``, each with the cell's ``id``. End of stdin ends the bridge.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import queue
import stat
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
_DELIM = b"<IDS|MSG>"
_out_lock = threading.Lock()


def emit(event: Dict[str, Any]) -> None:
    line = json.dumps(event, default=str) + "\n"  # ASCII only: one event per line
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def read_requests(requests: "queue.Queue[Dict[str, Any]]") -> None:
    """Stdin to the queue; end of stdin (the host let go) ends this process at once,
    even in the middle of a cell."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        cell = req.get("id") if isinstance(req, dict) else None
        # A malformed request is dropped, not a crash of the bridge in main's loop.
        if (isinstance(cell, int) and not isinstance(cell, bool) and 0 <= cell < 1 << 63
                and isinstance(req.get("code"), str)):
            requests.put(req)
    os._exit(0)


def address(info: Dict[str, Any], port: str) -> str:
    """A socket's ZeroMQ address: ``ipc`` files (ipykernel), or TCP on the sandbox's own
    loopback (a kernel that binds no ``ipc`` socket, such as Deno's)."""
    if info.get("transport") == "tcp":
        return f"tcp://{info['ip']}:{int(info[port])}"
    return f"ipc://{info['ip']}-{info[port]}"


def wait_sockets(info: Dict[str, Any], deadline: float) -> None:
    if info.get("transport") == "tcp":
        return  # connects retry until the kernel listens; wait_ready sees it answer
    paths = [f"{info['ip']}-{info[port]}" for port in _PORTS]
    while True:
        try:
            if all(stat.S_ISSOCK(os.lstat(p).st_mode) for p in paths):
                return
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the kernel did not bind its sockets in time")
        time.sleep(0.005)


class Kernel:
    """Just enough of the Jupyter wire protocol (v5.3): signed requests on the shell
    socket, signed messages from iopub. pyzmq alone: jupyter_client would cost every
    context ~160 ms of CPU and 19 MB more."""

    def __init__(self, info: Dict[str, Any]) -> None:
        import zmq

        self.zmq = zmq
        self.key = str(info["key"]).encode()
        self.session = uuid.uuid4().hex
        self.ctx = zmq.Context()
        self.shell = self.ctx.socket(zmq.DEALER)
        self.shell.connect(address(info, "shell_port"))
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(address(info, "iopub_port"))

    def _sign(self, parts: List[bytes]) -> bytes:
        mac = hmac.new(self.key, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.hexdigest().encode()

    def request(self, msg_type: str, content: Dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "session": self.session, "username": "abx",
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  "msg_type": msg_type, "version": "5.3"}
        parts = [json.dumps(p).encode() for p in (header, {}, {}, content)]
        self.shell.send_multipart([_DELIM, self._sign(parts), *parts])
        return msg_id

    def recv(self, sock: Any, timeout: float) -> Optional[Dict[str, Any]]:
        """One well-signed message, or None (nothing in time, or not a valid one)."""
        if not sock.poll(int(timeout * 1000)):
            return None
        frames = sock.recv_multipart()
        if _DELIM not in frames:
            return None
        at = frames.index(_DELIM)
        sig, parts = frames[at + 1], frames[at + 2:at + 6]
        if len(parts) < 4 or not hmac.compare_digest(sig, self._sign(parts)):
            return None
        try:
            header, parent, _, content = (json.loads(p) for p in parts)
        except ValueError:
            return None
        if not all(isinstance(d, dict) for d in (header, parent, content)):
            return None
        return {"msg_type": header.get("msg_type"), "parent_header": parent,
                "content": content}

    def drain(self, sock: Any) -> None:
        while sock.poll(0):
            sock.recv_multipart()


def wait_ready(kernel: Kernel, deadline: float) -> None:
    """kernel_info until its busy/idle status arrives on iopub: the shell answers and our
    subscription is live (ZeroMQ drops what is published before it is)."""
    while time.monotonic() < deadline:
        msg_id = kernel.request("kernel_info_request", {})
        until = time.monotonic() + 0.25
        while time.monotonic() < until:
            msg = kernel.recv(kernel.iopub, 0.05)
            if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
                kernel.drain(kernel.shell)
                kernel.drain(kernel.iopub)
                return
    raise TimeoutError("the kernel did not answer in time")


def run_cell(kernel: Kernel, cell: int, code: str, settle: bool) -> None:
    kernel.drain(kernel.shell)  # replies of earlier cells
    msg_id = kernel.request("execute_request", {
        "code": code, "silent": False, "store_history": True, "user_expressions": {},
        "allow_stdin": False, "stop_on_error": True})
    while True:
        msg = kernel.recv(kernel.iopub, 1.0)
        if msg is None or msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            if msg["content"].get("execution_state") == "idle":
                if settle:
                    settle_cell(kernel, cell, msg_id)
                emit({"id": cell, "t": "idle"})
                return
        else:
            forward(cell, msg)


def settle_cell(kernel: Kernel, cell: int, msg_id: str) -> None:
    """What a kernel publishes for a cell after saying it is idle (Deno's sends the value
    of a cell's last expression late): a kernel_info round trip, whose own idle comes
    after the output of the cell before it."""
    probe = kernel.request("kernel_info_request", {})
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        msg = kernel.recv(kernel.iopub, 0.1)
        if msg is None:
            continue
        parent = msg["parent_header"].get("msg_id")
        if parent == msg_id and msg["msg_type"] != "status":
            forward(cell, msg)
        elif (parent == probe and msg["msg_type"] == "status"
              and msg["content"].get("execution_state") == "idle"):
            return


def forward(cell: int, msg: Dict[str, Any]) -> None:
    """One of a cell's messages from iopub as the host's event."""
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        emit({"id": cell, "t": "stream", "name": content.get("name"),
              "text": content.get("text", "")})
    elif kind in ("execute_result", "display_data"):
        emit({"id": cell, "t": "result", "data": content.get("data", {}),
              "main": kind == "execute_result"})
    elif kind == "execute_input":
        emit({"id": cell, "t": "count", "n": content.get("execution_count")})
    elif kind == "error":
        emit({"id": cell, "t": "error", "ename": content.get("ename", ""),
              "evalue": content.get("evalue", ""),
              "traceback": content.get("traceback", [])})
    elif kind == "clear_output":
        emit({"id": cell, "t": "clear"})


def main() -> None:
    conn_file, ready_timeout = sys.argv[1], float(sys.argv[2])
    requests: "queue.Queue[Dict[str, Any]]" = queue.Queue()
    threading.Thread(target=read_requests, args=(requests,), daemon=True).start()
    try:
        deadline = time.monotonic() + ready_timeout
        with open(conn_file) as fh:
            info = json.load(fh)
        wait_sockets(info, deadline)
        kernel = Kernel(info)
        wait_ready(kernel, deadline)
    except Exception as exc:  # noqa: BLE001 - reported to the host, which decides
        emit({"t": "fatal", "message": f"{type(exc).__name__}: {exc}"})
        return
    emit({"t": "ready"})
    while True:
        req = requests.get()
        if req.get("op") == "execute":
            run_cell(kernel, req["id"], req["code"], info.get("transport") == "tcp")


if __name__ == "__main__":
    main()
