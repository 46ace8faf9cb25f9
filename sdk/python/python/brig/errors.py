"""Brig's errors: one exception class per Brig error code, all under `BrigError`.

Every exception carries `code` (Brig's error code, e.g. ``"not_found"``, or ``None`` for a
local or connection failure) and `retryable` (whether sending the same request again, later or
elsewhere, can succeed)."""

from __future__ import annotations


class BrigError(Exception):
    """Base class of every Brig error."""

    code: str | None
    retryable: bool

    def __init__(self, message: str, code: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class Unauthenticated(BrigError):
    """Missing or wrong access token."""


class VersionMismatch(BrigError):
    """Client and server speak different protocol versions."""


class BadRequest(BrigError):
    """The request names impossible values (a bad id, option or rule)."""


class SandboxNotFound(BrigError):
    """The sandbox (or the tool, file or layer named) does not exist."""


NotFound = SandboxNotFound


class AlreadyExists(BrigError):
    """Something with that name already exists."""


class PermissionDenied(BrigError):
    """Not allowed: a protected path, a path leaving the sandbox, another project's sandbox."""


class InvalidComponent(BrigError):
    """A tool component is malformed or implements no world Brig runs."""


class ResourceExhausted(BrigError):
    """The node is out of a resource right now (slots, memory); `retryable` is true."""


class Unavailable(BrigError):
    """The server is shutting down or a dependency is briefly away; `retryable` is true."""


class Conflict(BrigError):
    """The object is in use."""


class TooLarge(BrigError):
    """A payload is larger than the server accepts."""


class InternalError(BrigError):
    """A bug or an unexpected host failure."""


class Expired(BrigError):
    """The sandbox was destroyed by its idle TTL or lifetime limit."""


class DataLoss(BrigError):
    """Stored data is missing or corrupt."""


class SandboxLost(BrigError):
    """The node that held the sandbox stopped answering; the sandbox is failed."""


class QuotaExceeded(BrigError):
    """The project is at a limit (live sandboxes or creation rate)."""


class ConnectionFailed(BrigError):
    """brigd could not be reached, or the connection broke during the request."""


class ConfigError(BrigError):
    """Local configuration (state directory, token, certificate) or local file I/O failed."""


__all__ = [
    "BrigError",
    "Unauthenticated",
    "VersionMismatch",
    "BadRequest",
    "SandboxNotFound",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "InvalidComponent",
    "ResourceExhausted",
    "Unavailable",
    "Conflict",
    "TooLarge",
    "InternalError",
    "Expired",
    "DataLoss",
    "SandboxLost",
    "QuotaExceeded",
    "ConnectionFailed",
    "ConfigError",
]
