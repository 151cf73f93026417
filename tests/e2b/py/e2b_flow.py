"""Unmodified E2B user code, run by tests/e2b/test_sdk_versions.py with another version of
the SDK than the test's own: only the environment points it at the gateway. Prints one JSON
line per step: {"step": ..., "ok": true/false, ...}."""

import json
import sys
import traceback


def step(name, fn):
    try:
        out = fn()
        print(json.dumps({"step": name, "ok": True, "out": out}), flush=True)
    except Exception as exc:  # every step reports, the next ones still run
        print(json.dumps({"step": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                          "trace": traceback.format_exc()[-800:]}), flush=True)


def main():
    from e2b import CommandExitException, Sandbox
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sb = Sandbox.create()
    step("version", lambda: __import__("e2b").__version__
         if hasattr(__import__("e2b"), "__version__") else "?")
    step("run", lambda: sb.commands.run("echo hi; echo err >&2").stdout)
    seen = []
    step("stream", lambda: (sb.commands.run("for i in 1 2 3; do echo $i; done",
                                            on_stdout=seen.append), "".join(seen))[1])

    def exit_code():
        try:
            sb.commands.run("exit 3")
        except CommandExitException as exc:
            return exc.exit_code
        return None
    step("exit", exit_code)

    def background():
        handle = sb.commands.run("sleep 1; echo done", background=True)
        return handle.wait().stdout
    step("background", background)
    step("write_read", lambda: (sb.files.write("/tmp/x.txt", "hello"),
                                sb.files.read("/tmp/x.txt"))[1])
    step("list", lambda: sorted(e.name for e in sb.files.list("/tmp")))
    step("exists", lambda: sb.files.exists("/tmp/x.txt"))
    step("kill", lambda: sb.kill())

    code = CodeSandbox.create()
    step("run_code", lambda: (code.run_code("x = 41"), code.run_code("x + 1").text)[1])
    step("code_error", lambda: code.run_code("1/0").error.name)
    step("code_kill", lambda: code.kill())


if __name__ == "__main__":
    sys.exit(main())
