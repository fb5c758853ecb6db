"""A real S3 API server on loopback for tests and benchmarks: moto's server mode.

    with S3Server() as server:           # 127.0.0.1, a free port; the environment s3fs reads
        server.create_bucket("runs")
        server.upload("sample_runs", "s3://runs/sample_runs")
        ...                              # forensics analyze s3://runs/sample_runs
        server.requests                  # what the server was asked: method, key, query, bytes

Each server starts with no bucket (moto keeps one state per process: it is emptied when a
server starts and when it stops), so run one at a time in a process. The server keeps a
log of every request it answered (:class:`Request`): tests count the listing calls and
the bytes sent back from it, whatever client made them. Starting sets
``AWS_ENDPOINT_URL`` and dummy credentials in ``os.environ`` (restored by :meth:`stop`),
so an s3fs made afterwards, in this process or a child, talks to this server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

BUCKET = "runs"
"""The bucket the fixtures of :mod:`tests.remote_fixtures` make."""

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_SECURITY_TOKEN": "testing",
       "AWS_SESSION_TOKEN": "testing"}


@dataclass(frozen=True)
class Request:
    """One request the server answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    status: int
    sent: int
    """Bytes of the response body."""
    range: str | None

    @property
    def is_list(self) -> bool:
        """A ListObjects(V2) call: a GET on a bucket (no key) that is not a bucket query."""
        parts = self.path.strip("/").split("/", 1)
        return self.method == "GET" and len(parts) == 1 and not (
            {"location", "policy", "acl", "versioning", "tagging"} & set(self.query))

    @property
    def key(self) -> str:
        parts = self.path.strip("/").split("/", 1)
        return parts[1] if len(parts) == 2 else ""


class _Logged:
    """WSGI middleware that records each request and the size of its answer."""

    def __init__(self, app: Any, log: list[Request], lock: threading.Lock) -> None:
        self.app = app
        self.log = log
        self.lock = lock
        self.denied: set[str] = set()

    def _refuse(self, environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes] | None:
        """S3's answer to a reader without the right to read the object (GET or HEAD)."""
        from urllib.parse import unquote

        path = unquote(environ.get("PATH_INFO", "")).strip("/")
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD") or \
                not any(path.startswith(p) for p in self.denied) or "/" not in path:
            return None
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                b"<Message>Access Denied</Message></Error>")
        start("403 Forbidden", [("Content-Type", "application/xml"),
                                ("Content-Length", str(len(body)))])
        return [body] if environ["REQUEST_METHOD"] == "GET" else []

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        refused = self._refuse(environ, start)
        if refused is not None:
            return refused
        status: list[int] = []

        def start_logged(code: str, headers: Any, *rest: Any) -> Any:
            status.append(int(code.split()[0]))
            return start(code, headers, *rest)

        body = list(self.app(environ, start_logged))
        from urllib.parse import unquote

        request = Request(environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO", "")),
                          parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True),
                          status[0] if status else 0, sum(map(len, body)),
                          environ.get("HTTP_RANGE"))
        with self.lock:
            self.log.append(request)
        return body


class S3Server:
    """moto's S3 server on 127.0.0.1 (a free port), with a request log."""

    def __init__(self) -> None:
        self._log: list[Request] = []
        self._lock = threading.Lock()
        self._server: Any = None
        self._app: Any = None
        self._thread: threading.Thread | None = None
        self._saved: dict[str, str | None] = {}
        self.endpoint = ""

    def start(self) -> S3Server:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        _reset_moto()
        class Quiet(MotoRequestHandler):  # type: ignore[misc]
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        app = _Logged(DomainDispatcherApplication(create_backend_app), self._log, self._lock)
        self._app = app
        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        env = {**ENV, "AWS_ENDPOINT_URL": self.endpoint}
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        forget_filesystems()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        _reset_moto()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        forget_filesystems()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the log ---------------------------------------------------------------------
    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._log)

    def clear(self) -> None:
        with self._lock:
            self._log.clear()

    def deny(self, *prefixes: str) -> None:
        """Answer reads of the objects whose ``bucket/key`` starts with one of ``prefixes``
        with S3's 403 AccessDenied, as a bucket policy denying them would (moto's server
        does not enforce policies)."""
        self._app.denied = set(prefixes)

    # --- the buckets -----------------------------------------------------------------
    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def upload(self, local_dir: str, url: str) -> list[str]:
        """Copy every file below ``local_dir`` to the prefix ``url`` (``s3://bucket/p``),
        in one ``pipe`` call; the keys written, sorted."""
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        blobs: dict[str, bytes] = {}
        for folder, _, files in os.walk(local_dir):
            for name in files:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                with open(path, "rb") as fh:
                    blobs["/".join(p for p in (bucket, prefix, rel) if p)] = fh.read()
        filesystem().pipe(blobs)
        return sorted(blobs)

    def put(self, blobs: dict[str, bytes]) -> None:
        """Write objects (``bucket/key``: bytes) straight into the server's store, not
        through its HTTP API: for fixtures of thousands of keys, which a PUT each takes
        tens of seconds to write. What is read back (listing, size, ETag, bytes) is the
        same as after :meth:`upload`; the request log does not show these writes."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for path, data in blobs.items():
            bucket, _, key = path.partition("/")
            backend.put_object(bucket, key, data)

    def snapshot(self, bucket: str) -> dict[str, tuple[int, str]]:
        """Every key of ``bucket`` with its size and ETag."""
        out: dict[str, tuple[int, str]] = {}
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for page in pages:
            for item in page.get("Contents", []):
                out[item["Key"]] = (int(item["Size"]), str(item["ETag"]))
        return out


def _reset_moto() -> None:
    """Empty moto's buckets: its state is one per process, shared by every server started
    in it, so a module's objects would otherwise show in the next module's bucket."""
    from moto.moto_api._internal.models import moto_api_backend

    moto_api_backend.reset()


def filesystem() -> Any:
    """A fresh s3fs (not fsspec's cached instance) for writing fixtures."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def forget_filesystems() -> None:
    """Drop fsspec's cached filesystems, which hold the endpoint they were made with."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


def keys_of(requests: Iterable[Request], method: str = "GET") -> Iterator[str]:
    return (r.key for r in requests if r.method == method and r.key)
