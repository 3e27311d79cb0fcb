"""Last data ordered by the ISO 8601 instant of TimeInstant, whatever form devices write it in.

Random instants, rendered in random ISO 8601 forms and offsets, arrive in random order over whole-hour
runs and increments of the last_data asset: after every run, PostgreSQL and MariaDB hold the value of
the newest instant seen so far, and TimeInstant as the device wrote it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from ngsi_assets.increments import INCREMENT_TAG, Increment
from ngsi_assets.ngsi.sql_naming import INSTANT_COLUMN, Dialect, fixed_column
from ngsi_assets.transforms.schemas import NGSI_EVENTS
from tests.assets.test_last_data_rules import Hours
from tests.sinks.support import Sink
from tests.transforms.test_instants import rendered
from tests.transforms.test_sql_sinks import T0, ev

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HOUR = 3_600_000
_examples = itertools.count()


class Runs(Hours):
    """ngsi_events landed per hour (whole) or as increments, and last_data run over each."""

    def deliver(self, hour: int, rows: list[tuple[Any, ...]], increment: int | None = None) -> dict[str, Any]:
        if increment is None:
            self.land(hour, rows)
            (meta,) = self.run(hour)
            return meta
        df = self.spark.createDataFrame([(*r[:-1], f"2026-03-01-{hour:02d}") for r in rows], NGSI_EVENTS)
        inc = Increment.of({f"dt=2026-03-01-{hour:02d}/part-{increment}": (0, 1)})
        self.lake.append_increment(df, "ngsi_events", f"2026-03-01-{hour:02d}:00", inc.id)
        self.lake.mark_increment_done("ngsi_events", f"2026-03-01-{hour:02d}:00", inc.id)
        (meta,) = self.run(hour, tags={INCREMENT_TAG: inc.to_tag()})
        return meta

    def row(self, table: str) -> tuple | None:
        d = self.sink.dialect
        cols = [fixed_column("entityId", d), "speed", "timeinstant" if d is Dialect.POSTGRESQL else "TimeInstant"]
        if table not in self.sink.tables("vehicles"):
            return None
        rows = self.sink.rows("vehicles", table, cols)
        assert len(rows) <= 1, rows
        return rows[0] if rows else None


@pytest.fixture
def runs(spark: SparkSession, sink: Sink, tmp_path: Path) -> Runs:
    return Runs(spark, tmp_path, sink, last_data_timestamp_key="TimeInstant", last_data_sql_timestamp_format="iso8601")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    observations=st.lists(rendered(), min_size=2, max_size=5, unique_by=lambda r: r[1]),
    plan=st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=5, max_size=5),
)
def test_the_newest_instant_wins_in_any_form_order_and_run(
    runs: Runs, observations: list[tuple[str, int]], plan: list[tuple[int, bool]]
) -> None:
    n = next(_examples)
    entity = f"car{n}"
    table = f"4wheels_{entity}_car_last_data"
    # Observation i is received at T0 + i hours (hypothesis draws the instants in any order).
    pending = list(enumerate(observations))
    seen: list[tuple[int, str, str]] = []
    for size, as_increment in plan:
        if not pending:
            break
        batch, pending = pending[:size], pending[size:]
        hour = 10 + batch[0][0]
        rows = []
        for i, (text, ns) in batch:
            recv = T0 + (hour - 10) * HOUR + i
            msg = f"m{n}-{i}"
            rows += [ev(msg, entity, "speed", str(i), recv), ev(msg, entity, "TimeInstant", text, recv)]
            seen.append((ns, str(i), text))
        meta = runs.deliver(hour, rows, n * 100 + batch[0][0] if as_increment else None)
        assert meta[f"{runs.sink.dialect.value}_timestamp_fallbacks"] == 0
        _, value, text = max(seen)
        assert runs.row(table) == (entity, value, text), (seen, plan)


def test_an_unreadable_time_instant_is_kept_and_ordered_by_its_receive_time(runs: Runs) -> None:
    t = "4wheels_car1_car_last_data"
    meta = runs.deliver(10, [ev("m1", "car1", "speed", "1", T0), ev("m1", "car1", "TimeInstant", "n/a", T0)], None)
    assert meta[f"{runs.sink.dialect.value}_timestamp_fallbacks"] == 1
    assert runs.row(t) == ("car1", "1", "n/a")
    # An observation of 2026-03-01T09:00+00 (before the first one's receive time) loses to it...
    runs.deliver(11, [ev("m2", "car1", "speed", "2", T0 + HOUR),
                  ev("m2", "car1", "TimeInstant", "2026-03-01T11:00:00+02:00", T0 + HOUR)], None)  # fmt: skip
    assert runs.row(t) == ("car1", "1", "n/a")
    # ... one of 10:30 UTC wins.
    runs.deliver(12, [ev("m3", "car1", "speed", "3", T0 + 2 * HOUR),
                  ev("m3", "car1", "TimeInstant", "2026-03-01 07:30:00-0300", T0 + 2 * HOUR)])  # fmt: skip
    assert runs.row(t) == ("car1", "3", "2026-03-01 07:30:00-0300")


def test_the_instant_column_is_nanoseconds_and_guards_the_row(runs: Runs) -> None:
    t = "4wheels_car1_car_last_data"
    runs.deliver(10, [ev("m1", "car1", "speed", "1", T0),
                  ev("m1", "car1", "TimeInstant", "2026-03-01T10:00:00.000000002Z", T0)], None)  # fmt: skip
    (stored,) = runs.sink.rows("vehicles", t, [INSTANT_COLUMN])
    assert int(stored[0]) == 1_772_359_200_000_000_002
    # One nanosecond earlier, received later: the guard keeps the stored row even without the state
    # (a fresh lake, as after a state folder was lost), and the asset's check reports the difference.
    other = Runs(runs.spark, Path(runs.lake.root).parent / "other", runs.sink,
                 last_data_timestamp_key="TimeInstant", last_data_sql_timestamp_format="iso8601")  # fmt: skip
    earlier = "2026-03-01T12:00:00.000000001+02:00"
    other.land(11, [ev("m2", "car1", "speed", "2", T0 + HOUR), ev("m2", "car1", "TimeInstant", earlier, T0 + HOUR)])
    other.run(11, checks_pass=False)
    assert runs.row(t) == ("car1", "1", "2026-03-01T10:00:00.000000002Z")
