"""The landing envelope: how one acknowledged message is laid down in the landing zone.

The landing zone is a folder (``landing_root``) of append-only JSON-lines segment files::

    <landing_root>/dt=2026-11-22-14/<segment>.jsonl

``dt=`` is the UTC hour of the receive time, which is also the Dagster hourly partition the
message belongs to. Each line is one message, a JSON object ending with ``\\n``::

    {"message_id": "...", "recv_ms": 1429535602410, "kind": "ngsi-v2", "format": "normalized",
     "service": "vehicles", "service_path": "/4wheels", "correlator": "...", "cbnotif": 1,
     "guid": null, "origin": "http", "body": <the JSON body as received>}

``body`` is always the last key and holds the client's bytes verbatim except that raw CR and LF
characters are turned into spaces: inside valid JSON they can only be white space between tokens
(string contents must escape them), so no value changes. A line that does not end in ``\\n`` is a
torn write that was never acknowledged; readers ignore it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

LANDING_SUFFIX = ".jsonl"
HOUR_DIR_PREFIX = "dt="
_HOUR_DIR_RE = re.compile(r"^dt=(\d{4})-(\d{2})-(\d{2})-(\d{2})$")

# Field order of the envelope; ``body`` must stay last (see module docstring).
ENVELOPE_FIELDS = (
    "message_id",
    "recv_ms",
    "kind",
    "format",
    "service",
    "service_path",
    "correlator",
    "cbnotif",
    "guid",
    "origin",
    "body",
)


@dataclass(frozen=True, slots=True)
class Envelope:
    """One validated message, ready to land. ``body`` is the raw JSON body."""

    message_id: str
    recv_ms: int
    kind: str
    format: str
    service: str
    service_path: str
    correlator: str | None
    cbnotif: int | None
    guid: str | None
    origin: str
    body: bytes

    def to_line(self) -> bytes:
        """Serialise as one landing line (ends with a newline)."""
        head = orjson.dumps(
            {
                "message_id": self.message_id,
                "recv_ms": self.recv_ms,
                "kind": self.kind,
                "format": self.format,
                "service": self.service,
                "service_path": self.service_path,
                "correlator": self.correlator,
                "cbnotif": self.cbnotif,
                "guid": self.guid,
                "origin": self.origin,
            }
        )
        body = self.body.replace(b"\r", b" ").replace(b"\n", b" ")
        return head[:-1] + b',"body":' + body + b"}\n"


def hour_dir(recv_ms: int) -> str:
    """The landing folder name of a receive time: ``dt=YYYY-MM-DD-HH`` (UTC)."""
    return HOUR_DIR_PREFIX + datetime.fromtimestamp(recv_ms / 1000, UTC).strftime("%Y-%m-%d-%H")


def partition_key(recv_ms: int) -> str:
    """The Dagster hourly partition key of a receive time: ``YYYY-MM-DD-HH:00`` (UTC)."""
    return datetime.fromtimestamp(recv_ms / 1000, UTC).strftime("%Y-%m-%d-%H:00")


def hour_dir_to_partition_key(name: str) -> str | None:
    """``dt=2026-11-22-14`` -> ``2026-11-22-14:00``; None for anything else."""
    m = _HOUR_DIR_RE.match(name)
    if not m:
        return None
    return f"{m[1]}-{m[2]}-{m[3]}-{m[4]}:00"


def partition_key_to_hour_dir(key: str) -> str:
    """``2026-11-22-14:00`` -> ``dt=2026-11-22-14``."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-\d{2}:00", key):
        raise ValueError(f"not an hourly partition key: {key!r}")
    return HOUR_DIR_PREFIX + key[:-3]


class MessageIdFactory:
    """Makes message identifiers: RFC 9562 UUID version 7 strings, time-ordered and unique.

    48 bits of Unix milliseconds, then a 74-bit monotonic counter seeded at random per process, so
    identifiers from one process sort in stamping order and never collide across processes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = int.from_bytes(os.urandom(10), "big") >> 7  # 73 random bits, room to grow
        self._last_ms = 0

    def new(self, now_ms: int | None = None) -> str:
        with self._lock:
            ms = int(time.time() * 1000) if now_ms is None else now_ms
            if ms <= self._last_ms:
                ms = self._last_ms
            self._last_ms = ms
            self._counter = (self._counter + 1) & ((1 << 74) - 1)
            c = self._counter
        value = (ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76  # version 7
        value |= (c >> 62) << 64  # 12 bits
        value |= 0b10 << 62  # variant 1
        value |= c & ((1 << 62) - 1)
        h = f"{value:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
