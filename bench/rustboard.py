"""TensorBoard's Rust data server ("rustboard") as a reference reader for the ingest benchmark.

The ``tensorboard_data_server`` package ships the binary TensorBoard itself starts to load
event files. ``measure`` starts it on a log folder (127.0.0.1, port 0, a port file,
``--checksum`` so that every record's CRC is checked as this reader checks them, all scalar
samples kept, one load), then asks it over gRPC, as TensorBoard's own front end does:
``ListScalars`` until every expected tag shows its last step (the ingest time is from the
process's start to that answer), then ``ReadScalars`` for every point (timed apart). Its peak
RSS is the server's ``VmHWM`` read just before it is stopped, by its PID; it also dies when
this process closes its stdin (``--die-after-stdin``), so a crash here leaves nothing running.

    python bench/rustboard.py LOGDIR TAG=LAST_STEP ...    # prints the figures
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


class Unavailable(RuntimeError):
    """The server cannot run here (package missing, binary not executable, no gRPC)."""


def binary() -> str:
    try:
        import tensorboard_data_server
    except ImportError as exc:
        raise Unavailable(f"tensorboard_data_server is not installed ({exc})") from exc
    path = tensorboard_data_server.server_binary()
    if not path or not os.access(path, os.X_OK):
        raise Unavailable(f"no executable rustboard binary ({path!r})")
    return str(path)


@dataclass
class Result:
    ingest_s: float  # process start to every expected tag at its last step
    read_s: float  # ReadScalars of every point
    peak_rss: int  # bytes, the server's VmHWM
    cpu_s: float  # the server's user + system time, all threads
    points: dict[str, int] = field(default_factory=dict)  # "run/tag" -> points read back
    nonfinite: int = 0  # non-finite values among them


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One rustboard process on ``logdir``; a context manager that always stops it."""

    def __init__(self, logdir: str, *, checksum: bool = True, samples: str = "scalars=all",
                 start_timeout: float = 30.0, cpus: Sequence[int] | None = None) -> None:
        self.logdir, self.checksum, self.samples = logdir, checksum, samples
        self.start_timeout, self.cpus = start_timeout, cpus
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Any = None
        self.stub: Any = None
        self.started = 0.0
        self._tmp: str | None = None
        """The port file's folder, made by start and removed by stop."""

    def __enter__(self) -> Server:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        try:
            import grpc
            from tensorboard.data.proto import data_provider_pb2_grpc
        except ImportError as exc:
            raise Unavailable(f"grpc or tensorboard's data provider protos missing ({exc})") \
                from exc
        if self.proc is not None:
            raise RuntimeError("this server is already started")
        program = binary()
        self._tmp = tempfile.mkdtemp(prefix="forensics-rustboard-")
        port_file = os.path.join(self._tmp, "port")
        args = [program, "--logdir", self.logdir, "--host", "127.0.0.1", "--port", "0",
                "--port-file", port_file, "--reload", "once", "--die-after-stdin",
                "--checksum" if self.checksum else "--no-checksum"]
        if self.samples:
            args += ["--samples-per-plugin", self.samples]
        cpus = self.cpus

        def pin() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, set(cpus))

        self.started = time.perf_counter()
        try:
            # No preexec_fn unless pinning: it is unsafe once this process runs threads
            # (gRPC's, from an earlier server), and forces a plain fork.
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL,
                                         preexec_fn=pin if cpus is not None else None)
        except OSError as exc:  # e.g. a binary for another machine
            self.stop()
            raise Unavailable(f"rustboard cannot be started: {exc}") from exc
        try:
            port = self._port(port_file)
            self.channel = grpc.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)])
            self.stub = data_provider_pb2_grpc.TensorBoardDataProviderStub(self.channel)
        except BaseException:
            self.stop()
            raise

    def _port(self, port_file: str) -> int:
        assert self.proc is not None
        deadline = self.started + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise Unavailable(f"rustboard exited with status {self.proc.returncode}")
            try:
                with open(port_file) as fh:
                    text = fh.read()
                if text.endswith("\n"):
                    return int(text)
            except (OSError, ValueError):
                pass
            if time.perf_counter() > deadline:
                raise TimeoutError(f"rustboard wrote no port in {self.start_timeout} s")
            time.sleep(0.005)

    def list_scalars(self, timeout: float = 30.0) -> dict[str, int]:
        """{"run/tag": max_step} as the server sees it now."""
        from tensorboard.data.proto import data_provider_pb2 as dp

        request = dp.ListScalarsRequest(plugin_filter=dp.PluginFilter(plugin_name="scalars"))
        response = self.stub.ListScalars(request, timeout=timeout)
        return {f"{run.run_name}/{tag.tag_name}": tag.metadata.max_step
                for run in response.runs for tag in run.tags}

    def wait_complete(self, expected: Mapping[str, int], timeout: float,
                      poll: float = 0.02) -> float:
        """Seconds from the start until every tag of ``expected`` ({tag: last step}, tags as
        logged, whatever the run) shows its last step."""
        import grpc

        deadline = time.perf_counter() + timeout
        while True:
            try:
                seen: dict[str, int] = {}
                for key, step in self.list_scalars(timeout=max(1.0, timeout)).items():
                    tag = key.split("/", 1)[1]
                    seen[tag] = max(step, seen.get(tag, step))
                if all(seen.get(tag, -1) >= last for tag, last in expected.items()):
                    return time.perf_counter() - self.started
            except grpc.RpcError:
                pass  # not serving yet
            if time.perf_counter() > deadline:
                raise TimeoutError(f"rustboard did not show every tag at its last step in "
                                   f"{timeout} s")
            if self.proc is not None and self.proc.poll() is not None:
                raise Unavailable(f"rustboard exited with status {self.proc.returncode}")
            time.sleep(poll)

    def read_scalars(self, timeout: float = 120.0) -> tuple[float, dict[str, int], int]:
        """(seconds, {"run/tag": points}, non-finite values) of reading every scalar back."""
        from tensorboard.data.proto import data_provider_pb2 as dp

        t0 = time.perf_counter()
        request = dp.ReadScalarsRequest(plugin_filter=dp.PluginFilter(plugin_name="scalars"),
                                        downsample=dp.Downsample(num_points=2**31 - 1))
        response = self.stub.ReadScalars(request, timeout=timeout)
        seconds = time.perf_counter() - t0
        points, nonfinite = {}, 0
        for run in response.runs:
            for tag in run.tags:
                points[f"{run.run_name}/{tag.tag_name}"] = len(tag.data.step)
                nonfinite += sum(1 for v in tag.data.value if not math.isfinite(v))
        return seconds, points, nonfinite

    def peak_rss(self) -> int:
        assert self.proc is not None
        return _status_kib(self.proc.pid, "VmHWM") * 1024

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return _cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 10.0) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def measure(logdir: str, expected: Mapping[str, int], *, checksum: bool = True,
            timeout: float = 600.0, samples: str = "scalars=all",
            cpus: Sequence[int] | None = None) -> Result:
    """Ingest ``logdir`` with rustboard and read every scalar back (see the module's text)."""
    with Server(logdir, checksum=checksum, samples=samples, cpus=cpus) as server:
        ingest = server.wait_complete(expected, timeout)
        read, points, nonfinite = server.read_scalars(timeout=timeout)
        return Result(ingest_s=ingest, read_s=read, peak_rss=server.peak_rss(),
                      cpu_s=server.cpu_seconds(), points=points, nonfinite=nonfinite)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir")
    parser.add_argument("expected", nargs="+", help="TAG=LAST_STEP")
    parser.add_argument("--no-checksum", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    expected = {k: int(v) for k, v in (e.rsplit("=", 1) for e in args.expected)}
    result = measure(args.logdir, expected, checksum=not args.no_checksum, timeout=args.timeout)
    print(f"ingest {result.ingest_s:.3f} s, ReadScalars {result.read_s:.3f} s, "
          f"peak RSS {result.peak_rss / 2**20:.0f} MiB, CPU {result.cpu_s:.2f} s, "
          f"{sum(result.points.values())} points, {result.nonfinite} non-finite")


if __name__ == "__main__":
    main()
