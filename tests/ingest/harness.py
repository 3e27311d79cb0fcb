"""Running receivers for the tests (in a thread, or as a real subprocess) and reading what they landed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from ngsi_assets.ingest.landing import LandingWriter, iter_complete_lines, list_segments
from ngsi_assets.ingest.receiver import create_app
from ngsi_assets.ngsi.envelope import MessageIdFactory
from ngsi_assets.ngsi.payloads import IngestSettings

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(rb"listening on http://([^:]+):(\d+)")


@dataclass
class ThreadReceiver:
    """A receiver app served by aiohttp on 127.0.0.1 from its own event-loop thread."""

    url: str
    root: Path
    writer: LandingWriter


@contextmanager
def run_receiver(
    root: Path,
    settings: IngestSettings | None = None,
    clock: Callable[[], float] = time.time,
    **writer_options: Any,
) -> Iterator[ThreadReceiver]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-receiver", daemon=True)
    thread.start()
    writer = LandingWriter(root, **writer_options)
    app = create_app(writer, settings or IngestSettings(), MessageIdFactory(), clock)
    runner = web.AppRunner(app, access_log=None)

    async def start() -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return int(runner.addresses[0][1])

    port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield ThreadReceiver(f"http://127.0.0.1:{port}", root, writer)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        writer.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclass
class ProcessReceiver:
    """``python -m ngsi_assets.cli serve`` as a child process."""

    process: subprocess.Popen[bytes]
    url: str

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def start_receiver_process(root: Path, *extra_args: str, timeout: float = 30.0) -> ProcessReceiver:
    command = [
        sys.executable,
        "-m",
        "ngsi_assets.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--landing-root",
        str(root),
        *extra_args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, env=env)
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if match := _READY.search(line):
            return ProcessReceiver(process, f"http://{match[1].decode()}:{match[2].decode()}")
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError(f"receiver did not start: {line!r}")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, and every folder (as ``b"<dir>"``)."""
    tree: dict[str, bytes] = {}
    if not root.exists():
        return tree
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        tree[key] = b"<dir>" if path.is_dir() else path.read_bytes()
    return tree


def landed_lines(root: Path) -> list[bytes]:
    return [line for seg in list_segments(root) for line in iter_complete_lines(seg.path)]


def landed(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in landed_lines(root)]


def raw_body(line: bytes) -> bytes:
    """The body bytes of a landing line, exactly as written (``body`` is always the last key)."""
    start = line.index(b',"body":') + len(b',"body":')
    assert line.endswith(b"}")
    return line[start:-1]
