"""How large the result document of a spec's run can get, computed at submit without TensorFlow.

A worker sends its whole result in one `complete` request, bounded by `max_result_bytes`;
a result past it could never be delivered, so such a spec is refused at submit. Most of a
result is its fingerprint trace: one point per epoch end (and one every
`fingerprint_every_steps` steps), each holding a digest per variable of the model and the
optimizer. The estimate is an upper bound for the built-in architectures.
"""

from __future__ import annotations

from pydantic import ValidationError

from worker.models import builtin_params as bp
from worker.spec import ExperimentSpec

# Provenance, determinism settings, warnings and timings of one result, with room to spare
# (a real one is about 10 KB).
RESULT_BASE_BYTES = 256 * 1024
# Per epoch: its metrics and the digest of its data.
EPOCH_BYTES = 512
# Per trace point: kind, epoch, step and the model fingerprint; per variable in it, its path
# (about 20 to 60 characters, the optimizer's slots the longest) and its 71-character digest.
POINT_BYTES = 160
VARIABLE_BYTES = 144
# Model variables assumed for an architecture whose structure is not known here.
UNKNOWN_MODEL_VARIABLES = 128


def model_variables(spec: ExperimentSpec) -> int:
    """Variables of the spec's model (an upper bound), from its architecture's params."""
    name, params = spec.model.architecture, spec.model.params
    try:
        if name == "mlp":
            mlp = bp.MLPParams.model_validate(params)
            return 2 * (len(mlp.hidden) + 1) + (4 * len(mlp.hidden) if mlp.batch_norm else 0)
        if name == "small_cnn":
            cnn = bp.SmallCNNParams.model_validate(params)
            return 5 * len(cnn.filters) + (2 if cnn.dense else 0) + 2  # conv + batch norm each
        if name == "tiny_transformer":
            blocks = bp.TinyTransformerParams.model_validate(params).num_blocks
            return 2 + 16 * blocks + 2  # embeddings; attention, norms, feed-forward; output
        if name == "gru":
            bp.GRUParams.model_validate(params)
            return 1 + 3 + 2
    except ValidationError:  # check_spec reports bad params; the estimate stays an upper bound
        pass
    return UNKNOWN_MODEL_VARIABLES


def trace_points(spec: ExperimentSpec) -> int:
    """Points of the spec's fingerprint trace: initialisation, each epoch end, every N steps."""
    tr = spec.training
    every = tr.fingerprint_every_steps
    return 1 + tr.epochs + (tr.epochs * spec.dataset.train_batches // every if every else 0)


def result_bytes(spec: ExperimentSpec) -> int:
    """An upper bound on the bytes of the result document a run of the spec sends."""
    # Each model variable may have two optimizer slots (Adam); plus the optimizer's counters.
    variables = 3 * model_variables(spec) + 4
    point = POINT_BYTES + variables * VARIABLE_BYTES
    return RESULT_BASE_BYTES + spec.training.epochs * EPOCH_BYTES + trace_points(spec) * point
