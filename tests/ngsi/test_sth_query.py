"""STH-Comet's query rules without a server: dates, slots, filters, the unfiltered answer and JSON numbers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ngsi_assets.ngsi.sth_config import DataModel
from ngsi_assets.ngsi.sth_query import (
    QueryError,
    aggregated_filter,
    aggregated_values,
    offset_of,
    origin_of,
    parse_date,
    parse_query,
    raw_filter,
    raw_plan,
    to_json,
)

HEADERS = {"fiware-service": "city", "fiware-servicepath": "/p"}
T = datetime(2026, 3, 14, 15, 9, 26, 535000, tzinfo=UTC)


def q(*params: tuple[str, str], version: int = 1):  # noqa: ANN201
    return parse_query(version, HEADERS, "e1", "T", "a", list(params))


@pytest.mark.parametrize(
    ("resolution", "origin", "offset"),
    [
        ("second", datetime(2026, 3, 14, 15, 9, tzinfo=UTC), 26),
        ("minute", datetime(2026, 3, 14, 15, tzinfo=UTC), 9),
        ("hour", datetime(2026, 3, 14, tzinfo=UTC), 15),
        ("day", datetime(2026, 3, 1, tzinfo=UTC), 14),
        ("month", datetime(2026, 1, 1, tzinfo=UTC), 2),  # months 0-11, as STH-Comet's filterResults
    ],
)
def test_origins_and_offsets(resolution: str, origin: datetime, offset: int) -> None:
    assert origin_of(T, resolution) == origin
    assert offset_of(T, resolution) == offset


def test_dates_as_joi_reads_them() -> None:
    assert parse_date("2026-03-14T15:09:26.535Z") == T
    assert parse_date("2026-03-14T16:09:26.535+01:00") == T
    assert parse_date("1773500966535") == T
    assert parse_date("2026-03-14") == datetime(2026, 3, 14, tzinfo=UTC)
    assert parse_date("soon") is None and parse_date("") is None


def test_filters_follow_the_data_model() -> None:
    query = q(("aggrMethod", "sum"), ("aggrPeriod", "hour"), ("dateFrom", "2026-03-14T15:00:00Z"))
    assert aggregated_filter(query, DataModel.BY_SERVICE_PATH) == {
        "_id.entityId": "e1", "_id.entityType": "T", "_id.attrName": "a", "_id.resolution": "hour",
        "_id.origin": {"$gte": datetime(2026, 3, 14, tzinfo=UTC)},
    }  # fmt: skip
    assert aggregated_filter(query, DataModel.BY_ATTRIBUTE) == {
        "_id.resolution": "hour",
        "_id.origin": {"$gte": datetime(2026, 3, 14, tzinfo=UTC)},
    }
    raw = q(("lastN", "5"), ("dateTo", "2026-03-14T15:00:00Z"))
    assert raw_filter(raw, DataModel.BY_ENTITY) == {
        "attrName": "a",
        "recvTime": {"$lte": datetime(2026, 3, 14, 15, tzinfo=UTC)},
    }
    assert raw_plan(raw) == (-1, 0, 5)
    assert raw_plan(q(("hLimit", "0"), ("hOffset", "7"))) == (1, 7, 100)  # limit 0: at most maxPageSize
    assert raw_plan(q(("filetype", "csv"))) == (1, 0, 0)


def test_unfiltered_answer_keeps_empty_points_and_zeroes_those_outside_the_dates() -> None:
    docs = [
        {
            "_id": {"attrName": "a", "origin": datetime(2026, 3, 14, tzinfo=UTC), "resolution": "hour", "range": "day"},
            "points": [
                {"offset": 14, "samples": 2, "sum": 3.0, "min": 1.0},
                {"offset": 15, "samples": 0, "sum": 0.0, "min": float("inf")},
                {"offset": 16, "samples": 1, "sum": 5.0, "min": 5.0},
            ],
        }
    ]
    query = q(("aggrMethod", "sum,min"), ("aggrPeriod", "hour"), ("dateFrom", "2026-03-14T15:30:00Z"))
    unfiltered = aggregated_values(docs, query, DataModel.BY_ENTITY, filter_out_empty=False)
    assert unfiltered[0]["_id"]["range"] == "day"  # the whole _id, as find() returns it
    assert unfiltered[0]["points"] == [
        {"offset": 14, "samples": 0, "sum": 0, "min": float("inf")},
        {"offset": 15, "samples": 0, "sum": 0.0, "min": float("inf")},
        {"offset": 16, "samples": 1, "sum": 5.0, "min": 5.0},
    ]
    assert b'"min":null' in to_json(unfiltered)  # JSON.stringify(Infinity) is null
    filtered = aggregated_values(docs, query, DataModel.BY_ENTITY)
    assert filtered == [
        {"_id": {"attrName": "a", "origin": docs[0]["_id"]["origin"], "resolution": "hour"},
         "points": [{"offset": 16, "samples": 1, "sum": 5.0, "min": 5.0}]}
    ]  # fmt: skip


def test_json_numbers_and_dates_as_node_writes_them() -> None:
    assert to_json({"a": 21.0, "b": 0.5, "t": T, "n": [1e300, -0.0]}) == (
        b'{"a":21,"b":0.5,"t":"2026-03-14T15:09:26.535Z","n":[1e+300,0]}'
    )


def test_lastn_zero_counts_as_asked_for_raw() -> None:
    assert q(("lastN", "0")).raw
    with pytest.raises(QueryError, match="A combination"):
        q(("hOffset", "0"))
