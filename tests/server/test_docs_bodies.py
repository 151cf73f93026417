"""docs/gateway.md shows a body for every JSON request of the gateway, and each is one the
gateway takes: read by its own request models (the checks a request meets), in process."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent_sandbox.core import spec
from agent_sandbox.surfaces.gateway.app import create_app
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.rest import routes, schemas

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def _examples() -> list[tuple[str, str, str]]:
    """(method, path with its {parameters} blanked, JSON body) of each example."""
    section = DOC.read_text().split("### Request bodies", 1)[1]
    block = section.split("```http\n", 1)[1].split("```", 1)[0]
    out = []
    for chunk in block.strip().split("\n\n"):
        first, _, body = chunk.partition("\n")
        method, path = first.split("#", 1)[0].split()
        out.append((method, re.sub(r"\{[^}]+\}", "{}", path), body))
    return out


def _json_bodies(tmp_path: Path) -> dict[tuple[str, str], str]:
    """(method, path) of each operation with a JSON body: the name of its model."""
    spec: dict[str, Any] = create_app(engine=object(),  # type: ignore[arg-type]
                                      keys=KeyStore(tmp_path / "k.db")).openapi()
    out = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                schema = content["application/json"]["schema"]
                # An optional body is anyOf its model and null.
                ref = next(x["$ref"] for x in schema.get("anyOf", [schema]) if "$ref" in x)
                out[(method.upper(), re.sub(r"\{[^}]+\}", "{}", path))] = ref.rsplit("/")[-1]
    return out


def _models() -> dict[str, type[BaseModel]]:
    """Request models by name: the REST API's schemas, the create spec, and a route
    module's own (a share link's, a secret's)."""
    modules = [schemas, spec] + [importlib.import_module(f"{routes.__name__}.{m.name}")
                                 for m in pkgutil.iter_modules(routes.__path__)]
    return {name: value for module in modules for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, BaseModel)}


def test_every_json_body_is_documented_and_taken(tmp_path: Path) -> None:
    bodies = _json_bodies(tmp_path)
    examples = _examples()
    assert {path for _, path in bodies} <= {path for _, path, _ in examples}, \
        "a JSON request of the gateway has no example in docs/gateway.md"
    for method, path, body in examples:
        # raises for a field or a value it refuses
        _models()[bodies[(method, path)]].model_validate_json(body)
