"""OpenAI-style JSON errors that name the field, the value, the rule and the fix."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

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


class ApiError(Exception):
    """A refused request: HTTP ``status`` and the OpenAI error object's fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "invalid_request",
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid(field: str, value: Any, rule: str, fix: str, status: int = 400) -> ApiError:
    """A 400 (or ``status``) error: ``field=value`` breaks ``rule``; ``fix`` says what to send."""
    return ApiError(status, f"{field}={_short(value)} is refused: {rule}; {fix}", param=field, code="invalid_" + field)


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


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
