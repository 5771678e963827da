"""Domain errors of the service; each maps to one HTTP status in `service.api.main`."""

from __future__ import annotations


class ServiceError(Exception):
    """Service error."""

    status_code = 500

    def __init__(
        self,
        message: str | None = None,
        *,
        errors: list[dict[str, str]] | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message or (self.__doc__ or "").strip())
        self.errors = errors or []
        # Seconds a client should wait before trying again (429, 503): sent as Retry-After.
        self.retry_after = retry_after


class NotFound(ServiceError):
    """No such resource."""

    status_code = 404


class Conflict(ServiceError):
    """The request conflicts with the resource's current state."""

    status_code = 409


class NotHeld(Conflict):
    """This worker does not hold the run (its lease expired, or the run was cancelled)."""


class InvalidSpec(ServiceError):
    """The experiment spec is invalid."""

    status_code = 422


class InvalidQuery(ServiceError):
    """The request's query parameters name nothing this service can answer for."""

    status_code = 422


class MalformedBody(ServiceError):
    """The request body is not well-formed."""

    status_code = 400


class BodyTooLarge(ServiceError):
    """The request body is larger than this server accepts."""

    status_code = 413


class UnsupportedMediaType(ServiceError):
    """The request body has a content type this endpoint does not accept."""

    status_code = 415


class DigestMismatch(ServiceError):
    """The uploaded bytes do not match the declared digest; nothing was stored."""

    status_code = 400


class DatasetRefused(ServiceError):
    """The upload is not a dataset this service accepts; nothing was stored."""

    status_code = 422


class ModelDefinitionRefused(ServiceError):
    """The upload is not a model definition this service accepts; nothing was stored."""

    status_code = 422


class CodeBundleRefused(ServiceError):
    """The upload is not a code bundle this service accepts, or bundles are off; nothing stored."""

    status_code = 422


class CheckpointRefused(ServiceError):
    """A checkpoint declares arrays that are not plain numbers or exceed what may be read."""

    status_code = 422


class Unauthorized(ServiceError):
    """A valid bearer token is required."""

    status_code = 401


class Forbidden(ServiceError):
    """This token's role does not allow that."""

    status_code = 403


class RateLimited(ServiceError):
    """Too many requests."""

    status_code = 429


class ServiceUnavailable(ServiceError):
    """The server is at a configured limit; try again later."""

    status_code = 503


class StoreUnavailable(ServiceError):
    """The object store does not answer, or refuses this server's credentials."""

    status_code = 503
