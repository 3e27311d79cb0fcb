"""The versioning fold (seed 004 rules) on hand-built records: exact versions, every priority case."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngsi_assets.ngsi.versioning import DELETE, REFRESH_DELETE, UPSERT, Record, Version, fold_key


def t(hhmm: str) -> datetime:
    return datetime(2019, 6, 5, int(hhmm[:2]), int(hhmm[3:]), tzinfo=UTC)


KEYS = ("product_number",)


def rec(
    at: str,
    m: str,
    op: str = UPSERT,
    p: int = 0,
    fp: dict[str, int] | None = None,
    seq: int = 1,
    guid: str = "g",
    **fields: str | None,
) -> Record:
    return Record(guid, t(at), m, seq, op, p, {"product_number": "1", **fields}, fp or {}, KEYS)


def rows(versions: list[Version]) -> list[tuple]:
    return [
        (
            v.valid_from.strftime("%H:%M"),
            v.valid_to.strftime("%H:%M") if v.valid_to else None,
            v.deleted,
            v.fields.get("description"),
            v.source_message,
            v.provenance,
        )
        for v in versions
    ]


def test_insert_update_delete_provenance() -> None:
    got = fold_key(
        [
            rec("09:31", "m1", description="Kettle"),
            rec("10:10", "m2", description="Automatic Kettle"),
            rec("10:45", "m3", op=DELETE),
        ]
    )
    assert rows(got) == [
        (
            "09:31",
            "10:10",
            False,
            "Kettle",
            "m1",
            {"guid": ("m1", 0), "product_number": ("m1", 0), "description": ("m1", 0)},
        ),
        (
            "10:10",
            "10:45",
            False,
            "Automatic Kettle",
            "m2",
            {"guid": ("m1", 0), "product_number": ("m1", 0), "description": ("m2", 0)},
        ),
        ("10:45", None, True, None, "m3", {"guid": ("m3", 0), "product_number": ("m1", 0), "description": ("m3", 0)}),
    ]


def test_unchanged_record_makes_no_version_and_missing_field_keeps_value() -> None:
    got = fold_key(
        [
            rec("09:00", "m1", description="A", colour="red"),
            rec("09:10", "m2", description="A"),  # nothing changes
            rec("09:20", "m3", colour="blue"),  # description missing: kept
        ]
    )
    assert [(v.valid_from.strftime("%H:%M"), v.fields) for v in got] == [
        ("09:00", {"product_number": "1", "description": "A", "colour": "red"}),
        ("09:20", {"product_number": "1", "description": "A", "colour": "blue"}),
    ]


def test_explicit_null_overwrites() -> None:
    got = fold_key([rec("09:00", "m1", description="A"), rec("09:10", "m2", description=None)])
    assert [v.fields["description"] for v in got] == ["A", None]
    assert got[-1].provenance["description"] == ("m2", 0)


def test_late_message_splits_the_right_version() -> None:
    on_time = [
        rec("09:31", "m1", description="Kenwood Kettle"),
        rec("09:50", "m4", description="Kenwood Auto Kettle"),
        rec("10:10", "m2", description="Kenwood Automatic Kettle"),
    ]
    late = [on_time[0], on_time[2], on_time[1]]
    assert fold_key(late) == fold_key(on_time)
    assert [(v.valid_from.strftime("%H:%M"), v.fields["description"], v.source_message) for v in fold_key(late)] == [
        ("09:31", "Kenwood Kettle", "m1"),
        ("09:50", "Kenwood Auto Kettle", "m4"),
        ("10:10", "Kenwood Automatic Kettle", "m2"),
    ]


def test_same_effective_timestamp_is_ignored() -> None:
    got = fold_key([rec("09:00", "m1", description="A"), rec("09:00", "m2", description="B")])
    assert [(v.fields["description"], v.source_message) for v in got] == [("A", "m1")]


class TestPriorities:
    def test_lower_field_priority_does_not_overwrite_higher(self) -> None:
        got = fold_key(
            [
                rec("09:00", "hi", p=5, description="master"),
                rec("09:10", "lo", p=1, description="other", colour="red"),
            ]
        )
        last = got[-1]
        assert last.fields == {"product_number": "1", "description": "master", "colour": "red"}
        assert last.provenance["description"] == ("hi", 5)
        assert last.provenance["colour"] == ("lo", 1)
        # The guid keeps the higher priority message.
        assert last.provenance["guid"] == ("hi", 5)

    def test_equal_priority_later_wins(self) -> None:
        got = fold_key([rec("09:00", "a", p=2, description="x"), rec("09:10", "b", p=2, description="y")])
        assert got[-1].fields["description"] == "y"
        assert got[-1].provenance["guid"] == ("a", 2)  # not raised: equal priority

    def test_field_priority_overrides_entity_priority(self) -> None:
        got = fold_key(
            [
                rec("09:00", "a", p=5, description="x"),
                rec("09:10", "b", p=1, fp={"description": 9}, description="y"),
            ]
        )
        assert got[-1].fields["description"] == "y"
        assert got[-1].provenance["description"] == ("b", 9)

    def test_guid_priority_raised_without_field_change(self) -> None:
        got = fold_key([rec("09:00", "a", p=0, description="x"), rec("09:10", "b", p=3, description="x")])
        assert len(got) == 2
        assert got[-1].fields == got[0].fields
        assert got[-1].provenance["guid"] == ("b", 3)
        assert got[-1].provenance["description"] == ("a", 0)

    def test_guid_not_raised_when_lower_even_if_fields_update(self) -> None:
        got = fold_key(
            [rec("09:00", "a", p=3, fp={"description": 0}, description="x"), rec("09:10", "b", p=1, description="y")]
        )
        assert got[-1].fields["description"] == "y"
        assert got[-1].provenance["guid"] == ("a", 3)

    def test_low_priority_delete_is_refused(self) -> None:
        got = fold_key([rec("09:00", "a", p=5, description="x"), rec("09:10", "b", op=DELETE, p=1)])
        assert [v.deleted for v in got] == [False]

    def test_delete_with_equal_priority_applies(self) -> None:
        got = fold_key([rec("09:00", "a", p=5, description="x"), rec("09:10", "b", op=DELETE, p=5)])
        assert [v.deleted for v in got] == [False, True]

    def test_low_priority_recreate_is_refused(self) -> None:
        got = fold_key(
            [rec("09:00", "a", p=5, description="x"), rec("09:10", "b", op=DELETE, p=5), rec("09:20", "c", p=1)]
        )
        assert [v.deleted for v in got] == [False, True]

    def test_recreate_with_enough_priority(self) -> None:
        got = fold_key(
            [
                rec("09:00", "a", description="x"),
                rec("09:10", "b", op=DELETE),
                rec("09:20", "c", description="back"),
            ]
        )
        assert [(v.deleted, v.fields["description"]) for v in got] == [(False, "x"), (True, None), (False, "back")]

    def test_deleting_a_deleted_row_needs_higher_priority(self) -> None:
        same = fold_key([rec("09:00", "a"), rec("09:10", "b", op=DELETE, p=0), rec("09:20", "c", op=DELETE, p=0)])
        assert [v.source_message for v in same] == ["a", "b"]
        higher = fold_key([rec("09:00", "a"), rec("09:10", "b", op=DELETE, p=0), rec("09:20", "c", op=DELETE, p=4)])
        assert [(v.source_message, v.deleted) for v in higher] == [("a", False), ("b", True), ("c", True)]
        assert higher[-1].provenance["guid"] == ("c", 4)
        # ... which then stops a low-priority insert undoing it.
        undo = fold_key(
            [rec("09:00", "a"), rec("09:10", "b", op=DELETE), rec("09:20", "c", op=DELETE, p=4), rec("09:30", "d", p=1)]
        )
        assert [v.source_message for v in undo] == ["a", "b", "c"]

    def test_out_of_sequence_with_priorities(self) -> None:
        # A high-priority value at 09:00 stops a later low-priority one, whatever the arrival order.
        records = [rec("09:30", "lo", p=0, description="lo"), rec("09:00", "hi", p=5, description="hi")]
        got = fold_key(records)
        assert [v.fields["description"] for v in got] == ["hi"]


def test_delete_of_unknown_key_creates_nothing() -> None:
    assert fold_key([rec("09:00", "a", op=DELETE)]) == []


def test_refresh_delete_applies_to_live_rows_only() -> None:
    assert [v.deleted for v in fold_key([rec("09:00", "a"), rec("09:10", "r", op=REFRESH_DELETE)])] == [False, True]
    assert fold_key([rec("09:10", "r", op=REFRESH_DELETE), rec("09:20", "a")])[0].valid_from == t("09:20")
    deleted_first = fold_key(
        [rec("09:00", "a"), rec("09:05", "d", op=DELETE, p=0), rec("09:10", "r", op=REFRESH_DELETE, p=9)]
    )
    assert [v.source_message for v in deleted_first] == ["a", "d"]


_hours = st.sampled_from(["09:00", "09:10", "09:20", "09:30", "09:40", "09:50"])
_record = st.builds(
    lambda at, m, op, p, d, c: Record(
        "g",
        t(at),
        m,
        1,
        op,
        p,
        {"product_number": "1", **({} if d is None else {"description": d}), **({} if c is None else {"colour": c})},
        {},
        KEYS,
    ),
    _hours,
    st.sampled_from(["m1", "m2", "m3", "m4", "m5"]),
    st.sampled_from([UPSERT, UPSERT, DELETE, REFRESH_DELETE]),
    st.integers(-1, 2),
    st.one_of(st.none(), st.sampled_from(["a", "b"])),
    st.one_of(st.none(), st.sampled_from(["red", "blue"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, max_size=8, unique_by=lambda r: (r.message, r.effective)), st.randoms())
def test_any_arrival_order_gives_the_same_versions(records: list[Record], rnd) -> None:
    shuffled = list(records)
    rnd.shuffle(shuffled)
    expected = fold_key(records)
    assert fold_key(shuffled) == expected
    # Versions tile time: each closes where the next opens, and only the last is open.
    for a, b in zip(expected, expected[1:], strict=False):
        assert a.valid_to == b.valid_from and a.valid_from < b.valid_from
    assert all(v.valid_to is not None for v in expected[:-1])
    if expected:
        assert expected[-1].valid_to is None


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, max_size=10, unique_by=lambda r: (r.message, r.effective)), st.integers(0, 6))
def test_folding_on_from_the_latest_version_equals_folding_everything(records: list[Record], cut: int) -> None:
    """Records stored up to a time, later ones new: going on from the stored records' latest version
    with only the new records gives the versions of folding them all (the state is whole in a version)."""
    cut_at = t(["09:00", "09:10", "09:20", "09:30", "09:40", "09:50", "09:59"][cut])
    stored = [r for r in records if r.effective < cut_at]
    new = [r for r in records if r.effective >= cut_at]
    expected = fold_key(records)
    before = fold_key(stored)
    if not before:
        assert fold_key(new) == expected
        return
    # The latest version as the table holds it: a field is what its provenance names.
    latest = before[-1]
    assert set(latest.fields) == set(latest.provenance) - {"guid"}
    assert before[:-1] + fold_key(new, start=latest) == expected


def test_a_record_not_after_the_start_is_refused() -> None:
    (latest,) = fold_key([rec("09:10", "a")])
    with pytest.raises(ValueError, match="does not come after"):
        fold_key([rec("09:10", "b")], start=latest)
