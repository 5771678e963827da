"""The Reprotrain API from Python (`from reprotrain import Client`).

c = Client()                      # REPRO_API_URL and REPRO_TOKEN, or pass them
run = c.submit("spec.yaml").wait()
print(run.rerun().wait().verdict)  # "identical"
"""

from __future__ import annotations

from .admin import Tokens
from .client import Client, Run, RunPage
from .errors import ApiError, ReproError, SpecFileError, Unreachable, WaitTimeout
from .models import (
    ArrayInfo,
    Audit,
    AuditEvent,
    AuditLogPage,
    CodeBundle,
    CodeBundlePage,
    CodeEntryPoint,
    CodeFile,
    Comparison,
    Dataset,
    DatasetPage,
    Experiment,
    ModelDefinition,
    ModelDefinitionPage,
    ModelLayer,
    ProvenanceField,
    Refinement,
    RunState,
    SpecField,
    SpotCheck,
    Token,
)
from .stored import CodeBundles, Datasets, Models

__all__ = [
    "ApiError",
    "ArrayInfo",
    "Audit",
    "AuditEvent",
    "AuditLogPage",
    "Client",
    "CodeBundle",
    "CodeBundlePage",
    "CodeBundles",
    "CodeEntryPoint",
    "CodeFile",
    "Comparison",
    "Dataset",
    "DatasetPage",
    "Datasets",
    "Experiment",
    "ModelDefinition",
    "ModelDefinitionPage",
    "ModelLayer",
    "Models",
    "ProvenanceField",
    "Refinement",
    "ReproError",
    "Run",
    "RunPage",
    "RunState",
    "SpecField",
    "SpecFileError",
    "SpotCheck",
    "Token",
    "Tokens",
    "Unreachable",
    "WaitTimeout",
]
