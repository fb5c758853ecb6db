"""The flight recorder: keeps what a replay needs and writes it on the first bad step.

A training loop adds it in three lines::

    recorder = FlightRecorder(run_dir, model, optimizer, model_factory=..., loss_factory=...)
    for step, (x, y) in enumerate(loader):
        with recorder.step(step, x, y) as rec:
            ...                      # the loop's own forward, backward and update
            rec.loss(loss)

Entering ``step`` keeps the state at the start of the step (model, optimizer and
GradScaler state, RNG states, the batch, the learning rate). Leaving it checks the
loss, and optionally the gradients and parameters, for NaN/Inf. The first time one
is non-finite it writes ``capture/step_<N>/`` (format in docs/capture.md) and stops
recording. Nothing it does raises into the loop: a failure is warned about once and
kept in :attr:`FlightRecorder.errors`.

``torch`` is imported inside functions so that importing this module stays cheap.

The package: :mod:`.folder` (the capture folder format's one owner: names, discovery,
the reader of meta.json and env.json; no torch), :mod:`.recorder` (the recorder),
:mod:`.format` (what meta.json is written from: factories, strict JSON), :mod:`.env`
(env.json), :mod:`.rng` (random states).
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
