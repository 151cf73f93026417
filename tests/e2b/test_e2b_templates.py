"""E2B's template builder (the ``e2b`` SDK's ``Template()`` and ``Template.build``,
unmodified) against the gateway: files uploaded by hash, steps built as a recipe with the
logs polled, the template used by ``Sandbox.create``; list, alias, delete; tenancy."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def test_the_sdk_builds_a_template_and_a_sandbox_runs_it(e2b_env: E2BGateway,
                                                         tmp_path: Path) -> None:
    from e2b import Sandbox, Template
    from e2b.exceptions import BuildException

    (tmp_path / "app.py").write_text("print('app')\n")
    template = (Template(file_context_path=str(tmp_path)).from_base_image()
                .copy("app.py", "/opt/app/", user="user", mode=0o640)
                .set_envs({"GREETING": "hello world"})
                .set_workdir("/opt/app")
                .run_cmd("echo built > built.txt && id -un > builder")
                .run_cmd("id -un > /tmp/as-user", user="user")
                .set_user("user"))
    logs: list[object] = []
    info = Template.build(template, "e2b-recipe", on_build_logs=logs.append)
    assert info.template_id == "e2b-recipe"
    text = "\n".join(str(getattr(e, "message", e)) for e in logs)
    assert "Uploaded 'app.py'" in text and "Build finished" in text, text
    sb = Sandbox.create("e2b-recipe")
    try:
        def run(cmd: str) -> object:  # envd's default cwd is the user's home
            return sb.commands.run(cmd, cwd="/opt/app")

        assert run("echo $GREETING").stdout.strip() == "hello world"
        assert run("stat -c '%U %a' app.py").stdout.strip() == "user 640"
        assert run("cat built.txt builder /tmp/as-user").stdout.split() == ["built", "root", "user"]
        assert run("whoami").stdout.strip() == "user"
    finally:
        sb.kill()
    # Built again unchanged: the upload is skipped (same hash) and every step cached.
    logs.clear()
    Template.build(template, "e2b-recipe", on_build_logs=logs.append)
    text = "\n".join(str(getattr(e, "message", e)) for e in logs)
    assert "Skipping upload of 'app.py'" in text and text.count("(cached)") >= 6, text
    assert Template.exists("e2b-recipe")
    # A failing step fails the build with its message.
    with pytest.raises(BuildException, match="exit code 7"):
        Template.build(Template().from_template("e2b-recipe").run_cmd("exit 7"), "e2b-broken")


def test_templates_are_the_keys_own(e2b_gateway: E2BGateway, e2b_env: E2BGateway) -> None:
    from e2b import Template

    url = e2b_gateway.url
    a, b = ({"X-API-KEY": e2b_gateway.keys[k]} for k in ("a", "b"))
    Template.build(Template().from_base_image().set_envs({"X": "1"}), "e2b-owned")
    names = [t["templateID"] for t in httpx.get(f"{url}/templates", headers=a).json()]
    assert "e2b-owned" in names and "base" in names
    names = [t["templateID"] for t in httpx.get(f"{url}/templates", headers=b).json()]
    assert "e2b-owned" not in names and "base" in names
    assert httpx.get(f"{url}/templates/aliases/e2b-owned", headers=b).status_code == 403
    assert httpx.get(f"{url}/templates/e2b-owned", headers=b).status_code == 404
    created = httpx.post(f"{url}/sandboxes", headers=b, json={"templateID": "e2b-owned"})
    assert created.status_code == 404, created.text
    assert httpx.post(f"{url}/v3/templates", headers=b,
                      json={"name": "e2b-owned"}).status_code == 403
    assert httpx.delete(f"{url}/templates/e2b-owned", headers=b).status_code == 404
    rest = {"Authorization": f"Bearer {e2b_gateway.keys['b']}"}
    # Not another key's template, nor a file of the host, nor a registry the operator's
    # build network does not reach (the default, ``registries``, names no image registry).
    for recipe, status in (("FROM e2b-owned\n", 404), ("FROM /etc/passwd\n", 404),
                           ("FROM docker.io/library/x\n", 403)):
        reply = httpx.post(f"{url}/v1/templates", headers=rest, timeout=60,
                           json={"name": "e2b-steal", "recipe": recipe})
        assert reply.status_code == status and "recipe line 1" in reply.text, reply.text
    assert httpx.delete(f"{url}/templates/base", headers=a).status_code == 403
    assert httpx.delete(f"{url}/templates/e2b-owned", headers=a).status_code == 204
    assert httpx.get(f"{url}/templates/aliases/e2b-owned", headers=a).status_code == 404


def test_rest_builds_with_a_streamed_log(e2b_gateway: E2BGateway, tmp_path: Path) -> None:
    """Our own API on the same gateway: ``POST /v1/templates`` answers the build's events
    as NDJSON while it runs; the context travels as a tar; a hostile one is refused."""
    import base64
    import io
    import json
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"from the context\n"
        info = tarfile.TarInfo("notes.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context = base64.b64encode(buf.getvalue()).decode()
    url, key = e2b_gateway.url, {"Authorization": f"Bearer {e2b_gateway.keys['a']}"}
    recipe = "FROM base\nCOPY notes.txt /opt/notes/\nRUN cat /opt/notes/notes.txt\n"
    events = []
    with httpx.stream("POST", f"{url}/v1/templates", headers=key, timeout=300,
                      json={"name": "rest-recipe", "recipe": recipe,
                            "context_base64": context}) as reply:
        assert reply.status_code == 200 and "ndjson" in reply.headers["content-type"]
        events = [json.loads(line) for line in reply.iter_lines() if line]
    kinds = [e.get("type") for e in events]
    assert kinds[0] == "step" and kinds[-1] == "result", events
    assert {"type": "log", "step": 3, "stream": "stdout", "data": "from the context\n"} in events
    assert events[-1]["template"]["name"] == "rest-recipe"
    assert events[-1]["template"]["layers"] == 2 and events[-1]["template"]["parent"] == "base"
    listed = httpx.get(f"{url}/v1/templates", headers=key).json()
    assert "rest-recipe" in [t["name"] for t in listed]
    other = {"Authorization": f"Bearer {e2b_gateway.keys['b']}"}
    assert "rest-recipe" not in [t["name"] for t in httpx.get(f"{url}/v1/templates",
                                                               headers=other).json()]
    bad = httpx.post(f"{url}/v1/templates", headers=key, timeout=60,
                     json={"name": "rest-bad", "recipe": "FROM base\nEXPOSE 80\n"})
    assert bad.status_code == 400 and "recipe line 2: EXPOSE is not supported" in bad.text
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../../escape")
        tar.addfile(info, io.BytesIO(b""))
    bad = httpx.post(f"{url}/v1/templates", headers=key, timeout=60, json={
        "name": "rest-bad", "recipe": "FROM base\nCOPY escape /opt/\n",
        "context_base64": base64.b64encode(evil.getvalue()).decode()})
    assert bad.status_code == 400 and "'..'" in bad.text, bad.text
    assert httpx.delete(f"{url}/v1/templates/rest-recipe", headers=other).status_code == 404
    assert httpx.delete(f"{url}/v1/templates/rest-recipe", headers=key).status_code == 204


def test_the_cli_builds_through_the_gateway(e2b_gateway: E2BGateway, tmp_path: Path) -> None:
    """``abx template build --file`` with a gateway configured: the context goes as a tar,
    the steps come back as the gateway streams them (JSON events with --json)."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "hello.txt").write_text("hi\n")
    (tmp_path / "Dockerfile").write_text("FROM base\nCOPY hello.txt /opt/cli/\n"
                                         "RUN cat /opt/cli/hello.txt\n")
    env = {**os.environ, "ABX_SANDBOX_BASE_URL": e2b_gateway.url,
           "ABX_SANDBOX_API_KEY": e2b_gateway.keys["a"], "HOME": str(tmp_path)}
    abx = str(Path(sys.executable).with_name("abx"))
    done = subprocess.run([abx, "template", "build", "cli-remote", "--file",
                           str(tmp_path / "Dockerfile"), "--json"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"type": "log", "step": 3, "stream": "stdout", "data": "hi\n"} in events
    assert events[-1]["type"] == "result" and events[-1]["owner"]  # the key's own
    assert httpx.delete(f"{e2b_gateway.url}/v1/templates/cli-remote", headers={
        "Authorization": f"Bearer {e2b_gateway.keys['a']}"}).status_code == 204
