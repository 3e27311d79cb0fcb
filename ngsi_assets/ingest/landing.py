"""Durable, group-committed appends to the landing zone, and the readers that list and scan it.

Layout (see :mod:`ngsi_assets.ngsi.envelope` for the line format)::

    <root>/dt=YYYY-MM-DD-HH/<created_ms:013d>-<pid>-<writer hex>-<seq:05d>.jsonl

Guarantees of :class:`LandingWriter`:

- A line is acknowledged (its ``append`` returns) only after its bytes and the directory entries
  that make them reachable have been synced to disk.
- Every writer starts fresh segments and never opens an existing file, so it never appends after a
  torn tail left by a crashed writer. Segment names are unique across processes and restarts
  (milliseconds, pid, 32 random bits, sequence) and sort in creation order within a writer.
- After a failed write or sync, the segment is abandoned: the next batch goes to a new segment, so a
  torn line can only ever be the last bytes of a file, which readers ignore.

Group commit: callers enqueue lines; one writer thread takes everything queued, issues one
``write`` per segment file and one ``fdatasync`` per file per batch, then resolves every waiter of
the batch. Under load the batch grows by itself while the previous sync runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ngsi_assets.ngsi.envelope import (
    HOUR_DIR_PREFIX,
    LANDING_SUFFIX,
    Envelope,
    hour_dir,
    hour_dir_to_partition_key,
)

DEFAULT_MAX_SEGMENT_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_DELAY_MS = 0.0

# fdatasync flushes the data and the metadata needed to read it back (the file size), which is all an
# append needs; it skips the mtime update that makes fsync several times slower on ext4.
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class LandingWriteError(OSError):
    """The landing zone could not be written or synced; nothing in the failed batch is durable."""


class WriterClosedError(RuntimeError):
    """An append reached a writer that is closing or closed."""


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters of one writer since it opened."""

    lines: int
    bytes: int
    batches: int
    failed_batches: int
    segments: int
    last_sync_ms: float | None
    last_batch_lines: int
    last_error: str | None


class _BlockingWaiter:
    __slots__ = ("_event", "error")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.error: BaseException | None = None

    def resolve(self, error: BaseException | None) -> None:
        self.error = error
        self._event.set()

    def wait(self) -> None:
        self._event.wait()
        if self.error is not None:
            raise self.error


@dataclass(slots=True)
class _Request:
    lines: list[tuple[str, bytes]]  # (hour folder, line)
    waiter: asyncio.Future[None] | _BlockingWaiter


@dataclass(slots=True)
class _Segment:
    hour: str
    path: Path
    fd: int
    size: int


class LandingWriter:
    """Appends envelopes durably to ``root``; see the module docstring for the guarantees.

    ``max_batch`` caps the lines written per group commit; ``max_delay_ms`` lets the writer thread
    wait that long after the first queued line for more to arrive (0: take what is queued; under
    load batches form by themselves while the previous sync runs).
    """

    def __init__(
        self,
        root: Path,
        *,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_delay_ms: float = DEFAULT_MAX_DELAY_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_segment_bytes <= 0:
            raise ValueError("max_segment_bytes must be positive")
        if max_batch <= 0:
            raise ValueError("max_batch must be positive")
        self.root = Path(root)
        self.max_segment_bytes = max_segment_bytes
        self.max_batch = max_batch
        self.max_delay_s = max(0.0, max_delay_ms) / 1000.0
        self._clock = clock
        self._writer_tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._seq = 0
        self._last_created_ms = 0
        self._segments: dict[str, _Segment] = {}
        self._known_dirs: set[str] = set()

        # Hand-off without locks on the hot path: deque append/popleft are atomic, and producers only
        # touch the event when the writer thread has announced it is about to sleep.
        self._queue: deque[_Request] = deque()
        self._wakeup = threading.Event()
        self._idle = False
        self._closing = False  # no new appends; the writer drains the queue and stops
        self._stopped = False  # the writer thread has done its last drain
        self._closed = False

        self._lines = 0
        self._bytes = 0
        self._batches = 0
        self._failed_batches = 0
        self._segments_created = 0
        self._last_sync_ms: float | None = None
        self._last_batch_lines = 0
        self._last_error: str | None = None

        self._ensure_root()
        self._thread = threading.Thread(target=self._run, name="landing-writer", daemon=True)
        self._thread.start()

    # ---- public API -------------------------------------------------------------------------

    async def append(self, envelope: Envelope) -> None:
        """Land one envelope; returns once it is on disk, raises :class:`LandingWriteError` if not."""
        await self.append_many([envelope])

    async def append_many(self, envelopes: Iterable[Envelope]) -> None:
        """Land several envelopes in one request; returns once all are on disk."""
        lines = [(_hour_dir(e.recv_ms), e.to_line()) for e in envelopes]
        if not lines:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._submit(_Request(lines, future))
        await future

    def append_many_blocking(self, envelopes: Iterable[Envelope]) -> None:
        """Blocking form of :meth:`append_many`, for threads without an event loop (the loader)."""
        lines = [(_hour_dir(e.recv_ms), e.to_line()) for e in envelopes]
        if not lines:
            return
        waiter = _BlockingWaiter()
        self._submit(_Request(lines, waiter))
        waiter.wait()

    def close(self) -> None:
        """Write and sync everything queued, close the open segments and stop the writer thread."""
        self._closing = True
        self._wakeup.set()
        self._thread.join()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def stats(self) -> WriterStats:
        return WriterStats(
            lines=self._lines,
            bytes=self._bytes,
            batches=self._batches,
            failed_batches=self._failed_batches,
            segments=self._segments_created,
            last_sync_ms=self._last_sync_ms,
            last_batch_lines=self._last_batch_lines,
            last_error=self._last_error,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> LandingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- queue -------------------------------------------------------------------------------

    def _submit(self, request: _Request) -> None:
        if self._closing:
            raise WriterClosedError("landing writer is closed")
        self._queue.append(request)
        if self._idle:
            self._wakeup.set()
        if self._stopped:  # appended after the writer's last drain: nobody else will answer it
            self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        leftovers: list[_Request] = []
        with contextlib.suppress(IndexError):
            while True:
                leftovers.append(self._queue.popleft())
        _resolve(leftovers, WriterClosedError("landing writer is closed"))

    def _sleep(self, timeout: float | None = None) -> None:
        self._idle = True
        # Re-check after announcing: a producer that appended before seeing _idle did not wake us.
        if not self._queue and not self._closing:
            self._wakeup.wait(timeout)
        self._wakeup.clear()
        self._idle = False

    def _take_batch(self) -> list[_Request] | None:
        """Wait for work; return the next batch, or None when closing with nothing left."""
        while not self._queue:
            if self._closing:
                return None
            self._sleep()
        if self.max_delay_s and len(self._queue) < self.max_batch and not self._closing:
            # Not announced as idle, so producers do not wake us per append; only close() does.
            self._wakeup.wait(self.max_delay_s)
            self._wakeup.clear()
        batch: list[_Request] = []
        taken = 0
        queue = self._queue
        while queue and (not batch or taken + len(queue[0].lines) <= self.max_batch):
            request = queue.popleft()
            batch.append(request)
            taken += len(request.lines)
        return batch

    def _run(self) -> None:
        try:
            while (batch := self._take_batch()) is not None:
                error: BaseException | None = None
                try:
                    self._commit(batch)
                except Exception as exc:  # every waiter must hear of any failure
                    error = _as_write_error(exc)
                    self._failed_batches += 1
                    self._last_error = str(exc)
                    self._abandon_segments()
                _resolve(batch, error)
        finally:
            self._close_segments()
            self._closing = True
            self._stopped = True
            self._fail_leftovers()
            self._closed = True

    # ---- writing -----------------------------------------------------------------------------

    def _commit(self, batch: list[_Request]) -> None:
        # Keep arrival order within each hour; most batches have a single hour.
        by_hour: dict[str, list[bytes]] = {}
        count = 0
        for request in batch:
            for hour, line in request.lines:
                by_hour.setdefault(hour, []).append(line)
                count += 1
        dirty: dict[int, _Segment] = {}  # by id(): file descriptors are reused after close
        total = 0
        for hour, lines in by_hour.items():
            total += self._write_hour(hour, lines, dirty)
        started = time.perf_counter()
        for segment in dirty.values():
            _datasync(segment.fd)
        self._last_sync_ms = (time.perf_counter() - started) * 1000.0
        # Stragglers from an earlier hour get a fresh segment; keep only the newest hours open.
        newest = max(by_hour)
        for hour in [h for h in self._segments if h < newest and h not in by_hour]:
            self._close_segment(self._segments.pop(hour))
        self._lines += count
        self._bytes += total
        self._batches += 1
        self._last_batch_lines = count

    def _write_hour(self, hour: str, lines: list[bytes], dirty: dict[int, _Segment]) -> int:
        written = 0
        segment = self._segments.get(hour)
        chunk: list[bytes] = []
        chunk_size = 0
        for line in lines:
            if segment is None:
                segment = self._open_segment(hour)
            elif segment.size + chunk_size + len(line) > self.max_segment_bytes and (segment.size or chunk):
                if chunk:
                    self._write_all(segment, chunk, chunk_size)
                    dirty[id(segment)] = segment
                    written += chunk_size
                    chunk, chunk_size = [], 0
                # The full segment is synced before it is closed: the batch's waiters depend on it.
                if dirty.pop(id(segment), None) is not None:
                    _datasync(segment.fd)
                self._close_segment(self._segments.pop(hour))
                segment = self._open_segment(hour)
            chunk.append(line)
            chunk_size += len(line)
        if chunk and segment is not None:
            self._write_all(segment, chunk, chunk_size)
            dirty[id(segment)] = segment
            written += chunk_size
        return written

    @staticmethod
    def _write_all(segment: _Segment, chunk: list[bytes], size: int) -> None:
        data = memoryview(b"".join(chunk))
        offset = 0
        while offset < size:
            offset += os.write(segment.fd, data[offset:])
        segment.size += size

    def _open_segment(self, hour: str) -> _Segment:
        folder = self.root / hour
        if hour not in self._known_dirs:
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
            # Synced even when another writer made the folder: its own sync may not have happened yet.
            _fsync_dir(self.root)
            self._known_dirs.add(hour)
        now_ms = max(int(self._clock() * 1000), self._last_created_ms)
        self._last_created_ms = now_ms
        self._seq += 1
        path = folder / f"{now_ms:013d}-{self._writer_tag}-{self._seq:05d}{LANDING_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _O_CLOEXEC, 0o644)
        try:
            _fsync_dir(folder)
        except BaseException:
            os.close(fd)
            raise
        segment = _Segment(hour=hour, path=path, fd=fd, size=0)
        self._segments[hour] = segment
        self._segments_created += 1
        return segment

    def _ensure_root(self) -> None:
        missing: list[Path] = []
        p = self.root.absolute()
        while not p.exists():
            missing.append(p)
            p = p.parent
        self.root.mkdir(parents=True, exist_ok=True)
        for created in reversed(missing):
            _fsync_dir(created.parent)

    @staticmethod
    def _close_segment(segment: _Segment) -> None:
        with contextlib.suppress(OSError):
            os.close(segment.fd)

    def _close_segments(self) -> None:
        for segment in self._segments.values():
            self._close_segment(segment)
        self._segments.clear()

    def _abandon_segments(self) -> None:
        # After a failed write or sync a segment's tail is unknown; never write after it again.
        self._close_segments()
        self._known_dirs.clear()


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HOUR_MS = 3_600_000


def _hour_dir(recv_ms: int) -> str:
    return _hour_dir_of_hour(recv_ms // _HOUR_MS)


@functools.lru_cache(maxsize=256)
def _hour_dir_of_hour(hour: int) -> str:
    # Formatting a datetime per message costs more than the rest of the envelope; hours repeat.
    return hour_dir(hour * _HOUR_MS)


def _as_write_error(exc: Exception) -> LandingWriteError:
    if isinstance(exc, LandingWriteError):
        return exc
    if isinstance(exc, OSError):
        error = LandingWriteError(exc.errno, exc.strerror or str(exc), exc.filename)
    else:
        error = LandingWriteError(f"landing write failed: {exc!r}")
    error.__cause__ = exc
    return error


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _resolve(batch: list[_Request], error: BaseException | None) -> None:
    """Wake every waiter of a batch: one thread-safe callback per event loop."""
    per_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for request in batch:
        waiter = request.waiter
        if isinstance(waiter, _BlockingWaiter):
            waiter.resolve(error)
        else:
            per_loop.setdefault(waiter.get_loop(), []).append(waiter)
    for loop, futures in per_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting any more
            loop.call_soon_threadsafe(_settle, futures, error)


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


# Where the text fields of an envelope come from, for error messages about them.
FIELD_SOURCES = {
    "service": "header Fiware-Service",
    "service_path": "header Fiware-ServicePath",
    "correlator": "header Fiware-Correlator",
    "guid": "header X-Message-Guid",
}


def unwritable_field(envelope: Envelope) -> str | None:
    """The first text field of ``envelope`` that is not valid Unicode, so no JSON line can hold it.

    Header bytes that are not UTF-8 reach Python as lone surrogates (aiohttp decodes headers with
    ``surrogateescape``); such an envelope is the client's fault and must be refused, not written.
    """
    for name in ("message_id", "kind", "format", "service", "service_path", "correlator", "guid", "origin"):
        value = getattr(envelope, name)
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name
    return None


# ---- readers ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One landing segment file: its path, hour folder, Dagster partition key and size in bytes."""

    path: Path
    hour_dir: str
    partition_key: str
    size: int


def list_segments(root: Path) -> list[SegmentInfo]:
    """Every segment under ``root``, by hour then creation order; foreign files are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[SegmentInfo] = []
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        if not folder.name.startswith(HOUR_DIR_PREFIX):
            continue
        key = hour_dir_to_partition_key(folder.name)
        if key is None or not folder.is_dir():
            continue
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if not entry.name.endswith(LANDING_SUFFIX) or entry.name.startswith("."):
                continue
            try:
                if not entry.is_file():
                    continue
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            found.append(SegmentInfo(Path(entry.path), folder.name, key, size))
    return found


def iter_complete_lines(path: Path) -> Iterator[bytes]:
    """The complete lines of a segment, without their ``\\n``; a torn last line is skipped."""
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n"):
                yield line[:-1]


# ---- byte ranges: what continuous runs read ------------------------------------------------

_TAIL_CHUNK = 64 * 1024


def complete_prefix(path: Path, start: int, size: int) -> int:
    """The offset just past the last ``\\n`` in bytes [start, size) of a segment; ``start`` if none.

    A segment being appended to may end in part of a line (a batch's write in progress, or a torn
    tail a crash left): a range read up to this offset holds complete lines only, and the partial
    line is read by a later range once it is complete. Reads backwards from ``size`` in small
    chunks, so it costs about one line, not the segment.
    """
    end = size
    with open(path, "rb") as f:
        while end > start:
            begin = max(start, end - _TAIL_CHUNK)
            f.seek(begin)
            chunk = f.read(end - begin)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return begin + cut + 1
            end = begin
    return start


def iter_range_lines(
    path: str, start: int, end: int, first: int | None = None, last: int | None = None
) -> Iterator[bytes]:
    """The lines of bytes [start, end) of a segment that begin in [first, last), without ``\\n``.

    ``[first, last)`` (default: the whole range) lets a large range be read in pieces: each line
    belongs to the piece it starts in, as with Hadoop's line reader, and no line is read twice or
    missed. A line that does not end by ``end`` (a partial tail) is not returned.
    """
    first = start if first is None else first
    last = end if last is None else last
    with open(path, "rb") as f:
        pos = first
        if first > start:
            # Skip the line in progress at ``first``: it belongs to the piece before (the byte before
            # ``first`` tells whether ``first`` itself starts a line).
            f.seek(first - 1)
            skipped = f.readline(max(0, end - first + 1))
            pos = first - 1 + len(skipped)
        else:
            f.seek(first)
        while pos < last and pos < end:
            line = f.readline(end - pos)
            if not line.endswith(b"\n"):
                return
            pos += len(line)
            yield line[:-1]
