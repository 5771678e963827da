"""Reading a training state's variables: which variables, under which paths, and their
current values as NumPy arrays, without a copy where the framework allows.

Variables are read through `.path` and `.numpy()`, or, for TensorFlow and Keras variables,
through the backend variable's handle: one `ReadVariableOp` each at the first read, then
all with one `_ReadVariablesOp`. TensorFlow is used only when it is already imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class Variable(Protocol):
    """What a read needs of a variable: its path and its value."""

    path: str

    def numpy(self) -> np.ndarray: ...


def unique_paths(paths: Sequence[str]) -> list[str]:
    """Paths made unique in order: a repeated `p` becomes `p#1`, `p#2`, ..."""
    seen: dict[str, int] = {}
    out = []
    for path in paths:
        n = seen.get(path, 0)
        seen[path] = n + 1
        out.append(path if n == 0 else f"{path}#{n}")
    return out


class TrainingState(tuple[tuple[str, Any], ...]):
    """`training_state(...)`'s (path, variable) entries, with how to read each kept once.

    What a read needs (the backend variable's handle and dtype) is found on the first read
    and reused, since finding it took about a fifth of a small model's read time.
    """

    _handles: list[tuple[Any, Any] | None] | None = None
    lane_plan: object = None  # kept here by worker.record.fingerprint: its lanes for these sizes


def training_state(model: Any, optimizer: Any | None = None) -> TrainingState:
    """Every variable that determines how training continues, with stable unique paths.

    Model variables (weights, BatchNorm statistics, dropout seed-generator states) come
    first under `model/`, then the optimizer's (iteration count, moments) under
    `optimizer/`. Order is the framework's creation order, which is deterministic.
    """
    variables: list[Variable] = list(model.variables)
    prefixes = ["model/"] * len(variables)
    if optimizer is not None:
        opt_vars = list(optimizer.variables)
        variables += opt_vars
        prefixes += ["optimizer/"] * len(opt_vars)
    paths = unique_paths([p + v.path for p, v in zip(prefixes, variables, strict=True)])
    return TrainingState(zip(paths, variables, strict=True))


def _variable_reader() -> Callable[..., Any] | None:
    """TensorFlow's ReadVariableOp if TensorFlow is loaded (else no TensorFlow variable exists).

    The generated op function itself where it is loaded: `tf.raw_ops`' export of it adds
    dispatch layers that cost about a quarter of a small variable's read.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    generated = sys.modules.get("tensorflow.python.ops.gen_resource_variable_ops")
    reader = getattr(generated, "read_variable_op", None)
    if not callable(reader):
        reader = getattr(getattr(tf, "raw_ops", None), "ReadVariableOp", None)
    return reader if callable(reader) else None


def _read_variable(variable: Variable, reader: Callable[..., Any] | None = None) -> np.ndarray:
    """The current value of a variable, equal to `np.asarray(variable.numpy())`.

    TensorFlow's `.numpy()` copies the whole buffer, which takes longer than hashing it.
    A `ReadVariableOp` returns a tensor sharing the variable's buffer (TensorFlow copies on
    write while such a tensor is alive, so it stays a snapshot) and NumPy views a CPU
    tensor without copying. It is run directly rather than through `read_value()`, whose
    name scope, gradient-tape check and extra `identity` op took most of a small model's
    fingerprint; and eagerly rather than as one compiled read of every variable, because
    the compiled read is instantiated again whenever TensorFlow's caches are cleared, as
    `tf.random.set_seed` does (20 ms against 2 ms per trace point in a job that reseeds
    TensorFlow every epoch, as jobs with stateful random ops still do). A Keras
    variable holds its backend variable in `.value`, which is also what its `.numpy()` reads.
    """
    if reader is not None:
        direct = _direct_read(variable, reader)
        if direct is not None:
            return direct[1]
    for holder in (getattr(variable, "value", None), variable):
        read_value = getattr(holder, "read_value", None)
        if callable(read_value):
            try:
                return np.asarray(read_value())
            except (TypeError, ValueError):
                break
    return np.asarray(variable.numpy())


def _direct_read(
    variable: Variable, reader: Callable[..., Any]
) -> tuple[tuple[Any, Any], np.ndarray] | None:
    """(handle, dtype) and the value read through them as a NumPy view, or None if unreadable so."""
    holders: tuple[Any, ...] = (getattr(variable, "value", None), variable)  # a method on tf
    for holder in holders:
        try:
            handle, dtype = holder.handle, holder.dtype
        except (AttributeError, ValueError):  # not a plain resource variable (mirrored)
            continue
        try:
            return (handle, dtype), np.asarray(reader(resource=handle, dtype=dtype))
        except (TypeError, ValueError):
            return None  # dtypes NumPy cannot view in place (bfloat16 tensors): copy instead
    return None


def _read_all(handles: Sequence[tuple[Any, Any]]) -> list[np.ndarray] | None:
    """The values of resource variables by (handle, dtype), all read by one eager
    `_ReadVariablesOp`, as NumPy views; None where TensorFlow cannot run it here.

    One op for every variable costs about what two `ReadVariableOp`s do (55 against 250 us
    for 28 small variables), and its outputs are the same snapshots sharing the variables'
    buffers. The op is TensorFlow's own, registered beside `ReadVariableOp`, but internal
    (no public wrapper), so it is called through the eager fast path that generated op
    wrappers use.
    """
    pywrap = sys.modules.get("tensorflow.python.pywrap_tfe")
    context = sys.modules.get("tensorflow.python.eager.context")
    execute = getattr(pywrap, "TFE_Py_FastPathExecute", None)
    if execute is None or context is None or not handles:
        return None
    ctx = context.context()
    if not ctx.executing_eagerly():
        return None
    try:
        resources, dtypes = [h for h, _ in handles], [d for _, d in handles]
        values = execute(ctx, "_ReadVariablesOp", None, resources, "dtypes", dtypes)
        return [np.asarray(v) for v in values]
    except Exception:  # any failure: the caller reads one op each, which raises
        return None  # TensorFlow's own error if a variable itself is unreadable


def read_state(state: Sequence[tuple[str, Variable]]) -> list[np.ndarray]:
    """The current values of `training_state(...)` entries, as NumPy views where possible."""
    reader = _variable_reader()
    if reader is None or not isinstance(state, TrainingState):
        return [_read_variable(v, reader) for _, v in state]
    handles = state._handles
    if handles is None:
        found = [_direct_read(v, reader) for _, v in state]
        state._handles = [d[0] if d is not None else None for d in found]
        arrays = [
            d[1] if d is not None else _read_variable(v, reader)
            for d, (_, v) in zip(found, state, strict=True)
        ]
        return arrays
    direct = [(i, h) for i, h in enumerate(handles) if h is not None]
    together = _read_all([h for _, h in direct])
    if together is None:  # one op each, through the handles found at the first read
        together = [np.asarray(reader(resource=h[0], dtype=h[1])) for _, h in direct]
    read = {i: array for (i, _), array in zip(direct, together, strict=True)}
    return [read[i] if i in read else _read_variable(v, reader) for i, (_, v) in enumerate(state)]
