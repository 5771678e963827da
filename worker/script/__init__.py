"""Your own training script, made reproducible with two lines at its top:

    import reprotrain
    run = reprotrain.init(project="digits", name="cnn", params={"lr": 0.01})

`init` controls every source of randomness the job runtime controls (the same code:
`worker.training.determinism`), records the run's provenance, and keeps a record of the
run that `run.keras_callback()` (or `run.trace_point(...)` in a custom loop) fills with the
fingerprint of the model, optimizer and RNG state at every epoch end, so two runs of the
script can be compared variable by variable. TensorFlow is imported only by the script:
when the script imports it after `init`, it is set up the moment its import finishes.
"""

from __future__ import annotations

from worker.script.run import ScriptRun, autolog, connect_with, init

__all__ = ["ScriptRun", "autolog", "connect_with", "init"]
