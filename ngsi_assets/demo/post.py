"""POST a request sample (see ``demo/city.py``) to a running receiver and report how it answered.

One aiohttp session with keep-alive connections and at most ``concurrency`` requests in flight.
Requests are taken in file order, so the receiver sees them in nearly that order (a request can
overtake at most ``concurrency - 1`` others)::

    python -m ngsi_assets.demo.post --url http://127.0.0.1:5050 --file sample.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import aiohttp
import orjson

from ngsi_assets.demo.city import Request, read_jsonl

DEFAULT_CONCURRENCY = 32
DEFAULT_TIMEOUT_S = 30.0
REJECTION_SAMPLES = 5
_REASON_FIELDS = ("error", "field", "description", "detail", "title", "message", "reason")


@dataclass(frozen=True)
class PostReport:
    """How the receiver answered one run of the poster.

    ``accepted`` counts 2xx answers, ``rejected`` the other answers by HTTP status, and ``failed``
    the requests that got no HTTP answer at all (connection refused or reset, timeout).
    """

    sent: int
    accepted: int
    rejected: dict[int, int]
    failed: int
    elapsed_s: float
    requests_per_s: float
    rejection_samples: tuple[str, ...]
    failure_samples: tuple[str, ...]

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["rejected"] = {str(status): n for status, n in sorted(self.rejected.items())}
        out["rejected_total"] = self.rejected_total
        return out


def rejection_reason(status: int, path: str, body: bytes) -> str:
    """A one-line reason from an error answer: its JSON error fields, else the start of its text."""
    detail = ""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        parts = [str(payload[k]) for k in _REASON_FIELDS if payload.get(k) not in (None, "")]
        detail = ": ".join(parts)
    if not detail:
        detail = body[:200].decode("utf-8", errors="replace").strip()
    return f"{status} {path}: {detail}" if detail else f"{status} {path}"


async def post_requests_async(
    base_url: str,
    requests: Iterable[Request],
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> PostReport:
    """POST every request to ``base_url`` + its endpoint path; see :class:`PostReport`."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    base = base_url.rstrip("/")
    pending = iter(requests)
    statuses: Counter[int] = Counter()
    rejections: list[str] = []
    failures: list[str] = []
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        # Workers share one iterator; taking the next item never awaits, so no item is taken twice.
        for request in pending:
            sent += 1
            try:
                async with session.post(base + request.path, data=request.data(), headers=request.headers) as response:
                    body = await response.read()
                    statuses[response.status] += 1
                    if not 200 <= response.status < 300 and len(rejections) < REJECTION_SAMPLES:
                        rejections.append(rejection_reason(response.status, request.path, body))
            except (aiohttp.ClientError, TimeoutError) as exc:
                statuses[0] += 1
                if len(failures) < REJECTION_SAMPLES:
                    failures.append(f"{request.path}: {type(exc).__name__}: {exc}")

    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    began = time.perf_counter()
    # skip_auto_headers: a request without Content-Type (a malformed sample line) must stay without.
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("Content-Type",)
    ) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    elapsed = time.perf_counter() - began

    failed = statuses.pop(0, 0)
    accepted = sum(n for status, n in statuses.items() if 200 <= status < 300)
    rejected = {status: n for status, n in sorted(statuses.items()) if not 200 <= status < 300}
    return PostReport(
        sent=sent,
        accepted=accepted,
        rejected=rejected,
        failed=failed,
        elapsed_s=round(elapsed, 3),
        requests_per_s=round(sent / elapsed, 1) if elapsed > 0 else 0.0,
        rejection_samples=tuple(rejections),
        failure_samples=tuple(failures),
    )


def post_requests(
    base_url: str,
    requests: Iterable[Request],
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> PostReport:
    """Blocking form of :func:`post_requests_async` (runs its own event loop)."""
    return asyncio.run(post_requests_async(base_url, requests, concurrency, timeout_s))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; exits 1 when some request got no HTTP answer (rejections are expected answers)."""
    parser = argparse.ArgumentParser(
        prog="python -m ngsi_assets.demo.post", description="POST a JSON-lines request sample to a receiver."
    )
    parser.add_argument("--url", required=True, help="receiver base URL, e.g. http://127.0.0.1:5050")
    parser.add_argument("--file", required=True, help="JSON-lines sample written by ngsi_assets.demo.city")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    args = parser.parse_args(argv)

    report = post_requests(args.url, read_jsonl(args.file), args.concurrency, args.timeout)
    print(json.dumps(report.to_dict(), indent=2))
    return 0 if report.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
