"""E2B's ``Template()`` builder methods, each through the gateway by the unmodified SDK and
checked in a sandbox made from the result: ``apt_install`` against a Debian repository the
test serves, ``pip_install`` and ``npm_install`` against stand-in indexes, ``set_envs``,
``set_workdir``, ``set_user``, ``copy``, ``set_start_cmd`` and ``set_ready_cmd``. One
gateway for the module, whose builds may reach only the stand-in internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2bgateway import E2BGateway
from gateways import running_gateway
from mirrors import busybox_image, debian_repo, npm_package, registry
from netprobe import ENV, HTTP_ADDR, HTTP_NAME, internet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with internet(tmp_path_factory.mktemp("internet")) as servers:
        base = f"http://{HTTP_NAME}:{servers['http_port']}"
        servers["base"] = base
        repo = debian_repo(servers["root"], "abxhello", "hello from apt")
        servers["apt"] = f"deb [trusted=yes] {base}/{repo}"
        servers["npm"] = npm_package(servers["root"], base, "abxnpm", "from npm")
        yield servers


@pytest.fixture(scope="module")
def gateway(net: dict[str, Any]) -> Iterator[E2BGateway]:
    pytest.importorskip("e2b", reason="the e2b SDK is not installed (pip install -e .[test])")
    tenant = {"e2b": True, "max_sandboxes": 10}
    # Builds reach the stand-in internet: its package mirrors by name, and by address its
    # image registries (pulled by the host; ENV opens the address's range).
    # A layer (and a pulled image) holds at most 16 MiB here.
    env = {**ENV, "ABX_BUILD_NETWORK": f"{HTTP_NAME},{HTTP_ADDR}/32",
           "ABX_BUILD_MAX_LAYER_MB": "16"}
    with running_gateway("abx-e2b-builder-", {"a": tenant, "b": tenant}, env) as (
            proc, store, keys):
        yield E2BGateway(proc, store, keys)


@pytest.fixture
def sdk(gateway: E2BGateway, monkeypatch: pytest.MonkeyPatch) -> E2BGateway:
    for name, value in gateway.env("a").items():
        monkeypatch.setenv(name, value)
    return gateway


def _messages(logs: list[Any]) -> str:
    return "\n".join(str(getattr(e, "message", e)) for e in logs)


def test_every_builder_method_builds_what_a_sandbox_then_has(
        sdk: E2BGateway, net: dict[str, Any], tmp_path: Path) -> None:
    from e2b import Sandbox, Template, wait_for_file

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.toml").write_text("answer = 42\n")
    base = net["base"]
    template = (
        Template(file_context_path=str(tmp_path)).from_base_image()
        # The stand-in mirrors, as an operator's air-gapped build would name its own.
        .run_cmd(["rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*",
                  f"echo '{net['apt']}' > /etc/apt/sources.list.d/local.list"], user="root")
        .set_envs({"PIP_INDEX_URL": f"{base}/simple/", "PIP_TRUSTED_HOST": HTTP_NAME,
                   "PIP_BREAK_SYSTEM_PACKAGES": "1", "npm_config_registry": net["npm"],
                   "npm_config_audit": "false", "npm_config_fund": "false",
                   "npm_config_update_notifier": "false", "APP_MODE": "built"})
        .apt_install("abxhello", no_install_recommends=True)
        .pip_install("abxdemo")
        .set_workdir("/opt/app")
        .npm_install("abxnpm")
        .copy("conf", "/opt/app/conf/", user="user", mode=0o640)
        .set_user("user")
        .run_cmd("whoami > /tmp/built-as")
        .set_start_cmd("echo up > /tmp/started && exec sleep 600",
                       wait_for_file("/tmp/started")))
    logs: list[Any] = []
    Template.build(template, "e2b-methods", on_build_logs=logs.append)
    text = _messages(logs)
    assert "Setting up abxhello (1.0)" in text, text  # apt-get's own output, streamed
    assert "Successfully installed abxdemo" in text, text
    sb = Sandbox.create("e2b-methods")
    try:
        def run(cmd: str) -> str:
            return sb.commands.run(cmd, cwd="/opt/app").stdout.strip()

        assert run("cat /usr/share/abxhello/hello.txt") == "hello from apt"
        assert run("dpkg-query -W -f '${Status}' abxhello") == "install ok installed"
        assert run("python3 -c 'import abxdemo; print(abxdemo.VALUE)'") == "42"
        assert run("node -e \"console.log(require('abxnpm').value)\"") == "from npm"
        assert run("echo $APP_MODE") == "built"
        assert run("stat -c '%U %a' conf/app.toml; cat conf/app.toml") == "user 640\nanswer = 42"
        assert run("whoami; cat /tmp/built-as") == "user\nuser"
        assert run("cat /tmp/started") == "up"  # the start command ran, checked ready
    finally:
        sb.kill()
    # A template from it with only a ready check: the start command is the parent's.
    Template.build(Template().from_template("e2b-methods")
                   .set_ready_cmd("test -s /tmp/started"), "e2b-ready")
    sb = Sandbox.create("e2b-ready")
    try:
        assert sb.commands.run("cat /tmp/started").stdout.strip() == "up"
    finally:
        sb.kill()


# E2B's images need bash (envd runs ``/bin/bash -l -c``); a busybox image gets a stand-in.
_BASH = "printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash"


def test_from_image_pulls_from_a_registry_the_builds_reach(sdk: E2BGateway) -> None:
    from e2b import Sandbox, Template
    from e2b.exceptions import BuildException

    images = {"abx/tiny": busybox_image("public image"),
              "abx/huge": busybox_image("huge", padding=20 << 20)}
    private = {"abx/private": busybox_image("private image")}
    with registry(HTTP_ADDR, images) as open_reg, \
            registry(HTTP_ADDR, private, creds=("puller", "s3cret")) as closed_reg:
        Template.build(Template().from_image(f"{open_reg['host']}/abx/tiny:latest")
                       .run_cmd([_BASH, "echo layered > /etc/extra"]), "e2b-image")
        # With credentials (E2B's fromImageRegistry of type registry): pulled with them.
        Template.build(Template().from_image(f"{closed_reg['host']}/abx/private",
                                             username="puller", password="s3cret")
                       .run_cmd(_BASH), "e2b-private")
        # Without, or with wrong ones: the registry's refusal, said.
        for builder in (Template().from_image(f"{closed_reg['host']}/abx/private"),
                        Template().from_image(f"{closed_reg['host']}/abx/private",
                                              username="puller", password="wrong")):
            with pytest.raises(BuildException, match="pulling it failed: .*unauthorized"):
                Template.build(builder.run_cmd("true"), "e2b-refused")
        assert any("/abx/private/manifests/" in path for path in closed_reg["asked"])
        # An image over what a layer may hold (ABX_BUILD_MAX_LAYER_MB) is cut off.
        with pytest.raises(BuildException, match="the image is over 16 MiB"):
            Template.build(Template().from_image(f"{open_reg['host']}/abx/huge")
                           .run_cmd("true"), "e2b-huge")
    for name, marker in (("e2b-image", "public image"), ("e2b-private", "private image")):
        sb = Sandbox.create(name)
        try:
            out = sb.commands.run("cat /etc/marker; echo $IMAGE_MARKER").stdout.split("\n")
            assert out[:2] == [marker, marker], out
            if name == "e2b-image":
                assert sb.commands.run("cat /etc/extra").stdout.strip() == "layered"
        finally:
            sb.kill()
    # A registry the machine cannot reach (nothing listens there): its error, said.
    with pytest.raises(BuildException, match="pulling it failed: .*(refused|connect)"):
        Template.build(Template().from_image(f"{HTTP_ADDR}:9/abx/tiny").run_cmd("true"),
                       "e2b-unreachable")
    # One the build network does not reach (Docker Hub here): refused before any pull.
    with pytest.raises(BuildException, match="builds may not reach the registry docker.io"):
        Template.build(Template().from_python_image("3").run_cmd("true"), "e2b-hub")
    # Cloud registry credentials (AWS's, GCP's): refused at once (HTTP 400), saying why.
    with pytest.raises(BuildException, match="type 'aws' is not supported"):
        Template.build(Template().from_aws_registry("1.dkr.ecr.eu-west-1.amazonaws.com/x",
                                                    "AKIA", "secret", "eu-west-1")
                       .run_cmd("true"), "e2b-aws")


def test_tags_name_builds(sdk: E2BGateway) -> None:
    """``Template.build(t, "name:tag", tags=[...])``, ``Sandbox.create("name:tag")``,
    ``assign_tags``, ``remove_tags``, ``get_tags``; a rebuild's tags replace the earlier
    build's (this engine keeps the latest build), so an old tag is not found, saying why."""
    import httpx2 as httpx
    from e2b import Sandbox, Template

    def version(ref: str) -> str:
        sb = Sandbox.create(ref)
        try:
            return sb.commands.run("cat /opt/version").stdout.strip()
        finally:
            sb.kill()

    def tags() -> set[str]:
        return {t.tag for t in Template.get_tags("e2b-tagged")}

    built = Template.build(Template().from_base_image().run_cmd("echo one > /opt/version"),
                           "e2b-tagged:v1", tags=["stable"])
    assert set(built.tags) == {"v1", "stable"}
    assert tags() == {"default", "v1", "stable"}
    assert version("e2b-tagged:stable") == "one"
    assert Template.assign_tags("e2b-tagged:v1", "prod").tags == ["prod"]
    Template.remove_tags("e2b-tagged", "stable")
    assert tags() == {"default", "v1", "prod"}
    with pytest.raises(Exception, match="has no tag 'stable'"):
        Sandbox.create("e2b-tagged:stable")
    Template.build(Template().from_base_image().run_cmd("echo two > /opt/version"),
                   "e2b-tagged:v2")
    assert tags() == {"default", "v2"}
    with pytest.raises(Exception, match="has no tag 'v1'.*latest build only"):
        Sandbox.create("e2b-tagged:v1")
    assert version("e2b-tagged:v2") == version("e2b-tagged") == "two"
    Template.build(Template().from_template("e2b-tagged:v2").run_cmd("echo three > /opt/x"),
                   "e2b-from-tag")
    # Another key neither sees nor tags them; a bad tag is a 400.
    url, b = sdk.url, {"X-API-KEY": sdk.keys["b"]}
    assert httpx.get(f"{url}/templates/e2b-tagged/tags", headers=b).status_code == 404
    assert httpx.post(f"{url}/templates/tags", headers=b, json={
        "target": "e2b-tagged", "tags": ["mine"]}).status_code == 404
    a = {"X-API-KEY": sdk.keys["a"]}
    bad = httpx.post(f"{url}/templates/tags", headers=a, json={
        "target": "e2b-tagged", "tags": ["no spaces"]})
    assert bad.status_code == 400 and "tag 'no spaces'" in bad.text, bad.text
