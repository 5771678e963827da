"""The Reprotrain API from Python (`from reprotrain import Client`).

c = Client()                      # REPRO_API_URL and REPRO_TOKEN, or pass them
run = c.submit("spec.yaml").wait()
print(run.rerun().wait().verdict)  # "identical"

And in your own training script (`reprotrain.init`, from `worker.script`, loaded only when
asked for: the client itself needs no TensorFlow):

run = reprotrain.init(project="digits", params={"lr": 0.01})
reprotrain.autolog()  # or: model.fit(..., callbacks=[run.keras_callback()])
"""

from __future__ import annotations

from . import generator_marks  # first: where the global generators stand before any import
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
    Progress,
    ProvenanceField,
    Refinement,
    RunLog,
    RunsComparison,
    RunState,
    SpecField,
    SpotCheck,
    Token,
)
from .script_bundle import ScriptDirectoryError
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
    "Progress",
    "ProvenanceField",
    "Refinement",
    "ReproError",
    "Run",
    "RunLog",
    "RunPage",
    "RunState",
    "RunsComparison",
    "ScriptDirectoryError",
    "SpecField",
    "SpecFileError",
    "SpotCheck",
    "Token",
    "Tokens",
    "Unreachable",
    "WaitTimeout",
]


generator_marks.imported()


def __getattr__(name: str) -> object:
    # The in-script runtime shares the job runtime's seeding and fingerprints (worker/);
    # importing it here at once would load it for every client user.
    if name in ("init", "autolog", "ScriptRun"):
        import worker.script

        from .by_hand import connect

        # A script run by hand records its run on the service the environment names.
        worker.script.connect_with(connect)
        return getattr(worker.script, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
