"""The flight recorder: keeps what a replay needs and writes it on the first bad step.

A training loop adds it in two lines::

    recorder = FlightRecorder(run_dir, model, optimizer, model_factory=make_model,
                              loss_factory=make_loss)     # or step_factory=, step_kind=
    for x, y in loader:                                  # every epoch: the recorder counts
        with recorder.step(inputs=x, targets=y) as rec:  # (or batch=... for a step_fn)
            ...                      # the loop's own forward, backward and update
            rec.loss(loss)

and a framework in one: ``analyzer.capture.lightning.FlightRecorderCallback``,
``analyzer.capture.hf.FlightRecorderTrainer``, ``analyzer.capture.accelerate.recorder_for``
(each imports its framework only when used).

Entering ``step`` keeps the state at the start of the step (model, optimizers and
GradScaler state, RNG states, the batch, every group's learning rate). Leaving it checks the
losses, and optionally the gradients and parameters, for NaN/Inf. The first time one
is non-finite (or the step raised on one) it writes ``capture/step_<N>/`` (format in
docs/capture.md) and stops recording. Its factories are built once when it starts, so a
wrong one raises :class:`CaptureSetupError` at step 0; past that, nothing it does raises
into the loop: a failure is warned about once and kept in :attr:`FlightRecorder.errors`.
:class:`StepGuard` is the guarded step: per-layer norms into the run's events, a NaN/Inf
check of every gradient and weight, and an optional refusal of non-finite updates.

``torch`` is imported inside functions so that importing this module stays cheap.

The package: :mod:`.folder` (the capture folder format's one owner: names, discovery,
the reader of meta.json and env.json; no torch), :mod:`.recorder` (the recorder),
:mod:`.batch` (batches kept as ``weights_only`` reads them), :mod:`.format` (what
meta.json is written from: factories, strict JSON), :mod:`.code` and :mod:`.coderef` (where
the factories' code lives, written and read), :mod:`.env` (env.json), :mod:`.rng` (random
states), :mod:`.guard` (the guarded step), and the integrations :mod:`.lightning`,
:mod:`.hf`, :mod:`.accelerate`.
"""

from analyzer.capture.env import environment, write_env
from analyzer.capture.folder import (
    CAPTURE_DIR,
    ENV_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MetaError,
    read_capture_meta,
    read_meta,
)
from analyzer.capture.format import Factory, Mode
from analyzer.capture.guard import GuardFault, StepGuard
from analyzer.capture.recorder import CaptureSetupError, FlightRecorder
from analyzer.capture.rng import restore_rng, rng_state

__all__ = [
    "CAPTURE_DIR",
    "ENV_FILE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CaptureSetupError",
    "Factory",
    "FlightRecorder",
    "GuardFault",
    "MetaError",
    "Mode",
    "StepGuard",
    "environment",
    "read_capture_meta",
    "read_meta",
    "restore_rng",
    "rng_state",
    "write_env",
]
