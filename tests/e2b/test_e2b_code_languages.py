"""The code interpreter's other languages through the real ``e2b_code_interpreter`` SDK, as
E2B offers them: ``run_code(..., language=...)`` in each language's own default context,
and contexts created for a language. Each language: state kept across cells, an error with
E2B's fields, and a display result. JavaScript and TypeScript run in Deno's Jupyter kernel,
Bash in ``bash_kernel``. One sandbox for the module."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _needs(ci: object, language: str) -> None:
    """Skip when this host's template was built without the language (no npm: no Deno)."""
    from e2b import SandboxException

    try:
        ci.run_code("", language=language)
    except SandboxException as exc:
        if f"no {language} kernel" in str(exc):
            pytest.skip(str(exc))
        raise


def test_javascript_state_error_and_display(ci: object) -> None:
    _needs(ci, "javascript")
    first = ci.run_code("let counter = 41; console.log('started')", language="js")
    assert first.error is None and first.logs.stdout == ["started\n"]
    second = ci.run_code("counter + 1", language="javascript")
    assert second.text == "42" and second.results[0].is_main_result
    failed = ci.run_code("throw new RangeError('too far: ' + counter)", language="js")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("RangeError", "too far: 41")
    assert "RangeError: too far: 41" in failed.error.traceback
    shown = ci.run_code("Deno.jupyter.html`<b>${counter}</b>`", language="js")
    assert shown.error is None and shown.results[0].html == "<b>41</b>"
    # The default JavaScript context starts in the default user's home, as E2B's does.
    assert ci.run_code("Deno.cwd()", language="js").text == "/home/user"
    # Python's default context is another kernel: no `counter` there.
    assert ci.run_code("'counter' in dir()").text == "False"


def test_typescript_types_state_and_errors(ci: object) -> None:
    _needs(ci, "typescript")
    ci.run_code("interface P { x: number }\nconst p: P = { x: 20 }", language="ts")
    assert ci.run_code("p.x * 2 + 2", language="typescript").text == "42"
    failed = ci.run_code("JSON.parse('{')", language="ts")
    assert failed.error is not None and failed.error.name == "SyntaxError"
    assert failed.error.traceback
    data = ci.run_code("Deno.jupyter.display({'application/json': {a: p.x}}, "
                       "{raw: true})", language="ts")
    assert data.error is None and data.results[0].json == {"a": 20}


def test_bash_state_error_and_display(ci: object) -> None:
    _needs(ci, "bash")
    ci.run_code("GREETING=hello; cd /tmp", language="bash")
    kept = ci.run_code('echo "$GREETING from $(pwd)"', language="bash")
    assert kept.error is None and "".join(kept.logs.stdout) == "hello from /tmp\n"
    failed = ci.run_code("echo before; bash -c 'exit 3'", language="bash")
    assert failed.error is not None and failed.error.value == "3"
    assert "".join(failed.logs.stdout) == "before\n"
    shown = ci.run_code("echo '<i>hi</i>' | displayHTML", language="bash")
    assert shown.error is None and [r.html for r in shown.results] == ["<i>hi</i>\n"]


def test_contexts_of_a_language(ci: object) -> None:
    _needs(ci, "javascript")
    ctx = ci.create_code_context(cwd="/tmp", language="js")
    assert ctx.language == "javascript" and ctx.cwd == "/tmp"
    assert ci.run_code("Deno.cwd()", context=ctx).text == "/tmp"
    ci.run_code("const mine = 7", context=ctx)
    assert ci.run_code("typeof mine", language="js").text == "undefined"
    assert ci.run_code("mine * 6", context=ctx).text == "42"
    listed = {c.id: c for c in ci.list_code_contexts()}
    assert listed[ctx.id].language == "javascript"
    ci.remove_code_context(ctx)


def test_java_is_refused_naming_the_languages(ci: object) -> None:
    from e2b import SandboxException

    for name in ("java", "cobol"):
        with pytest.raises(SandboxException, match="400.*is not supported.*python, "
                           "javascript, typescript, bash"):
            ci.run_code("1", language=name)
        with pytest.raises(SandboxException, match="400.*is not supported"):
            ci.create_code_context(language=name)


def test_r_state_error_and_display(ci: object) -> None:
    _needs(ci, "r")
    ci.run_code("scores <- c(3, 5, 34)", language="r")
    kept = ci.run_code("sum(scores)", language="r")
    # IRkernel displays a value (no execute_result): E2B's `text` is the main result's only.
    assert kept.error is None and [r.text for r in kept.results] == ["[1] 42"]
    failed = ci.run_code("stop('no such table: ', length(scores))", language="r")
    assert failed.error is not None and "no such table: 3" in failed.error.value
    frame = ci.run_code("data.frame(name = c('a', 'b'), n = 1:2)", language="r")
    assert frame.error is None and "<table" in (frame.results[0].html or "")
    plot = ci.run_code("plot(scores)", language="r")
    assert plot.error is None and any(r.png for r in plot.results), plot


@pytest.mark.parametrize(("language", "code"), [
    ("bash", 'echo "$ABX_A|${ABX_B-unset}"'),
    ("js", "console.log((Deno.env.get('ABX_A') ?? '') + '|' + (Deno.env.get('ABX_B') ?? 'unset'))"),
    ("r", "cat(Sys.getenv('ABX_A'), Sys.getenv('ABX_B', 'unset'), sep = '|')"),
])
def test_env_vars_for_one_cell(ci: object, language: str, code: str) -> None:
    """``envs`` hold for one cell of any language, quoted whatever they hold, and the
    environment is as before after it."""
    _needs(ci, language)
    value = "it's \"quoted\" $HOME `x` \\ é"
    seen = ci.run_code(code, language=language, envs={"ABX_A": value})
    assert seen.error is None and "".join(seen.logs.stdout) == f"{value}|unset\n"[
        :None if language != "r" else -1]
    after = ci.run_code(code, language=language)
    assert "".join(after.logs.stdout).strip() == "|unset"
