"""The code interpreter's languages: the one list every surface takes its names from.

Each language is a Jupyter kernel a template may carry (``Template.kernel``: Python's, plus
``languages`` naming the others). E2B's names are accepted in any case, with its aliases
(``js``, ``ts``) and ours (``python3``, ``py``, ``sh``). A language E2B has and no kernel
here runs (Java) is refused with the list of those that do. Each language but Python has a
default context of its own (``default-<language>``), as E2B keeps one per language.
"""

from __future__ import annotations

from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError

PYTHON = "python"
LANGUAGES = (PYTHON, "javascript", "typescript", "bash", "r")
ALIASES = {"python3": PYTHON, "py": PYTHON, "js": "javascript", "ts": "typescript",
           "sh": "bash"}
# Every spelling a request may use (for schemas that list them).
NAMES = (*LANGUAGES, *ALIASES)
DEFAULT_CONTEXT = "default"  # the Python one; each other language's is default-<language>


def code_language(value: Any) -> str:
    """The canonical name of a language (None or empty: Python), or a clear refusal."""
    if value is None:
        return PYTHON
    if not isinstance(value, str):
        raise InvalidArgumentError("language must be a string")
    name = value.strip().lower() or PYTHON
    name = ALIASES.get(name, name)
    if name not in LANGUAGES:
        raise InvalidArgumentError(
            f"language {value[:40]!r} is not supported: the code interpreter runs "
            f"{', '.join(LANGUAGES)} (aliases: "
            f"{', '.join(f'{a}={n}' for a, n in ALIASES.items())})")
    return name


def default_context(language: str) -> str:
    """The context a cell of ``language`` runs in when it names none."""
    return DEFAULT_CONTEXT if language == PYTHON else f"{DEFAULT_CONTEXT}-{language}"


def default_language(context: str) -> str | None:
    """The language of a default context (None: ``context`` is not one)."""
    for language in LANGUAGES:
        if default_context(language) == context:
            return language
    return None
