"""Continuous runs: an hour processed as increments (byte ranges of its landing segments) equals the
hour processed whole, on the real servers; rerunning an increment, or finishing one a crash cut
short, changes nothing; an increment after a whole-hour run adds only what that run did not read."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from ngsi_assets.assets.ingest import message_store, ngsi_events
from ngsi_assets.assets.sql_sinks import historic_tables, last_data
from ngsi_assets.increments import (
    EXTENDS_TAG,
    INCREMENT_TAG,
    POSITIONS_FILE,
    Increment,
    advanced,
    claim_file,
    claim_text,
    extended,
    parse_claim,
    parse_positions,
    positions_text,
    reach,
    unread_ranges,
)
from ngsi_assets.ingest.landing import LandingWriter
from ngsi_assets.last_data_state import COMPACT_AFTER_ENV
from ngsi_assets.ngsi.envelope import Envelope
from ngsi_assets.sinks.sql_writer import BOOKKEEPING
from ngsi_assets.transforms.schemas import MESSAGE_STORE, NGSI_EVENTS
from resources.lake import LakeResource
from resources.landing import LandingZoneResource
from resources.sql_sinks import SqlSinksResource
from tests.sinks.support import Sink

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOUR_KEY = "2026-03-01-10:00"
T0 = 1_772_359_200_000 + 60_000  # 10:01 UTC
ASSETS = [message_store, ngsi_events, last_data, historic_tables]
CARS = 4


def _notification(i: int) -> Envelope:
    """Car i % CARS: partial updates (speed always, fuel every third), a delete at message 13."""
    car = f"Car{i % CARS}"
    if i == 13:
        entity: dict[str, Any] = {"id": car, "type": "Car", "alterationType": {"type": "Text", "value": "entityDelete"}}
    else:
        entity = {"id": car, "type": "Car", "speed": {"type": "Number", "value": i, "metadata": {}}}
        if i % 3 == 0:
            entity["fuel"] = {"type": "Number", "value": 100 - i, "metadata": {}}
    body = json.dumps({"subscriptionId": "s1", "data": [entity]}).encode()
    return Envelope(f"m{i:04d}", T0 + i * 10, "ngsi-v2", "normalized", "vehicles", "/4wheels", None, None, None,
                    "test", body)  # fmt: skip


def land(root: Path, n: int, notification: Callable[[int], Envelope] = _notification) -> None:
    """Two writers (two segments each, interleaved in time), like a restarted receiver."""
    with LandingWriter(root) as w1:
        w1.append_many_blocking(notification(i) for i in range(0, n // 2))
    with LandingWriter(root) as w2:
        w2.append_many_blocking(notification(i) for i in range(n // 2, n))


def _line_ends(path: Path) -> list[int]:
    ends, pos = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        pos += len(line)
        ends.append(pos)
    return ends


def split_into_increments(landing: LandingZoneResource, rng: random.Random, parts: int) -> list[Increment]:
    """The hour's complete lines cut at random line boundaries into ``parts`` increments, in order."""
    whole = landing.complete_ranges([HOUR_KEY])
    cuts: list[tuple[str, int]] = []
    for name in sorted(whole):
        for end in _line_ends(Path(landing.root) / name):
            cuts.append((name, end))
    chosen = sorted(rng.sample(range(len(cuts) - 1), parts - 1)) + [len(cuts) - 1]
    out, positions, last = [], {}, -1
    for c in chosen:
        ranges: dict[str, list[int]] = {}
        for name, end in cuts[last + 1 : c + 1]:
            ranges.setdefault(name, [positions.get(name, 0), end])[1] = end
            positions[name] = end
        out.append(Increment.of(ranges))
        last = c
    return out


class Platform:
    """A landing zone, a lake and the SQL sinks of one server, with the hot-path assets run by hand."""

    def __init__(self, tmp_path: Path, sink: Sink, name: str) -> None:
        self.landing = LandingZoneResource(root=str(tmp_path / "landing"))
        self.lake = LakeResource(root=str(tmp_path / f"lake-{name}"))
        self.sink = sink
        sink.created_dbs.extend(["vehicles", BOOKKEEPING])
        self.sinks = {sink.dialect.value: {"url": sink.url, "last_data_mode": "both", "data_model": "dm-by-entity"}}

    def run(self, increment: Increment | None = None, assets: list[Any] | None = None, extends: bool = False) -> None:
        tags = {INCREMENT_TAG: increment.to_tag()} if increment else {}
        if extends:
            tags[EXTENDS_TAG] = "1"
        result = materialize(
            assets or ASSETS,
            partition_key=HOUR_KEY,
            tags=tags or None,
            resources={
                "spark": LazyPySparkResource(spark_config={}),
                "lake": self.lake,
                "landing": self.landing,
                "sql_sinks": SqlSinksResource(sinks=self.sinks),
            },
            instance=DagsterInstance.ephemeral(),
        )
        assert result.success
        failed = [c.check_name for c in result.get_asset_check_evaluations() if not c.passed]
        assert not failed

    def lake_rows(self, spark: SparkSession) -> dict[str, list[tuple]]:
        out = {}
        for dataset, schema in (("message_store", MESSAGE_STORE), ("ngsi_events", NGSI_EVENTS)):
            rows = self.lake.read(spark, dataset, schema, [HOUR_KEY]).collect()
            out[dataset] = sorted((tuple(r) for r in rows), key=repr)
        return out

    def sql_rows(self) -> dict[str, list[tuple]]:
        """Every table's rows by column name (an increment may add a column later than a whole hour does,
        so the tables' column order may differ)."""
        out = {}
        for t in self.sink.tables("vehicles"):
            columns = sorted(self.sink.columns("vehicles", t))
            out[t] = [tuple(zip(columns, r, strict=True)) for r in self.sink.rows("vehicles", t, columns)]
        return out

    def drop_tables(self) -> None:
        """Every table of the service, and the record of which increments they hold."""
        conn = self.sink.connect()
        try:
            with conn.cursor() as cur:
                for db in ("vehicles", BOOKKEEPING):
                    for t in self.sink.tables(db):
                        cur.execute(f"DROP TABLE {self.sink.q(db)}.{self.sink.q(t)}")
            conn.commit()
        finally:
            conn.close()


def whole_hour(spark: SparkSession, tmp_path: Path, sink: Sink) -> tuple[dict, dict]:
    """The lake and SQL tables of one whole-hour run; the SQL tables are then dropped for the next."""
    p = Platform(tmp_path, sink, "whole")
    p.run()
    tables = p.lake_rows(spark), p.sql_rows()
    p.drop_tables()
    return tables


def test_increments_in_order_equal_the_whole_hour(
    spark: SparkSession, tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random splits of the same landed hour, run in order, give the tables of one whole-hour run;
    the last-data state's deltas are folded into its base every second run."""
    monkeypatch.setenv(COMPACT_AFTER_ENV, "2")
    land(tmp_path / "landing", 40)
    whole_lake, whole_sql = whole_hour(spark, tmp_path, sink)
    assert len(whole_lake["message_store"]) == 40
    assert {t.lower() for t in whole_sql} == {f"4wheels_car{i}_car" for i in range(CARS)} | {
        f"4wheels_car{i}_car_last_data" for i in range(CARS)
    }
    for seed in (1, 2):
        inc = Platform(tmp_path, sink, f"split{seed}")
        inc.drop_tables()
        increments = split_into_increments(inc.landing, random.Random(seed), parts=3 + seed)
        for i in increments:
            inc.run(i)
        assert inc.lake_rows(spark) == whole_lake, f"split {seed}: {[i.ranges for i in increments]}"
        assert inc.sql_rows() == whole_sql, f"split {seed}: {[i.ranges for i in increments]}"
        # Rerunning any increment changes nothing.
        inc.run(increments[1])
        assert inc.lake_rows(spark) == whole_lake
        assert inc.sql_rows() == whole_sql


def test_an_increment_cut_short_then_rerun_equals_an_uninterrupted_one(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    land(tmp_path / "landing", 24)
    whole_lake, whole_sql = whole_hour(spark, tmp_path, sink)
    inc = Platform(tmp_path, sink, "cut")
    first, second = split_into_increments(inc.landing, random.Random(7), parts=2)
    inc.run(first)
    # The run of the second increment dies after the message store and the events: its sinks never ran.
    inc.run(second, assets=[message_store, ngsi_events])
    inc.run(second)
    assert inc.lake_rows(spark) == whole_lake
    assert inc.sql_rows() == whole_sql


def test_an_increment_whose_range_was_not_recorded_is_rerun_after_a_later_one(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    """A run killed after its rows were in but before its range was recorded, retried after the next
    increment ran: the retry still finds its range unread and replaces its own rows."""
    land(tmp_path / "landing", 24)
    whole_lake, whole_sql = whole_hour(spark, tmp_path, sink)
    inc = Platform(tmp_path, sink, "crash")
    a, b, c = split_into_increments(inc.landing, random.Random(3), parts=3)
    inc.run(a)
    before_b = inc.lake.read_hour_file("message_store", HOUR_KEY, POSITIONS_FILE)
    inc.run(b, assets=[message_store])
    inc.lake.write_hour_file("message_store", HOUR_KEY, POSITIONS_FILE, before_b)  # b's record never written
    inc.run(c)
    inc.run(b)
    assert inc.lake_rows(spark) == whole_lake
    assert inc.sql_rows() == whole_sql


def _past(p: Platform, ends: dict[str, int]) -> Increment:
    """What the landing sensor asks for next: the hour's complete lines past ``ends``."""
    return Increment.of(p.landing.complete_ranges([HOUR_KEY], ends))


def test_an_extending_increment_takes_what_landed_until_it_ran_and_a_rerun_takes_the_same(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    """The landing sensor's increments grow to what landed in their hour by the time they run (a
    run waits while another executes); the next one, asked for past the first one's ranges, takes
    only what nothing took before it. A rerun takes exactly what its first attempt took."""
    root = tmp_path / "landing"
    p = Platform(tmp_path, sink, "extends")
    with LandingWriter(root) as w:
        w.append_many_blocking(_notification(i) for i in range(10))
        first = _past(p, {})  # asked for here
        w.append_many_blocking(_notification(i) for i in range(10, 16))  # the segment grows meanwhile
    with LandingWriter(root) as w:  # and a new segment appears
        w.append_many_blocking(_notification(i) for i in range(16, 20))
    # The next one is asked for while the first waits or executes: past the first one's ranges.
    second = _past(p, {n: r[1] for n, r in first.ranges.items()})
    # The first run dies after the events (its sinks never ran); more lands; it is run again.
    p.run(first, assets=[message_store, ngsi_events], extends=True)
    assert len(p.lake_rows(spark)["message_store"]) == 20
    with LandingWriter(root) as w:
        w.append_many_blocking(_notification(i) for i in range(20, 24))
    p.run(first, extends=True)
    assert sorted(r[0] for r in p.lake_rows(spark)["message_store"]) == [f"m{i:04d}" for i in range(20)]
    # The second: its own ranges were all taken by the first; it takes what landed since.
    p.run(second, extends=True)
    assert sorted(r[0] for r in p.lake_rows(spark)["message_store"]) == [f"m{i:04d}" for i in range(24)]
    # One asked for past the second one's ranges finds everything taken: it adds nothing.
    p.run(_past(p, {n: r[1] for n, r in second.ranges.items()}), extends=True)
    lake, sql = p.lake_rows(spark), p.sql_rows()
    assert sorted(r[0] for r in lake["message_store"]) == [f"m{i:04d}" for i in range(24)]
    p.drop_tables()
    assert (lake, sql) == whole_hour(spark, tmp_path, sink)


def test_an_extending_increment_retried_after_the_next_one_equals_an_uninterrupted_run(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    """A run killed after its rows were in but before their ranges were recorded; the next increment
    runs before its retry and takes those lines again; the retry then keeps only what the next one
    did not take, so nothing is stored twice."""
    root = tmp_path / "landing"
    p = Platform(tmp_path, sink, "retried")
    with LandingWriter(root) as w:
        w.append_many_blocking(_notification(i) for i in range(8))
        first = _past(p, {})
        w.append_many_blocking(_notification(i) for i in range(8, 14))
    before = p.lake.read_hour_file("message_store", HOUR_KEY, POSITIONS_FILE)
    p.run(first, assets=[message_store], extends=True)
    p.lake.write_hour_file("message_store", HOUR_KEY, POSITIONS_FILE, before or "{}")  # its record never written
    with LandingWriter(root) as w:
        w.append_many_blocking(_notification(i) for i in range(14, 18))
    p.run(_past(p, {n: r[1] for n, r in first.ranges.items()}), extends=True)
    p.run(first, extends=True)
    lake, sql = p.lake_rows(spark), p.sql_rows()
    assert sorted(r[0] for r in lake["message_store"]) == [f"m{i:04d}" for i in range(18)]
    p.drop_tables()
    assert (lake, sql) == whole_hour(spark, tmp_path, sink)


def test_stored_ranges_are_merged_and_subtracted() -> None:
    stored = advanced({}, [("s", 0, 10), ("s", 20, 30)])
    assert stored == {"s": [(0, 10), (20, 30)]}
    assert unread_ranges({"s": (5, 40), "t": (0, 4)}, stored) == [("s", 10, 20), ("s", 30, 40), ("t", 0, 4)]
    assert advanced(stored, [("s", 10, 20)]) == {"s": [(0, 30)]}
    assert unread_ranges({"s": (0, 30)}, advanced(stored, [("s", 10, 20)])) == []
    assert parse_positions(positions_text(stored)) == stored


def test_an_extending_increment_grows_past_its_ranges_and_the_stored_ones() -> None:
    stored = {"s": [(0, 10), (20, 30)], "old": [(0, 50)]}
    ranges = {"s": (30, 40)}
    # Looked for past its own range in its segments, past the last stored range in the others.
    assert reach(stored, ranges) == {"s": 40, "old": 50}
    landed = {"s": [40, 70], "old": [50, 60], "new": [0, 5]}
    grown = extended(ranges, landed)
    assert grown == {"s": (30, 70), "old": (50, 60), "new": (0, 5)}
    assert unread_ranges(grown, stored) == [("new", 0, 5), ("old", 50, 60), ("s", 30, 70)]
    assert extended(ranges, {}) == {"s": (30, 40)}  # nothing landed since: its own ranges
    claim = [("s", 30, 70), ("new", 0, 5)]
    assert parse_claim(claim_text(claim)) == claim
    assert claim_file("0a1b") == "_claim-0a1b.json"
    with pytest.raises(ValueError, match="bad increment id"):
        claim_file("../x")


def test_an_increment_after_a_whole_hour_run_adds_only_unread_lines(
    spark: SparkSession, tmp_path: Path, sink: Sink
) -> None:
    landing_root = tmp_path / "landing"
    with LandingWriter(landing_root) as w:
        w.append_many_blocking(_notification(i) for i in range(10))
    p = Platform(tmp_path, sink, "lake")
    increment = Increment.of(p.landing.complete_ranges([HOUR_KEY]))
    p.run()  # a whole-hour run reads the first ten notifications
    stored = parse_positions(p.lake.read_hour_file("message_store", HOUR_KEY, POSITIONS_FILE))
    assert stored == {n: [(0, r[1])] for n, r in increment.ranges.items()}
    with LandingWriter(landing_root) as w:
        w.append_many_blocking(_notification(i) for i in range(10, 16))
    # The increment the sensor asked for before the whole-hour run is already stored: it adds nothing.
    p.run(increment)
    assert len(p.lake_rows(spark)["message_store"]) == 10
    later = Increment.of(p.landing.complete_ranges([HOUR_KEY], {n: rs[-1][1] for n, rs in stored.items()}))
    p.run(later)
    rows = p.lake_rows(spark)["message_store"]
    assert sorted(r[0] for r in rows) == [f"m{i:04d}" for i in range(16)]
    (car0,) = [t for t in p.sink.tables("vehicles") if t.lower() == "4wheels_car0_car"]
    assert len(p.sink.rows("vehicles", car0)) == sum(1 for i in range(16) if i % CARS == 0) + sum(
        1 for i in range(16) if i % CARS == 0 and i % 3 == 0
    )


def test_a_damaged_increment_tag_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match its ranges"):
        Increment.from_tags({INCREMENT_TAG: json.dumps({"id": "00", "ranges": {"dt=2026-03-01-10/a.jsonl": [0, 5]}})})
    with pytest.raises(ValueError, match="is empty or negative"):
        Increment.of({"dt=2026-03-01-10/a.jsonl": [5, 5]})
    inc = Increment.of({"dt=2026-03-01-11/a.jsonl": [0, 5]})
    with pytest.raises(ValueError, match="names segments of other hours"):
        inc.hour_of([HOUR_KEY])
    with pytest.raises(ValueError, match="is for one hour"):
        inc.hour_of([HOUR_KEY, "2026-03-01-11:00"])
