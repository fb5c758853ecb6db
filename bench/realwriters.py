"""Event files written by the real summary writers, for the ingest benchmark and its tests.

Four layouts, each the output of a writer training code really uses:

  * ``scalars``: torch's ``torch.utils.tensorboard.SummaryWriter.add_scalar`` (``simple_value``)
  * ``histograms``: the same plus ``add_histogram`` (TensorFlow's exponential bins, so records
    of varying length) on two tags every ``hist_every`` steps
  * ``tensorboardx``: tensorboardX's ``SummaryWriter.add_scalar``
  * ``tensor_scalars``: ``add_scalar(..., new_style=True)``, TF2's tensor scalars, each record
    carrying the ``scalars`` plugin's metadata

The content is fixed by a ``Spec`` (steps x tags from one seeded generator, tag 0 is
``train/loss`` and NaN at ``nan_fraction`` of the steps, wall times ``1.7e9 + step / 100``),
so a file can be written again with the same bytes apart from the writer's own ``file_version``
record (its wall time is the clock's) and the file's name.

How the files are made: ``write`` calls the real writer in this process. Through it a record
costs about 0.1 ms (it builds protobufs and computes CRCs in Python), so 200,000 steps x 10
tags take minutes; ``ensure`` therefore writes in a child process (torch stays out of the
caller) and keeps the file in a cache under the temporary directory, keyed by the spec and the
writers' versions, for later runs. ``bench/eventgen.py`` writes the same content in the same
layouts in seconds; ``same_bytes`` compares its records with a real writer's, and the
benchmark uses the fast generator for full-size files only after that check passed.

    python bench/realwriters.py histograms --steps 2000 --out DIR   # write one, print its path
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("scalars", "histograms", "tensorboardx", "tensor_scalars")
HIST_TAGS = ("weights/layer1.weight", "grads/layer1.weight")
WALL0 = 1.7e9
# Changing what a spec writes changes this, so that cached files are not reused.
CONTENT_VERSION = 1


@dataclass(frozen=True)
class Spec:
    kind: str = "scalars"
    steps: int = 200_000
    tags: int = 10
    nan_fraction: float = 0.75
    hist_every: int = 200
    hist_size: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")

    @property
    def nan_step(self) -> int:
        return int(self.steps * self.nan_fraction)

    def tag_names(self) -> list[str]:
        return ["train/loss"] + [f"grad_norm/layer{k}.weight" for k in range(1, self.tags)]

    def key(self) -> str:
        text = repr((CONTENT_VERSION, sorted(asdict(self).items()), _versions()))
        return f"{self.kind}-{self.steps}x{self.tags}-" + hashlib.sha256(
            text.encode()).hexdigest()[:12]


def _versions() -> tuple[str, ...]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("torch", "tensorboardX", "tensorboard", "protobuf"):
        try:
            out.append(f"{name}={version(name)}")
        except PackageNotFoundError:
            out.append(f"{name}=-")
    return tuple(out)


def content(spec: Spec) -> Iterator[tuple[str, str, float | np.ndarray, int, float]]:
    """(what, tag, value, step, wall time) in the order the writer is called: ``what`` is
    ``scalar`` (a float) or ``histogram`` (an array of ``hist_size`` values)."""
    rng = np.random.default_rng(spec.seed)
    names = spec.tag_names()
    histograms = spec.kind == "histograms" and spec.hist_every > 0
    for step in range(spec.steps):
        values = rng.random(spec.tags)
        if step == spec.nan_step:
            values[0] = np.nan
        wall = WALL0 + step * 0.01
        for name, value in zip(names, values.tolist(), strict=True):
            yield "scalar", name, value, step, wall
        if histograms and step % spec.hist_every == 0:
            for tag in HIST_TAGS:
                yield "histogram", tag, rng.standard_normal(spec.hist_size), step, wall


def write(spec: Spec, folder: str) -> str:
    """Write ``spec``'s content with its real writer into ``folder`` (created if missing,
    holding no other event file); return the event file's path."""
    os.makedirs(folder, exist_ok=True)
    if spec.kind == "tensorboardx":
        from tensorboardX import SummaryWriter as TbxWriter

        writer = TbxWriter(folder, max_queue=1000, flush_secs=3600)
    else:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(folder, max_queue=1000, flush_secs=3600)
    new_style = spec.kind == "tensor_scalars"
    try:
        for what, tag, value, step, wall in content(spec):
            if what == "scalar":
                if new_style:
                    writer.add_scalar(tag, value, step, walltime=wall, new_style=True)
                else:
                    writer.add_scalar(tag, value, step, walltime=wall)
            else:
                writer.add_histogram(tag, value, step, walltime=wall)
    finally:
        writer.close()
    files = [n for n in os.listdir(folder) if "tfevents" in n]
    if len(files) != 1:
        raise RuntimeError(f"expected one event file in {folder}, found {sorted(files)}")
    return os.path.join(folder, files[0])


def cache_root() -> str:
    return os.path.join(tempfile.gettempdir(), "forensics-realwriters")


def ensure(spec: Spec, root: str | None = None, timeout: float = 3600.0) -> str:
    """The path of an event file ``spec``'s real writer wrote: from the cache, or written now
    in a child process (minutes at full size). A file is cached only once complete."""
    root = root or cache_root()
    final = os.path.join(root, spec.key())
    if os.path.isdir(final):
        files = [n for n in os.listdir(final) if "tfevents" in n]
        if len(files) == 1:
            return os.path.join(final, files[0])
        shutil.rmtree(final, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".writing-", dir=root)
    try:
        args = [sys.executable, os.path.abspath(__file__), spec.kind, "--out", staging,
                "--steps", str(spec.steps), "--tags", str(spec.tags),
                "--nan-fraction", repr(spec.nan_fraction), "--hist-every", str(spec.hist_every),
                "--hist-size", str(spec.hist_size), "--seed", str(spec.seed)]
        # the writers print a warning per non-finite scalar: shown only if the child fails
        done = subprocess.run(args, timeout=timeout, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"writing {spec} failed:\n{done.stderr[-4000:]}")
        try:
            os.rename(staging, final)
        except OSError:  # another process cached it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ensure(spec, root, timeout)


def records(data: bytes) -> list[bytes]:
    """The framed records of a TFRecord byte string (header, CRCs and payload each), in order;
    used to compare two writers' bytes record by record."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos: pos + 8], "little")
        end = pos + 16 + length
        if end > len(data):
            break
        out.append(data[pos:end])
        pos = end
    if pos != len(data):
        raise ValueError(f"trailing {len(data) - pos} bytes at offset {pos}")
    return out


def same_bytes(real: bytes, fast: bytes) -> str | None:
    """None when the two files hold the same records, the first being the ``file_version``
    record whose wall time is the writer's clock; else where they differ."""
    from tensorboard.compat.proto import event_pb2

    try:
        a, b = records(real), records(fast)
    except ValueError as exc:
        return f"not whole records: {exc}"
    if len(a) != len(b):
        return f"{len(a)} records against {len(b)}"
    if not a:
        return None
    first_a, first_b = event_pb2.Event.FromString(a[0][12:-4]), event_pb2.Event.FromString(
        b[0][12:-4])
    if first_a.file_version != first_b.file_version:
        return f"file_version {first_a.file_version!r} against {first_b.file_version!r}"
    for index, (x, y) in enumerate(zip(a[1:], b[1:], strict=True), start=1):
        if x != y:
            return f"record {index} differs ({len(x)} against {len(y)} bytes)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--out", required=True, help="folder to write the event file into")
    defaults = Spec()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--tags", type=int, default=defaults.tags)
    parser.add_argument("--nan-fraction", type=float, default=defaults.nan_fraction)
    parser.add_argument("--hist-every", type=int, default=defaults.hist_every)
    parser.add_argument("--hist-size", type=int, default=defaults.hist_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args()
    spec = Spec(kind=args.kind, steps=args.steps, tags=args.tags, nan_fraction=args.nan_fraction,
                hist_every=args.hist_every, hist_size=args.hist_size, seed=args.seed)
    print(write(spec, args.out))


if __name__ == "__main__":
    main()
