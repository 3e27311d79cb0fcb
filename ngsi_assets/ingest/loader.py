"""Load notifications from files through the receiver's own path: validate, stamp, land durably.

Two input shapes:

- **JSON lines** (``.jsonl`` / ``.ndjson``): one request per line::

      {"endpoint": "notify", "headers": {"Fiware-Service": "s"}, "body": {...}}
      {"endpoint": "messages", "headers": {...}, "body_text": "<raw body, possibly malformed>"}

  ``endpoint`` defaults to the loader's endpoint; line headers override the loader's default
  headers; a missing Content-Type is ``application/json``.
- **JSON files** (``.json``): each file is one body, posted to the loader's endpoint with its
  default headers.

A folder is searched recursively for both kinds, in path order; a path named explicitly is JSON
lines when it ends in ``.jsonl`` / ``.ndjson`` and a single body otherwise.

Every request is stamped and landed with origin ``file:<filename>``. A request the receiver would
refuse is a rejection with its place (``file:line``) and reason; loading goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ngsi_assets.ingest.landing import FIELD_SOURCES, LandingWriter, unwritable_field
from ngsi_assets.ngsi.envelope import Envelope, MessageIdFactory
from ngsi_assets.ngsi.payloads import Endpoint, IngestSettings, PayloadError, validate_request

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIX = ".json"
DEFAULT_CONTENT_TYPE = "application/json"
DEFAULT_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Rejection:
    """One refused request: where it came from and why."""

    source: str  # "file:line" for JSON lines, "file" for a JSON file
    status: int
    field: str | None
    problem: str

    def __str__(self) -> str:
        return f"{self.source}: {self.status} {self.field or '-'}: {self.problem}"


@dataclass
class LoadReport:
    """What a load did: requests landed, requests refused (with reasons), files read."""

    accepted: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    files: int = 0
    write_error: str | None = None

    @property
    def rejected(self) -> int:
        return len(self.rejections)

    @property
    def ok(self) -> bool:
        return not self.rejections and self.write_error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": self.rejected,
            "files": self.files,
            "write_error": self.write_error,
            "rejections": [asdict(r) for r in self.rejections],
        }


@dataclass(frozen=True, slots=True)
class _Request:
    source: str
    origin: str
    endpoint: Endpoint
    headers: dict[str, str]
    body: bytes


class _LineError(Exception):
    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field_name
        self.problem = problem


def default_headers(
    *,
    service: str | None = None,
    service_path: str | None = None,
    attrs_format: str | None = None,
    content_type: str = DEFAULT_CONTENT_TYPE,
) -> dict[str, str]:
    """The request headers the loader sends when a request does not set its own."""
    headers = {"Content-Type": content_type}
    if service is not None:
        headers["Fiware-Service"] = service
    if service_path is not None:
        headers["Fiware-ServicePath"] = service_path
    if attrs_format is not None:
        headers["Ngsiv2-AttrsFormat"] = attrs_format
    return headers


def load_paths(
    paths: Sequence[Path],
    writer: LandingWriter,
    settings: IngestSettings,
    ids: MessageIdFactory,
    *,
    endpoint: Endpoint = Endpoint.NOTIFY,
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    batch_size: int = DEFAULT_BATCH,
) -> LoadReport:
    """Validate and land every request found under ``paths``; see the module docstring."""
    report = LoadReport()
    base_headers = dict(headers) if headers is not None else default_headers()
    pending: list[Envelope] = []

    def flush() -> bool:
        if not pending:
            return True
        try:
            writer.append_many_blocking(pending)
        except Exception as exc:  # the landing zone failed: stop, report what is durable
            report.write_error = f"{type(exc).__name__}: {exc}"
            return False
        report.accepted += len(pending)
        pending.clear()
        return True

    for item in _requests(paths, endpoint, base_headers, report):
        if isinstance(item, Rejection):
            report.rejections.append(item)
            continue
        try:
            message = validate_request(item.endpoint, item.headers, item.body, settings)
        except PayloadError as exc:
            report.rejections.append(Rejection(item.source, exc.status, exc.field, exc.problem))
            continue
        except Exception as exc:  # same rule as the receiver: client data never crashes the load
            report.rejections.append(Rejection(item.source, 400, "body", f"{type(exc).__name__}: {exc}"))
            continue
        now_ms = int(clock() * 1000)
        envelope = message.stamp(ids.new(now_ms), now_ms, item.origin)
        if (name := unwritable_field(envelope)) is not None:
            where = FIELD_SOURCES.get(name, name)
            report.rejections.append(Rejection(item.source, 400, where, "not valid UTF-8 text"))
            continue
        pending.append(envelope)
        if len(pending) >= batch_size and not flush():
            return report
    flush()
    return report


def _requests(
    paths: Sequence[Path], endpoint: Endpoint, headers: Mapping[str, str], report: LoadReport
) -> Iterator[_Request | Rejection]:
    for path in _expand(paths, report):
        if isinstance(path, Rejection):
            yield path
            continue
        report.files += 1
        if path.name.endswith(JSON_LINES_SUFFIXES):
            yield from _json_lines(path, endpoint, headers)
        else:
            yield from _json_file(path, endpoint, headers)


def _expand(paths: Sequence[Path], report: LoadReport) -> Iterator[Path | Rejection]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.name.endswith((JSON_SUFFIX, *JSON_LINES_SUFFIXES))
            )
            yield from found
        elif path.is_file():
            yield path
        else:
            yield Rejection(_shown(path), 400, "path", "no such file or folder")


def _shown(path: Path | str) -> str:
    # File names that are not UTF-8 (surrogate-escaped by Python) must still print and land as text.
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _origin(path: Path) -> str:
    return "file:" + _shown(path.name)


def _json_file(path: Path, endpoint: Endpoint, headers: Mapping[str, str]) -> Iterator[_Request | Rejection]:
    try:
        body = path.read_bytes()
    except OSError as exc:
        yield Rejection(_shown(path), 400, "path", f"cannot read: {exc.strerror or exc}")
        return
    yield _Request(_shown(path), _origin(path), endpoint, dict(headers), body)


def _json_lines(path: Path, endpoint: Endpoint, headers: Mapping[str, str]) -> Iterator[_Request | Rejection]:
    origin, shown = _origin(path), _shown(path)
    try:
        f = path.open("rb")
    except OSError as exc:
        yield Rejection(_shown(path), 400, "path", f"cannot read: {exc.strerror or exc}")
        return
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            source = f"{shown}:{number}"
            try:
                line_endpoint, line_headers, body = _parse_line(raw, endpoint, headers)
            except _LineError as exc:
                yield Rejection(source, 400, exc.field, exc.problem)
                continue
            yield _Request(source, origin, line_endpoint, line_headers, body)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_line(
    raw: bytes, default_endpoint: Endpoint, base_headers: Mapping[str, str]
) -> tuple[Endpoint, dict[str, str], bytes]:
    # The standard parser, not orjson: orjson reads integers beyond 64 bits as floats, which would
    # change the body; json keeps them exact (and floats round-trip through their shortest repr).
    try:
        record = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _LineError("line", f"not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise _LineError("line", f"expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - {"endpoint", "headers", "body", "body_text"})
    if unknown:
        raise _LineError("line", f"unknown keys: {', '.join(unknown)}")

    endpoint_value = record.get("endpoint", str(default_endpoint))
    try:
        endpoint = Endpoint(endpoint_value)
    except ValueError:
        choices = ", ".join(e.value for e in Endpoint)
        raise _LineError("endpoint", f"unknown endpoint {endpoint_value!r} (one of {choices})") from None

    line_headers = record.get("headers", {})
    if not isinstance(line_headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in line_headers.items()
    ):
        raise _LineError("headers", "headers must be an object of string values")
    headers = _merge_headers(base_headers, line_headers)

    has_body, has_text = "body" in record, "body_text" in record
    if has_body == has_text:
        raise _LineError("body", "exactly one of body and body_text is required")
    if has_text:
        text = record["body_text"]
        if not isinstance(text, str):
            raise _LineError("body_text", "body_text must be a string")
        body = text.encode("utf-8", "surrogatepass")
    else:
        body = _dump(record["body"])
    return endpoint, headers, body


def _merge_headers(defaults: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    merged = {k.lower(): (k, v) for k, v in defaults.items()}
    merged.update({k.lower(): (k, v) for k, v in overrides.items()})
    headers = dict(merged.values())
    if "content-type" not in merged:
        headers["Content-Type"] = DEFAULT_CONTENT_TYPE
    return headers


def _dump(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits, lone surrogates: json writes them as valid JSON text
        return json.dumps(value, separators=(",", ":")).encode()


def format_report(report: LoadReport) -> Iterable[str]:
    """Human-readable lines: one per rejection, then a summary."""
    for rejection in report.rejections:
        yield str(rejection)
    if report.write_error:
        yield f"landing zone write failed, load stopped: {report.write_error}"
    yield f"files {report.files}, accepted {report.accepted}, rejected {report.rejected}"
