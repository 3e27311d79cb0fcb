"""The notification receiver: an aiohttp app that lands every valid notification durably.

Routes:

- ``POST /notify``: NGSI v2 notifications (NGSI-LD when the Content-Type is ``application/ld+json``)
- ``POST /ngsi-ld/notify``: NGSI-LD notifications
- ``POST /messages``: generic data-hub messages (seed 004)
- ``GET /health``: liveness, counters and the last sync latency
- ``GET /version``

A valid request is answered ``201`` with ``{"message_id": ..., "recv_ms": ...}`` only after its
landing line is synced to disk. Anything a client sent wrong is a 4xx with the JSON error shape of
:class:`~ngsi_assets.ngsi.payloads.PayloadError` and writes nothing. The one 5xx is ``503``: the
landing zone could not be written, so the client (Orion) should retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from ngsi_assets.ingest.landing import (
    FIELD_SOURCES,
    LandingWriteError,
    LandingWriter,
    WriterClosedError,
    unwritable_field,
)
from ngsi_assets.ngsi.envelope import MessageIdFactory
from ngsi_assets.ngsi.payloads import Endpoint, IngestSettings, PayloadError, validate_request

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ORIGIN_HTTP = "http"
RETRY_AFTER_S = "1"


@dataclass
class ReceiverState:
    """What the handlers share: the writer, the settings and the counters ``/health`` reports."""

    writer: LandingWriter
    settings: IngestSettings
    ids: MessageIdFactory
    clock: Callable[[], float]
    started: float = field(default_factory=time.time)
    accepted: int = 0
    failed: int = 0
    rejected: Counter[int] = field(default_factory=Counter)
    last_write_error: str | None = None


STATE = web.AppKey("ngsi_receiver_state", ReceiverState)


def _json(status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> web.Response:
    try:
        body = orjson.dumps(payload)
    except TypeError:  # client text with lone surrogates quoted in an error: escape it instead
        body = json.dumps(payload, default=str).encode()
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _error_body(error: str, field_name: str | None, description: str) -> dict[str, Any]:
    return {"error": error, "field": field_name, "description": description}


def _too_large(state: ReceiverState, detail: str) -> web.Response:
    limit = state.settings.max_body_bytes
    problem = PayloadError(413, "body", f"request body is larger than {limit} bytes ({detail})")
    state.rejected[413] += 1
    response = _json(413, problem.to_dict())
    # The rest of the body is never read: close instead of draining it for keep-alive.
    response.force_close()
    return response


def _reject(state: ReceiverState, error: PayloadError) -> web.Response:
    state.rejected[error.status] += 1
    return _json(error.status, error.to_dict())


async def _expect_handler(request: web.Request) -> web.StreamResponse | None:
    """Answer ``Expect: 100-continue`` with 413 up front when the declared body is too large."""
    state = request.app[STATE]
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        state.rejected[417] += 1
        return _json(417, _error_body("ExpectationFailed", "Expect", f"unsupported Expect: {expect!r}"))
    length = request.content_length
    if length is not None and length > state.settings.max_body_bytes:
        return _too_large(state, f"Content-Length {length}")
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
    return None


def _ingest_handler(endpoint: Endpoint) -> Handler:
    async def ingest(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        settings = state.settings
        length = request.content_length
        if length is not None and length > settings.max_body_bytes:
            return _too_large(state, f"Content-Length {length}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(state, "streamed body")
        except Exception as exc:
            return _reject(state, PayloadError(400, "body", f"could not read the request body: {exc}"))
        try:
            message = validate_request(endpoint, request.headers, body, settings)
        except PayloadError as exc:
            return _reject(state, exc)
        except Exception as exc:  # a validator bug must still not turn client input into a 5xx
            return _reject(state, PayloadError(400, "body", f"unprocessable body: {type(exc).__name__}: {exc}"))
        now_ms = int(state.clock() * 1000)
        envelope = message.stamp(state.ids.new(now_ms), now_ms, ORIGIN_HTTP)
        try:
            await state.writer.append(envelope)
        except (TypeError, ValueError) as exc:  # raised while rendering the line, before any write
            name = unwritable_field(envelope)
            where = FIELD_SOURCES.get(name or "", name or "headers")
            return _reject(state, PayloadError(400, where, f"not valid UTF-8 text: {exc}"))
        except (LandingWriteError, WriterClosedError, OSError) as exc:
            state.failed += 1
            state.last_write_error = str(exc)
            return _json(
                503,
                _error_body("ServiceUnavailable", None, f"the landing zone could not be written: {exc}"),
                headers={"Retry-After": RETRY_AFTER_S},
            )
        state.accepted += 1
        state.last_write_error = None
        return _json(201, {"message_id": envelope.message_id, "recv_ms": now_ms})

    ingest.__name__ = f"ingest_{endpoint.name.lower()}"
    return ingest


async def _health(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    stats = state.writer.stats()
    healthy = not state.writer.closed and state.last_write_error is None
    return _json(
        200 if healthy else 503,
        {
            "status": "ok" if healthy else "degraded",
            "landing_root": str(state.writer.root),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - state.started, 3),
            "accepted": state.accepted,
            "rejected": sum(state.rejected.values()),
            "rejected_by_status": {str(k): v for k, v in sorted(state.rejected.items())},
            "failed": state.failed,
            "last_fsync_ms": None if stats.last_sync_ms is None else round(stats.last_sync_ms, 3),
            "batches": stats.batches,
            "last_batch_lines": stats.last_batch_lines,
            "segments": stats.segments,
            "last_error": state.last_write_error,
        },
    )


def package_version() -> str:
    try:
        return importlib.metadata.version("ngsi-assets")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def _version(request: web.Request) -> web.StreamResponse:
    loop = type(asyncio.get_running_loop())
    return _json(
        200,
        {
            "name": "ngsi-assets",
            "version": package_version(),
            "python": platform.python_version(),
            "aiohttp": importlib.metadata.version("aiohttp"),
            "event_loop": f"{loop.__module__}.{loop.__qualname__}",
        },
    )


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router and framework errors (404, 405, aiohttp's own 413) in the same JSON shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        state = request.app[STATE]
        if exc.status == 413:
            return _too_large(state, "streamed body")
        state.rejected[exc.status] += 1
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        field_name = {404: "path", 405: "method"}.get(exc.status)
        return _json(
            exc.status,
            _error_body(exc.reason.replace(" ", ""), field_name, f"{exc.reason}: {request.method} {request.path}"),
            headers=headers,
        )


def create_app(
    writer: LandingWriter,
    settings: IngestSettings,
    ids: MessageIdFactory,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The receiver application over an open writer (the caller owns and closes the writer)."""
    # aiohttp refuses larger bodies itself (its 413 is reshaped by the middleware).
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[_json_errors])
    app[STATE] = ReceiverState(writer=writer, settings=settings, ids=ids, clock=clock)
    app.router.add_post("/notify", _ingest_handler(Endpoint.NOTIFY), expect_handler=_expect_handler)
    app.router.add_post("/ngsi-ld/notify", _ingest_handler(Endpoint.NGSI_LD), expect_handler=_expect_handler)
    app.router.add_post("/messages", _ingest_handler(Endpoint.MESSAGES), expect_handler=_expect_handler)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    return app


# ---- running ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterOptions:
    """Group-commit tuning passed to each process's :class:`LandingWriter`."""

    max_segment_bytes: int | None = None
    max_batch: int | None = None
    max_delay_ms: float | None = None

    def open(self, root: Path) -> LandingWriter:
        kwargs: dict[str, Any] = {k: v for k, v in vars(self).items() if v is not None}
        return LandingWriter(root, **kwargs)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _serve_async(
    host: str,
    port: int,
    landing_root: Path,
    settings: IngestSettings,
    writer_options: WriterOptions,
    reuse_port: bool,
    on_ready: Callable[[int], None],
    parent_pid: int | None,
) -> None:
    writer = writer_options.open(landing_root)
    app = create_app(writer, settings, MessageIdFactory())
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=10.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
        await site.start()
        on_ready(runner.addresses[0][1])
        if parent_pid is None:
            await stop.wait()
        else:
            # A worker must not outlive its parent: it would keep the port and the landing root.
            while not stop.is_set() and os.getppid() == parent_pid:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        await runner.cleanup()  # stops accepting, lets in-flight requests finish their append
        await writer.aclose()


def _print_ready(host: str, port: int, landing_root: Path, workers: int) -> None:
    print(
        f"ngsi-assets receiver listening on http://{host}:{port} "
        f"(landing root {landing_root}, pid {os.getpid()}, workers {workers})",
        flush=True,
    )


def _worker_main(
    host: str,
    port: int,
    landing_root: Path,
    settings: IngestSettings,
    writer_options: WriterOptions,
    parent_pid: int,
    ready: Any,
) -> None:
    with asyncio.Runner(loop_factory=_new_event_loop) as runner:
        runner.run(
            _serve_async(
                host,
                port,
                landing_root,
                settings,
                writer_options,
                True,
                lambda _port: ready.put(os.getpid()),
                parent_pid,
            )
        )


def serve(
    host: str,
    port: int,
    landing_root: Path,
    settings: IngestSettings,
    *,
    workers: int = 1,
    writer_options: WriterOptions | None = None,
) -> None:
    """Run the receiver until SIGTERM or SIGINT; prints one "listening on" line when ready.

    ``workers > 1`` starts that many processes sharing the port through ``SO_REUSEPORT``, each with
    its own event loop and :class:`LandingWriter` (segment names are unique per writer). Port 0
    picks a free port.
    """
    landing_root = Path(landing_root)
    options = writer_options or WriterOptions()
    if workers <= 1:
        with asyncio.Runner(loop_factory=_new_event_loop) as runner:
            runner.run(
                _serve_async(
                    host,
                    port,
                    landing_root,
                    settings,
                    options,
                    False,
                    lambda bound: _print_ready(host, bound, landing_root, 1),
                    None,
                )
            )
        return
    _serve_workers(host, port, landing_root, settings, options, workers)


def _serve_workers(
    host: str, port: int, landing_root: Path, settings: IngestSettings, options: WriterOptions, workers: int
) -> None:
    if not hasattr(socket, "SO_REUSEPORT"):
        raise RuntimeError("several workers need SO_REUSEPORT, which this platform lacks")
    # Holding a bound (not listening) SO_REUSEPORT socket reserves the port for the workers.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reserve = socket.socket(family, socket.SOCK_STREAM)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserve.bind((host, port))
    port = reserve.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(host, port, landing_root, settings, options, os.getpid(), ready),
            name=f"ngsi-receiver-{i}",
        )
        for i in range(workers)
    ]
    try:
        for proc in procs:
            proc.start()
        started = 0
        while started < workers and not stop:
            with contextlib.suppress(Exception):
                ready.get(timeout=0.2)
                started += 1
            if any(p.exitcode is not None for p in procs):
                stop = True
        if started == workers:
            _print_ready(host, port, landing_root, workers)
        while not stop and all(p.exitcode is None for p in procs):
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.exitcode is None and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.join(30)
        reserve.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if any(p.exitcode not in (0, -signal.SIGTERM) for p in procs):
        print("ngsi-assets receiver: a worker exited abnormally", file=sys.stderr, flush=True)
        raise SystemExit(1)
