"""pydantic's complaints about a request's JSON as ``ApiError`` s that name the field and the fix."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..engine.errors import ApiError, invalid

#: pydantic error types -> what the client should send instead
_FIXES = {
    "extra_forbidden": "remove it (the fields are OpenAI's completion fields plus the library's: see docs/serving.md)",
    "int_type": "send a JSON integer, e.g. 16",
    "float_type": "send a JSON number, e.g. 0.7",
    "string_type": "send a JSON string",
    "bool_type": "send true or false",
    "list_type": "send a JSON array",
    "literal_error": "send one of the allowed values",
    "model_type": "send a JSON object",
}


def from_validation_error(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as an ``invalid`` error naming its field (union alternatives folded)."""
    problem = max(error.errors(include_url=False), key=lambda e: len(e["loc"]))  # a union's closest alternative
    location = [str(part) for part in problem["loc"] if not _is_type_name(part)]
    field = ".".join(location) or "body"
    value = problem.get("input")
    if problem["type"] == "extra_forbidden":
        return invalid(field, value, f"{field!r} is an unknown field", _FIXES["extra_forbidden"])
    if problem["type"] == "missing":
        return ApiError(400, f"{field!r} is required and missing; add it", param=field, code="missing_" + field)
    fix = _FIXES.get(problem["type"], "send a value within the rule")
    return invalid(field, value, problem["msg"][0].lower() + problem["msg"][1:], fix)


def _is_type_name(part: Any) -> bool:
    """pydantic names the alternative of a union it tried (``str``, ``list[str]``, ``Document``) in the location."""
    return isinstance(part, str) and (part[:1].isupper() or part in ("str", "int", "float", "bool") or "[" in part)
