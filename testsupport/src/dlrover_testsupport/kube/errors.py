"""API errors with the `Status` body a real server answers them with."""

from __future__ import annotations

from typing import Any

from .resources import ResourceType

__all__ = ["ApiError", "status_body"]


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `meta.k8s.io/v1` Status of a failure."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """A request the server refuses: an HTTP code, the Status reason and a message."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        resource: ResourceType | None = None,
        name: str = "",
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.resource = resource
        self.name = name
        self.retry_after_s = retry_after_s

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.resource is not None:
            details["group"] = self.resource.group
            details["kind"] = self.resource.plural
        if self.retry_after_s is not None:
            details["retryAfterSeconds"] = self.retry_after_s
        return status_body(self.code, self.reason, self.message, details)

    @staticmethod
    def qualified(rt: ResourceType) -> str:
        return f"{rt.plural}.{rt.group}" if rt.group else rt.plural

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(404, "NotFound", f'{cls.qualified(rt)} "{name}" not found', resource=rt, name=name)

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(409, "AlreadyExists", f'{cls.qualified(rt)} "{name}" already exists', resource=rt, name=name)

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        message = f'Operation cannot be fulfilled on {cls.qualified(rt)} "{name}": {why}'
        return cls(409, "Conflict", message, resource=rt, name=name)

    @classmethod
    def invalid(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        return cls(422, "Invalid", f'{rt.kind} "{name}" is invalid: {why}', resource=rt, name=name)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, "Expired", message)
