"""Crash test: SIGKILL the receiver process under load; every acknowledged message survives once.

SIGKILL ends the process between any two instructions, with requests in flight and a group commit
possibly half written. The operating system keeps running, so this proves the process-crash half
of "nothing acknowledged is lost" (acks only after the write and sync returned, no appends after a
torn tail, no duplicates on restart); the power-loss half rests on the fsync/fdatasync ordering.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson
import pytest

from ngsi_assets.ingest.landing import list_segments
from tests.ingest import samples
from tests.ingest.harness import ProcessReceiver, landed_lines, start_receiver_process
from tests.support.processes import alive

pytestmark = pytest.mark.integration


async def _post_many(url: str, names: list[str], concurrency: int, refusals: list[str] | None = None) -> dict[str, str]:
    """POST one notification per entity name; return entity name -> acknowledged message_id."""
    acked: dict[str, str] = {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for name in names:
        queue.put_nowait(name)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            name = queue.get_nowait()
            body = samples.dumps(samples.v2_normalized(name))
            try:
                async with session.post(url + "/notify", data=body, headers=samples.JSON) as resp:
                    if resp.status == 201:
                        acked[name] = (await resp.json())["message_id"]
                    elif refusals is not None:
                        refusals.append(f"{resp.status} {await resp.text()}")
            except (TimeoutError, aiohttp.ClientError, ConnectionError):
                return  # the server died mid-request: not acknowledged, and no use going on

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return acked


async def _post_until_killed(receiver: ProcessReceiver, names: list[str], kill_after: float) -> dict[str, str]:
    async def killer() -> None:
        await asyncio.sleep(kill_after)
        receiver.kill()

    acked, _ = await asyncio.gather(_post_many(receiver.url, names, 64), killer())
    return acked


def test_acknowledged_messages_survive_sigkill_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "landing"
    acked: dict[str, str] = {}

    first = start_receiver_process(root)
    refusals: list[str] = []
    try:
        acked |= asyncio.run(_post_many(first.url, [f"A{i}" for i in range(300)], 50, refusals))
        assert len(acked) == 300, refusals[:3]
        in_flight = asyncio.run(_post_until_killed(first, [f"B{i}" for i in range(20_000)], kill_after=0.5))
    finally:
        if first.process.poll() is None:
            first.kill()
    assert first.process.returncode == -9
    assert 0 < len(in_flight) < 20_000, "the kill must land while requests are in flight"
    acked |= in_flight
    segments_before_restart = {s.path: s.size for s in list_segments(root)}

    second = start_receiver_process(root)
    try:
        after = asyncio.run(_post_many(second.url, [f"C{i}" for i in range(200)], 50, refusals))
        assert len(after) == 200, refusals[:3]
        acked |= after
    finally:
        assert second.stop() == 0

    # The restarted receiver wrote only to new segments.
    for path, size in segments_before_restart.items():
        assert path.stat().st_size == size

    lines = [line for seg in list_segments(root) for line in iter_all(seg.path)]
    complete = [line for line in lines if line.endswith(b"\n")]
    torn = [line for line in lines if not line.endswith(b"\n")]
    assert len(torn) <= 1  # at most the tail of the segment that was being written at the kill
    records = [orjson.loads(line) for line in complete]  # every complete line is whole JSON
    ids = Counter(r["message_id"] for r in records)
    names = Counter(r["body"]["data"][0]["id"] for r in records)
    assert max(ids.values()) == 1, "a message landed twice"
    assert max(names.values()) == 1, "a notification landed twice"
    missing = [name for name, message_id in acked.items() if ids[message_id] != 1]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    by_id = {r["message_id"]: r for r in records}
    assert all(by_id[mid]["body"]["data"][0]["id"] == name for name, mid in acked.items())
    assert len(landed_lines(root)) == len(records)


def iter_all(path: Path) -> list[bytes]:
    """Every line of a file, a torn last one included (to check the readers' premise)."""
    data = path.read_bytes()
    return data.splitlines(keepends=True)


def test_graceful_stop_flushes_and_exits_cleanly(tmp_path: Path) -> None:
    receiver = start_receiver_process(tmp_path)
    try:
        acked = asyncio.run(_post_many(receiver.url, [f"G{i}" for i in range(50)], 10))
    finally:
        started = time.monotonic()
        assert receiver.stop() == 0
    assert time.monotonic() - started < 15
    assert len(landed_lines(tmp_path)) == len(acked) == 50


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def test_workers_share_the_port_each_with_its_own_segments(tmp_path: Path) -> None:
    receiver = start_receiver_process(tmp_path, "--workers", "2")
    try:
        acked = asyncio.run(_post_many(receiver.url, [f"W{i}" for i in range(400)], 32))
    finally:
        assert receiver.stop() == 0
    assert len(acked) == 400
    records = [orjson.loads(line) for line in landed_lines(tmp_path)]
    assert sorted(r["message_id"] for r in records) == sorted(acked.values())
    writers = {tuple(seg.path.name.split("-")[1:3]) for seg in list_segments(tmp_path)}
    assert 1 <= len(writers) <= 2  # one writer (pid, tag) per worker; never shared


def test_workers_do_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    receiver = start_receiver_process(tmp_path, "--workers", "2")
    workers = [pid for pid in _children(receiver.process.pid) if alive(pid)]
    assert len(workers) >= 2  # the two workers (and multiprocessing's resource tracker)
    receiver.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)
