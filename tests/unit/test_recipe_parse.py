"""The recipe parser: what a Dockerfile's supported instructions become, and what is
refused, by line number, with the list of what is supported."""

from __future__ import annotations

import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.recipe import parse

pytestmark = pytest.mark.quick


def test_the_supported_instructions() -> None:
    steps = parse("""# a comment
ARG PY=python3
FROM base
ARG APP=/opt/app
ENV A=1 B="two words"
ENV OLD legacy form
WORKDIR $APP
WORKDIR sub
RUN apt-get update && \\
    apt-get install -y jq   # continued
RUN ["pip", "install", "requests"]
COPY --chown=user:user src/ ./
ADD a.txt b.txt /etc/x/
USER user
LABEL description="my tools"
ENTRYPOINT ["python3"]
CMD ["-m", "http.server"]
HEALTHCHECK CMD curl -f localhost:8000
""")
    kinds = [s.kind for s in steps]
    assert kinds == ["FROM", "ARG", "ENV", "ENV", "WORKDIR", "WORKDIR", "RUN", "RUN", "COPY",
                     "COPY", "USER", "LABEL", "ENTRYPOINT", "CMD", "HEALTHCHECK"]
    assert steps[2].pairs == {"A": "1", "B": "two words"}
    assert steps[3].pairs == {"OLD": "legacy form"}
    assert steps[4].args == ["/opt/app"] and steps[5].args == ["/opt/app/sub"]
    assert steps[6].shell and "apt-get install -y jq" in steps[6].command()
    assert steps[6].line == 9
    assert steps[7].command() == "pip install requests" and not steps[7].shell
    assert steps[8].chown == "user:user" and steps[8].args == ["src/", "./"]
    assert steps[9].args == ["a.txt", "b.txt", "/etc/x/"]
    assert steps[12].args == ["python3"] and steps[14].command() == "curl -f localhost:8000"


@pytest.mark.parametrize(("text", "message"), [
    ("FROM base\nEXPOSE 80\n", "recipe line 2: EXPOSE is not supported; a recipe may use FROM"),
    ("FROM base\nONBUILD RUN x\n", "recipe line 2: ONBUILD is not supported"),
    ("RUN x\n", "recipe line 1: the recipe must start with FROM"),
    ("FROM base\nFROM base\n", "only one FROM"),
    ("FROM base AS b\n", "FROM takes one template or image"),
    ("FROM base\nADD https://x.test/a.tgz /a\n", "ADD of a URL is not supported"),
    ("FROM base\nCOPY --from=b /a /b\n", "supports only --chown"),
    ("FROM base\nCOPY onlyone\n", "needs a source and a destination"),
    ("FROM base\nRUN [\"unterminated\"\n", "exec form must be a JSON list"),
    ("FROM base\nHEALTHCHECK --interval=5s CMD true\n", "HEALTHCHECK takes CMD"),
    ("FROM base\nUSER a b\n", "USER takes one value"),
    ("FROM base\nENV 1BAD=x\n", "is not a variable name"),
    ("# nothing\n", "the recipe is empty"),
])
def test_refused_with_the_line_and_what_to_do(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=None) as err:
        parse(text)
    assert message in str(err.value), str(err.value)


def test_a_pushed_recipe_template_keeps_its_user_and_commands() -> None:
    import json

    from agent_sandbox.backends.kubernetes.catalog import entry, template_of
    from agent_sandbox.core.templates import Layer, Template

    built = Template(name="app", kind="recipe", layers=[Layer("/", ["/x"])], user="user",
                     start_cmd="python3 -m http.server", ready_cmd="true", parent="base")
    back = template_of("app", json.loads(entry(built, "registry.example/app:1")))
    assert (back.user, back.start_cmd, back.ready_cmd, back.parent) == (
        "user", "python3 -m http.server", "true", "base")


@pytest.mark.parametrize(("ref", "registry"), [
    ("python:3", "docker.io"), ("library/python", "docker.io"), ("e2bdev/base", "docker.io"),
    ("ghcr.io/org/app:1.2", "ghcr.io"), ("127.0.0.2:5000/abx/tiny:latest", "127.0.0.2:5000"),
    ("localhost/app", "localhost"), ("[::1]:5000/app", "[::1]:5000"),
    ("app@sha256:" + "a" * 64, "docker.io"),
    ("/etc/passwd", None), ("../x", None), ("./image.tar", None), ("Upper", None),
    ("a b", None), ("", None), ("app:", None),
])
def test_the_registry_of_an_image_reference(ref: str, registry: str | None) -> None:
    from agent_sandbox.core.recipe import image_registry

    assert image_registry(ref) == registry


def test_addresses_no_build_reaches_unless_opened() -> None:
    import ipaddress

    from agent_sandbox.core.netrules import blocked_address

    assert not blocked_address("93.184.216.34")
    for address in ("127.0.0.2", "10.1.2.3", "169.254.169.254", "::1", "::ffff:10.0.0.1",
                    "fd00::1", "not-an-address"):
        assert blocked_address(address), address
    opened = [ipaddress.ip_network("127.0.0.2/32")]
    assert not blocked_address("127.0.0.2", opened)
    assert blocked_address("127.0.0.3", opened)
