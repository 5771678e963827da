"""Errors raised by the training runtime; each class docstring is its default message."""

from __future__ import annotations


class ReproError(Exception):
    """Reprotrain runtime error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class SpecError(ReproError):
    """The experiment spec is invalid."""

    def __init__(self, message: str | None = None, *, errors: list[dict[str, str]] | None = None):
        super().__init__(message)
        # One entry per problem: {"loc": "dataset.batch_size", "msg": "..."}.
        self.errors = errors or []


class UnknownComponentError(SpecError):
    """No generator, architecture, optimizer or loss is registered under that name."""

    def __init__(self, kind: str, name: str, known: list[str], *, loc: str = "") -> None:
        msg = f"unknown {kind} {name!r}; known: {', '.join(sorted(known)) or '(none)'}"
        super().__init__(msg, errors=[{"loc": loc or kind, "msg": msg}])
        self.kind = kind
        self.name = name
        self.known = sorted(known)


class GeneratorError(ReproError):
    """A batch generator broke the contract of StatelessRngDataset."""

    def __init__(self, generator: str, problem: str) -> None:
        super().__init__(f"generator {generator!r}: {problem}")
        self.generator = generator


class ArchitectureError(ReproError):
    """An architecture could not build a model for this data."""


class DeterminismError(ReproError):
    """The process is not set up for deterministic training."""


class CheckpointError(ReproError):
    """A checkpoint is missing, corrupt or belongs to another experiment."""


class CheckpointRefused(CheckpointError):
    """A checkpoint declares arrays that are not plain numbers or exceed what may be read."""


class MalformedSpecError(SpecError):
    """The spec text is not well-formed JSON or YAML."""
