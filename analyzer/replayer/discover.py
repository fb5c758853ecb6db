"""Where a run keeps its capture; plain filesystem work, no torch."""

from __future__ import annotations

import os
import re

from analyzer.replayer.errors import CaptureError

_STEP_DIR = re.compile(r"^step_(\d+)$")


def capture_folder(path: str) -> str | None:
    """The capture behind ``path``, or None when it holds none.

    ``path`` may be a ``step_N`` folder (it holds ``meta.json``), a ``capture``
    folder, or a run folder with ``capture/step_N/`` inside; of several steps the
    earliest is taken, since it holds the first failure.
    """
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    for base in (os.path.join(path, "capture"), path):
        if not os.path.isdir(base):
            continue
        try:
            names = os.listdir(base)
        except OSError:
            continue
        steps = sorted((int(m[1]), name) for name in names
                       if (m := _STEP_DIR.match(name)) and os.path.isdir(os.path.join(base, name)))
        if steps:
            return os.path.join(base, steps[0][1])
    return None


def find_capture(path: str) -> str:
    """Like :func:`capture_folder`, but a path without a capture is an error."""
    if not os.path.exists(path):
        raise CaptureError(path, "no such file or folder")
    found = capture_folder(path)
    if found is None:
        raise CaptureError(path, "holds no capture (no capture/step_<N>/meta.json)")
    return found
