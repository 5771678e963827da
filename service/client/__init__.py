"""The Reprotrain API from Python (`from reprotrain import Client`).

c = Client()                      # REPRO_API_URL and REPRO_TOKEN, or pass them
run = c.submit("spec.yaml").wait()
print(run.rerun().wait().verdict)  # "identical"
"""

from __future__ import annotations

from .admin import Tokens
from .client import Client, Run, RunPage
from .errors import (
    ApiError,
    InsecureTransportWarning,
    ReproError,
    SpecFileError,
    Unreachable,
    WaitTimeout,
)
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
    DifferingField,
    Experiment,
    MetricCurve,
    ModelDefinition,
    ModelDefinitionPage,
    ModelLayer,
    PairVerdict,
    ProvenanceField,
    Refinement,
    RunsComparison,
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
    "DifferingField",
    "Experiment",
    "InsecureTransportWarning",
    "MetricCurve",
    "ModelDefinition",
    "ModelDefinitionPage",
    "ModelLayer",
    "Models",
    "PairVerdict",
    "ProvenanceField",
    "Refinement",
    "ReproError",
    "Run",
    "RunPage",
    "RunState",
    "RunsComparison",
    "SpecField",
    "SpecFileError",
    "SpotCheck",
    "Token",
    "Tokens",
    "Unreachable",
    "WaitTimeout",
]
