"""STH database/collection names, encodings, limits and occur keys (seed 002 tables and README facts)."""

from __future__ import annotations

import pytest

from ngsi_assets.ngsi.sth_config import DataModel, Resolution, STHConfig
from ngsi_assets.ngsi.sth_naming import (
    LEGACY_NAMESPACE_BYTES,
    MAX_NAMESPACE_BYTES,
    RANGES,
    SLOTS,
    STHNameError,
    STHNames,
    collection_name,
    database_name,
    encode_collection_new,
    encode_collection_old,
    encode_database_new,
    encode_database_old,
    escape_occur_key,
    id_fields,
    sth_names,
)

OLD = {"enable_encoding": False}
NEW = {"enable_encoding": True}


def _cfg(model: str, **kw: object) -> STHConfig:
    return STHConfig(data_model=model, **kw)


# The seed's tables: service path x data model, old and new encoding, for car1/car and its two attributes.
# Under the root service path the seed (and Cygnus's documentation) show sth_/car1_car.aggr; Cygnus's
# code and STH-Comet's reader join with "_" after the root as after any path (sth_/_car1_car.aggr),
# and code wins: see test_root_service_path_old_encoding_follows_cygnus_code.
SEED_TABLE = [
    ("/", "dm-by-service-path", "speed", "sth_/.aggr", "sth_x002f.aggr"),
    ("/", "dm-by-entity", "speed", "sth_/_car1_car.aggr", "sth_x002fxffffcar1xffffcar.aggr"),
    ("/", "dm-by-attribute", "speed", "sth_/_car1_car_speed.aggr", "sth_x002fxffffcar1xffffcarxffffspeed.aggr"),
    ("/", "dm-by-attribute", "oil_level", "sth_/_car1_car_oil_level.aggr",
     "sth_x002fxffffcar1xffffcarxffffoil_level.aggr"),
    ("/4wheels", "dm-by-service-path", "speed", "sth_/4wheels.aggr", "sth_x002f4wheels.aggr"),
    ("/4wheels", "dm-by-entity", "speed", "sth_/4wheels_car1_car.aggr", "sth_x002f4wheelsxffffcar1xffffcar.aggr"),
    ("/4wheels", "dm-by-attribute", "speed", "sth_/4wheels_car1_car_speed.aggr",
     "sth_x002f4wheelsxffffcar1xffffcarxffffspeed.aggr"),
    ("/4wheels", "dm-by-attribute", "oil_level", "sth_/4wheels_car1_car_oil_level.aggr",
     "sth_x002f4wheelsxffffcar1xffffcarxffffoil_level.aggr"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "model", "attr", "old", "new"), SEED_TABLE)
def test_seed_collection_names(path: str, model: str, attr: str, old: str, new: str) -> None:
    assert collection_name(path, "car1", "car", attr, _cfg(model, **OLD)) == old
    assert collection_name(path, "car1", "car", attr, _cfg(model, **NEW)) == new


@pytest.mark.parametrize(("path", "model", "attr", "old", "new"), SEED_TABLE)
def test_raw_mongo_collection_names_are_the_aggregated_ones_without_aggr(
    path: str, model: str, attr: str, old: str, new: str
) -> None:
    """Cygnus's NGSIMongoSink (raw samples) names collections with NGSIMongoBaseSink.buildCollectionName,
    as NGSISTHSink does before appending ".aggr"; the database is the same buildDbName."""
    assert collection_name(path, "car1", "car", attr, _cfg(model, **OLD), aggregated=False) == old[: -len(".aggr")]
    assert collection_name(path, "car1", "car", attr, _cfg(model, **NEW), aggregated=False) == new[: -len(".aggr")]
    raw = sth_names("vehicles", path, "car1", "car", attr, _cfg(model, **OLD), aggregated=False)
    assert raw == STHNames("sth_vehicles", old[: -len(".aggr")])


def test_raw_mongo_names_with_spaces_unicode_and_the_namespace_limit() -> None:
    c = _cfg("dm-by-entity", **OLD)
    assert sth_names("ciudad ñ", "/zona uno", "coche ñ", "Coche", "v", c, aggregated=False) == STHNames(
        "sth_ciudad_ñ", "sth_/zona uno_coche ñ_Coche"
    )
    for limit in (MAX_NAMESPACE_BYTES, LEGACY_NAMESPACE_BYTES):
        c = _cfg("dm-by-entity", **OLD, max_namespace_bytes=None if limit == MAX_NAMESPACE_BYTES else limit)
        # The limit fits without ".aggr" where the aggregated name is 5 bytes over.
        eid = "e" * (limit - len("sth_s.sth_/_") - len("_t"))
        assert len(f"sth_s.{collection_name('/', eid, 't', 'a', c, aggregated=False)}".encode()) == limit
        sth_names("s", "/", eid, "t", "a", c, aggregated=False)
        with pytest.raises(STHNameError, match=f"is {limit + 5} bytes"):
            sth_names("s", "/", eid, "t", "a", c)
        with pytest.raises(STHNameError, match=f"is {limit + 1} bytes"):
            sth_names("s", "/", eid + "e", "t", "a", c, aggregated=False)


def test_seed_database_name() -> None:
    assert database_name("vehicles", STHConfig()) == "sth_vehicles"
    assert database_name("vehicles", STHConfig(enable_encoding=True)) == "sth_vehicles"
    assert sth_names("vehicles", "/4wheels", "car1", "car", "speed", STHConfig()) == STHNames(
        "sth_vehicles", "sth_/4wheels_car1_car.aggr"
    )


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        ("abc", "abc"),
        ("a/b", "a_b"),
        ("a\\b", "a_b"),
        ("a.b", "a_b"),
        ('a"b', "a_b"),
        ("a$b", "a_b"),
        ("a b", "a_b"),
        ("Ab=x", "Ab=x"),
        ("ñandú", "ñandú"),
    ],
)
def test_old_database_encoding(raw: str, encoded: str) -> None:
    assert encode_database_old(raw) == encoded


@pytest.mark.parametrize(("raw", "encoded"), [("a$b", "a_b"), ("a/b.c d", "a/b.c d"), ("$$", "__")])
def test_old_collection_encoding(raw: str, encoded: str) -> None:
    assert encode_collection_old(raw) == encoded


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        ("vehicles", "vehicles"),
        ("Vehicles", "x0056ehicles"),
        ("a/b", "ax002fb"),
        ("a\\b", "ax005cb"),
        ("a.b", "ax002eb"),
        ('a"b', "ax0022b"),
        ("a$b", "ax0024b"),
        ("a b", "ax0020b"),
        ("a=b", "axffffb"),
        ("x0041", "xx0041"),
        ("xabcd", "xxabcd"),
        ("xABCD", "xxx0041x0042x0043x0044"),
        ("xyz", "xyz"),
        ("x123", "x123"),  # only 3 hex digits follow
        ("ax1234", "axx1234"),  # at the very end (Cygnus misses this case)
        ("ñ_1-", "ñ_1-"),
    ],
)
def test_new_database_encoding(raw: str, encoded: str) -> None:
    assert encode_database_new(raw) == encoded


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        ("/4wheels", "x002f4wheels"),
        ("/", "x002f"),
        ("Car.One", "Car.One"),
        ("a$b", "ax0024b"),
        ("a=b", "axffffb"),
        ("xffff", "xxffff"),
        ("x00e9", "xx00e9"),
        ("a b", "a b"),
        ("é", "é"),
    ],
)
def test_new_collection_encoding(raw: str, encoded: str) -> None:
    assert encode_collection_new(raw) == encoded


def test_new_encoding_keeps_parts_apart() -> None:
    # Entity "a=b" of type "c" and entity "a" of type "b=c" must not share a collection.
    cfg = _cfg("dm-by-entity", **NEW)
    assert collection_name("/", "a=b", "c", "t", cfg) == "sth_x002fxffffaxffffbxffffc.aggr"
    assert collection_name("/", "a", "b=c", "t", cfg) == "sth_x002fxffffaxffffbxffffc.aggr"
    # ... they do (as in Cygnus: '=' and the concatenator are the same); the x-escape keeps a literal
    # concatenator apart from a real one:
    assert collection_name("/", "axffffb", "c", "t", cfg) == "sth_x002fxffffaxxffffbxffffc.aggr"


def test_prefixes_are_encoded() -> None:
    assert database_name("s", STHConfig(db_prefix="my.db_")) == "my_db_s"
    assert database_name("s", STHConfig(db_prefix="My_", enable_encoding=True)) == "x004dy_s"
    assert collection_name(
        "/p", "e", "t", "a", STHConfig(collection_prefix="c$_", data_model="dm-by-service-path")
    ) == ("c__/p.aggr")
    assert collection_name(
        "/p", "e", "t", "a", STHConfig(collection_prefix="c$_", data_model="dm-by-service-path", enable_encoding=True)
    ) == ("cx0024_x002fp.aggr")


def test_missing_entity_type_is_empty() -> None:
    assert collection_name("/", "e1", None, "a", _cfg("dm-by-entity")) == "sth_/_e1_.aggr"


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # Cygnus NGSIMongoBaseSinkTest.testBuildCollectionNameDMByEntityRootServicePathOldEncoding:
        # service path "/", entity someId/someType -> "sth_/_someId_someType" (before ".aggr").
        ("dm-by-entity", "sth_/_someId_someType.aggr"),
        # ...DMByAttributeRootServicePathOldEncoding: -> "sth_/_someId_someType_someName".
        ("dm-by-attribute", "sth_/_someId_someType_someName.aggr"),
        ("dm-by-service-path", "sth_/.aggr"),
    ],
)
def test_root_service_path_old_encoding_follows_cygnus_code(model: str, expected: str) -> None:
    """NGSIMongoBaseSink.buildCollectionName joins the service path and the entity with "_" whatever the path."""
    assert collection_name("/", "someId", "someType", "someName", _cfg(model)) == expected


@pytest.mark.parametrize("limit", [None, 113, 200])
def test_namespace_limit_is_255_bytes_or_the_setting(limit: int | None) -> None:
    cfg = _cfg("dm-by-attribute", max_namespace_bytes=limit)
    # "sth_s." (6) + "sth_/_" (6) + entity + "_t_a" (4) + ".aggr" (5) = 21 + len(entity)
    fits = "e" * ((limit or 255) - 21)
    assert sth_names("s", "/", fits, "t", "a", cfg).collection == f"sth_/_{fits}_t_a.aggr"
    with pytest.raises(STHNameError, match=rf"namespace 'sth_s\.sth_/_e+_t_a\.aggr' is {(limit or 255) + 1} bytes in "
                       rf"UTF-8; the limit is {limit or 255} \(max_namespace_bytes, else the server's"):  # fmt: skip
        sth_names("s", "/", fits + "e", "t", "a", cfg)


def test_namespace_limit_setting_is_checked() -> None:
    for bad in (0, 256):
        with pytest.raises(ValueError, match="max_namespace_bytes"):
            STHConfig(max_namespace_bytes=bad)


def test_namespace_limit_counts_utf8_bytes() -> None:
    cfg = _cfg("dm-by-attribute", max_namespace_bytes=LEGACY_NAMESPACE_BYTES)
    # 'é' is 2 bytes: 46 of them are 92 bytes, which fit (21 + 92 = 113); one more byte does not.
    assert sth_names("s", "/", "é" * 46, "t", "a", cfg)
    with pytest.raises(STHNameError, match="114 bytes"):
        sth_names("s", "/", "é" * 46 + "e", "t", "a", cfg)
    with pytest.raises(STHNameError, match="115 bytes"):
        sth_names("s", "/", "é" * 47, "t", "a", cfg)


def test_database_name_limit() -> None:
    assert database_name("s" * 59, STHConfig()) == "sth_" + "s" * 59
    with pytest.raises(STHNameError, match="is 64 bytes in UTF-8; MongoDB allows at most 63"):
        database_name("s" * 60, STHConfig())


@pytest.mark.parametrize("field", ["service", "path", "entity", "type", "attr"])
def test_nul_in_any_name_is_refused(field: str) -> None:
    parts = {"service": "s", "path": "/p", "entity": "e", "type": "t", "attr": "a"}
    parts[field] = parts[field] + "\x00"
    with pytest.raises(STHNameError, match="contains a NUL character"):
        sth_names(parts["service"], parts["path"], parts["entity"], parts["type"], parts["attr"], STHConfig(
            data_model="dm-by-attribute"))  # fmt: skip


def test_empty_database_name_is_refused() -> None:
    with pytest.raises(STHNameError, match="empty database name"):
        database_name("", STHConfig(db_prefix=""))


def test_id_fields_per_data_model() -> None:
    assert id_fields(DataModel.BY_SERVICE_PATH) == ("entityId", "entityType", "attrName")
    assert id_fields(DataModel.BY_ENTITY) == ("attrName",)
    assert id_fields(DataModel.BY_ATTRIBUTE) == ()


def test_ranges_and_slots() -> None:
    assert RANGES == {
        Resolution.SECOND: "minute",
        Resolution.MINUTE: "hour",
        Resolution.HOUR: "day",
        Resolution.DAY: "month",
        Resolution.MONTH: "year",
    }
    assert SLOTS == {
        Resolution.SECOND: (0, 59),
        Resolution.MINUTE: (0, 59),
        Resolution.HOUR: (0, 23),
        Resolution.DAY: (1, 31),
        Resolution.MONTH: (0, 11),
    }


@pytest.mark.parametrize(
    ("value", "key"),
    [("a.b", "a\uff0eb"), ("$5", "\uff045"), ("1.5$.", "1\uff0e5\uff04\uff0e"), ("plain", "plain"), ("", "")],
)
def test_occur_key_escaping(value: str, key: str) -> None:
    assert escape_occur_key(value) == key
