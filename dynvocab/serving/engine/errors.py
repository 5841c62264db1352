"""A refused request, as an OpenAI-style error that names the field, the value, the rule and the fix."""

from __future__ import annotations

from typing import Any


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


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
