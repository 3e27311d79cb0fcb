"""LandingWriter: durable group commit, segment naming and rolling, failures, and the readers."""

from __future__ import annotations

import asyncio
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from ngsi_assets.ingest.landing import (
    LandingWriteError,
    LandingWriter,
    SegmentInfo,
    WriterClosedError,
    iter_complete_lines,
    list_segments,
)
from ngsi_assets.ngsi.envelope import Envelope, MessageIdFactory, hour_dir
from resources.landing_source import MIN_PIECE_BYTES, RANGE_PIECE_BYTES, _LandingRangeReader, piece_bytes
from tests.ingest.harness import landed, snapshot

SEGMENT_NAME = re.compile(r"^\d{13}-\d+-[0-9a-f]{8}-\d{5}\.jsonl$")
IDS = MessageIdFactory()


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


H13 = ms("2026-11-22T13:59:59.500")
H14 = ms("2026-11-22T14:00:00.250")


def envelope(recv_ms: int = H14, n: int = 0, body: bytes | None = None) -> Envelope:
    return Envelope(
        message_id=IDS.new(recv_ms),
        recv_ms=recv_ms,
        kind="ngsi-v2",
        format="normalized",
        service="svc",
        service_path="/p",
        correlator=f"corr-{n}",
        cbnotif=n,
        guid=None,
        origin="test",
        body=body if body is not None else orjson.dumps({"subscriptionId": "s", "data": [{"id": f"E{n}"}]}),
    )


def test_blocking_append_lands_lines_in_order(tmp_path: Path) -> None:
    envs = [envelope(n=i) for i in range(50)]
    with LandingWriter(tmp_path) as writer:
        writer.append_many_blocking(envs[:20])
        writer.append_many_blocking(envs[20:])
    segments = list_segments(tmp_path)
    assert len(segments) == 1
    seg = segments[0]
    assert seg == SegmentInfo(seg.path, "dt=2026-11-22-14", "2026-11-22-14:00", seg.path.stat().st_size)
    assert SEGMENT_NAME.match(seg.path.name)
    assert seg.path.read_bytes() == b"".join(e.to_line() for e in envs)
    assert [r["message_id"] for r in landed(tmp_path)] == [e.message_id for e in envs]


def test_async_append_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    async def scenario(writer: LandingWriter) -> None:
        for i in range(5):
            env = envelope(n=i)
            await writer.append(env)
            # Visible before close: the line was written (and synced) before the await returned.
            assert landed(tmp_path)[-1]["message_id"] == env.message_id

    with LandingWriter(tmp_path) as writer:
        asyncio.run(scenario(writer))


def test_group_commit_batches_concurrent_appends(tmp_path: Path) -> None:
    count = 400
    envs = [envelope(n=i) for i in range(count)]

    async def scenario(writer: LandingWriter) -> None:
        await asyncio.gather(*(writer.append(e) for e in envs))

    with LandingWriter(tmp_path, max_delay_ms=20) as writer:
        asyncio.run(scenario(writer))
        stats = writer.stats()
    assert stats.lines == count
    assert stats.batches <= count // 10, stats  # one sync served many waiters
    assert stats.last_sync_ms is not None
    assert sorted(r["message_id"] for r in landed(tmp_path)) == sorted(e.message_id for e in envs)


def test_max_batch_caps_a_group_commit(tmp_path: Path) -> None:
    async def scenario(writer: LandingWriter) -> None:
        await asyncio.gather(*(writer.append(envelope(n=i)) for i in range(100)))

    with LandingWriter(tmp_path, max_batch=7, max_delay_ms=5) as writer:
        asyncio.run(scenario(writer))
        stats = writer.stats()
    assert stats.lines == 100
    assert stats.batches >= 100 // 7 + 1
    assert stats.last_batch_lines <= 7


def test_hour_change_rolls_to_a_new_folder_and_segment(tmp_path: Path) -> None:
    with LandingWriter(tmp_path) as writer:
        writer.append_many_blocking([envelope(H13, 1), envelope(H13, 2)])
        writer.append_many_blocking([envelope(H14, 3)])
        # A straggler of the previous hour gets a fresh segment there, never the closed one.
        writer.append_many_blocking([envelope(H13, 4), envelope(H14, 5)])
    segments = list_segments(tmp_path)
    assert [(s.hour_dir, s.partition_key) for s in segments] == [
        ("dt=2026-11-22-13", "2026-11-22-13:00"),
        ("dt=2026-11-22-13", "2026-11-22-13:00"),
        ("dt=2026-11-22-14", "2026-11-22-14:00"),
    ]
    per_segment = [[orjson.loads(x)["cbnotif"] for x in iter_complete_lines(s.path)] for s in segments]
    assert per_segment == [[1, 2], [4], [3, 5]]
    for seg in segments:
        assert {hour_dir(orjson.loads(x)["recv_ms"]) for x in iter_complete_lines(seg.path)} == {seg.hour_dir}


def test_size_limit_rolls_segments(tmp_path: Path) -> None:
    envs = [envelope(n=i) for i in range(40)]
    line_size = max(len(e.to_line()) for e in envs)
    limit = line_size * 5
    with LandingWriter(tmp_path, max_segment_bytes=limit) as writer:
        writer.append_many_blocking(envs[:13])
        writer.append_many_blocking(envs[13:])
    segments = list_segments(tmp_path)
    assert len(segments) >= 8
    assert all(s.size <= limit for s in segments)
    assert [r["message_id"] for r in landed(tmp_path)] == [e.message_id for e in envs]
    names = [s.path.name for s in segments]
    assert names == sorted(names)  # creation order
    assert len({tuple(n.split("-")[1:3]) for n in names}) == 1  # one writer
    assert [int(n.rsplit("-", 1)[1].split(".")[0]) for n in names] == list(range(1, len(names) + 1))


def test_oversized_line_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    big = envelope(n=1, body=orjson.dumps({"blob": "x" * 5000}))
    with LandingWriter(tmp_path, max_segment_bytes=1000) as writer:
        writer.append_many_blocking([envelope(n=0), big, envelope(n=2)])
    sizes = [s.size for s in list_segments(tmp_path)]
    assert len(sizes) == 3 and sizes[1] == len(big.to_line())


def test_new_writer_never_appends_to_an_old_segment(tmp_path: Path) -> None:
    with LandingWriter(tmp_path) as first:
        first.append_many_blocking([envelope(n=1)])
    (old,) = list_segments(tmp_path)
    # A crash mid-write leaves a torn tail; nothing may ever be appended after it.
    with old.path.open("ab") as f:
        f.write(b'{"message_id": "torn", "recv_')
    before = old.path.read_bytes()
    with LandingWriter(tmp_path) as second:
        second.append_many_blocking([envelope(n=2)])
    with LandingWriter(tmp_path) as third:
        third.append_many_blocking([envelope(n=3)])
    segments = list_segments(tmp_path)
    assert len(segments) == 3
    assert segments[0].path == old.path and old.path.read_bytes() == before
    assert len({s.path.name.split("-")[2] for s in segments}) == 3  # distinct writer tags
    assert [r["cbnotif"] for r in landed(tmp_path)] == [1, 2, 3]


def test_torn_tail_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "seg.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')
    assert list(iter_complete_lines(path)) == [b'{"a":1}', b'{"b":2}']
    path.write_bytes(b"")
    assert list(iter_complete_lines(path)) == []
    path.write_bytes(b"no newline at all")
    assert list(iter_complete_lines(path)) == []


def test_list_segments_skips_foreign_entries(tmp_path: Path) -> None:
    assert list_segments(tmp_path / "missing") == []
    (tmp_path / "dt=2026-11-22-14").mkdir()
    (tmp_path / "dt=2026-11-22-14" / "b.jsonl").write_bytes(b"x\n")
    (tmp_path / "dt=2026-11-22-14" / "a.jsonl").write_bytes(b"")
    (tmp_path / "dt=2026-11-22-14" / "notes.txt").write_bytes(b"")
    (tmp_path / "dt=2026-11-22-14" / ".hidden.jsonl").write_bytes(b"")
    (tmp_path / "dt=garbage").mkdir()
    (tmp_path / "dt=garbage" / "c.jsonl").write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "dt=2026-11-22-13").write_bytes(b"a file, not a folder")
    found = list_segments(tmp_path)
    assert [(s.path.name, s.partition_key, s.size) for s in found] == [
        ("a.jsonl", "2026-11-22-14:00", 0),
        ("b.jsonl", "2026-11-22-14:00", 2),
    ]


def test_failed_write_fails_waiters_and_recovers_in_a_new_segment(tmp_path: Path) -> None:
    root = tmp_path / "landing"
    with LandingWriter(root) as writer:
        writer.append_many_blocking([envelope(H13, 1)])
        # A file where the hour folder should be: creating the segment fails with a real OSError.
        blocker = root / hour_dir(H14)
        blocker.write_bytes(b"")
        before = snapshot(root)
        with pytest.raises(LandingWriteError):
            writer.append_many_blocking([envelope(H14, 2)])

        async def failing() -> None:
            with pytest.raises(LandingWriteError):
                await writer.append(envelope(H14, 3))

        asyncio.run(failing())
        assert snapshot(root) == before
        stats = writer.stats()
        assert stats.failed_batches == 2 and stats.last_error
        blocker.unlink()
        writer.append_many_blocking([envelope(H14, 4), envelope(H13, 5)])
    assert sorted(r["cbnotif"] for r in landed(root)) == [1, 4, 5]
    # After the failure the earlier hour's segment was abandoned too: 5 lands in a new one.
    assert len(list_segments(root)) == 3


def test_closed_writer_refuses_appends(tmp_path: Path) -> None:
    writer = LandingWriter(tmp_path)
    writer.close()
    assert writer.closed
    with pytest.raises(WriterClosedError):
        writer.append_many_blocking([envelope()])
    writer.close()  # idempotent


def test_close_flushes_queued_work(tmp_path: Path) -> None:
    writer = LandingWriter(tmp_path, max_delay_ms=10_000, max_batch=1_000_000)

    async def scenario() -> None:
        tasks = [asyncio.ensure_future(writer.append(envelope(n=i))) for i in range(30)]
        await asyncio.sleep(0.05)
        await writer.aclose()  # does not wait out max_delay_ms
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert len(landed(tmp_path)) == 30


def test_writer_creates_missing_root_and_no_empty_segments(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "landing"
    LandingWriter(root).close()
    assert root.is_dir() and not any(root.iterdir())


def test_segment_files_are_never_reopened_even_with_same_millisecond(tmp_path: Path) -> None:
    fixed = 1_795_000_000.0
    for _ in range(3):
        with LandingWriter(tmp_path, clock=lambda: fixed) as writer:
            writer.append_many_blocking([envelope(n=1)])
    names = [s.path.name for s in list_segments(tmp_path)]
    assert len(names) == 3 and len(set(names)) == 3
    assert all(n.startswith(f"{int(fixed * 1000):013d}-{os.getpid()}-") for n in names)


@pytest.mark.parametrize("piece", [1, 7, 64, 1000, 10**6])
def test_a_range_read_in_pieces_gives_every_line_once(tmp_path: Path, piece: int) -> None:
    # Lines of several lengths, a range starting and ending inside the segment, and a torn tail.
    lines = [f"line-{i}-{'x' * (i * 7 % 23)}".encode() for i in range(60)]
    segment = tmp_path / "seg.jsonl"
    segment.write_bytes(b"\n".join(lines) + b"\n" + b"torn")
    start = len(lines[0]) + 1  # after the first line
    end = segment.stat().st_size  # the torn tail is in the range but never complete
    reader = _LandingRangeReader([[str(segment), start, end]], piece)
    read = [row[0].encode() for p in reader.partitions() for row in reader.read(p)]
    assert read == lines[1:]
    assert len(reader.partitions()) == -(-(end - start) // piece)


def test_piece_bytes_follows_the_cores_within_bounds() -> None:
    mib = 2**20
    # One 80 MB hour on 4 tasks: 20 MB pieces, not 32 + 32 + 16.
    assert piece_bytes([["a", 0, 80 * mib]], 4) == 20 * mib
    # Several ranges count together.
    assert piece_bytes([["a", 0, 10 * mib], ["b", 5 * mib, 11 * mib]], 4) == 4 * mib
    # Never below MIN_PIECE_BYTES (a small read is one or a few tasks) nor above RANGE_PIECE_BYTES.
    assert piece_bytes([["a", 0, 100]], 4) == MIN_PIECE_BYTES
    assert piece_bytes([["a", 0, 10_000 * mib]], 4) == RANGE_PIECE_BYTES
    assert piece_bytes([], 4) == MIN_PIECE_BYTES


def test_a_piece_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="piece_bytes must be positive, got 0"):
        _LandingRangeReader([["a", 0, 10]], 0)
