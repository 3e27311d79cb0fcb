"""Cygnus-compatible SQL names: encodings, data models, lowercase, defaults and length limits."""

from __future__ import annotations

import pytest

from ngsi_assets.ngsi.sql_naming import (
    DataModel,
    Dialect,
    NamingConfig,
    NamingError,
    attribute_column,
    database_name,
    db_name,
    encode_new,
    encode_old,
    quote_ident,
    table_name,
)

PG, MY = Dialect.POSTGRESQL, Dialect.MYSQL
E, SP, ET = DataModel.BY_ENTITY, DataModel.BY_SERVICE_PATH, DataModel.BY_ENTITY_TYPE
FET = DataModel.BY_FIXED_ENTITY_TYPE


def cfg(dialect: Dialect = MY, model: DataModel = E, encoding: bool = False, lower: bool = False) -> NamingConfig:
    return NamingConfig(dialect=dialect, data_model=model, enable_encoding=encoding, enable_lowercase=lower)


@pytest.mark.parametrize(
    ("text", "dialect", "expected"),
    [
        ("car1", MY, "car1"),
        ("Car_1", MY, "Car_1"),
        ("Car_1", PG, "x0043ar_1"),
        ("/4wheels", MY, "x002f4wheels"),
        ("a=b", MY, "axffffb"),
        ("a b", MY, "ax0020b"),
        ("é", MY, "x00e9"),
        ("😀", MY, "xd83dxde00"),  # one code point, two UTF-16 code units
        ("x0041", MY, "xx0041"),  # a literal x + 4 hex digits is escaped
        ("xABCD", MY, "xxABCD"),
        ("x12", MY, "x12"),  # fewer than 4 digits follow: kept
        ("x123", MY, "x123"),
        ("ax1234", MY, "axx1234"),
        ("xyz", MY, "xyz"),
        ("xg123", MY, "xg123"),
        ('`"', MY, "x0060x0022"),
    ],
)
def test_new_encoding(text: str, dialect: Dialect, expected: str) -> None:
    assert encode_new(text, dialect) == expected


def test_new_encoding_of_an_injection_attempt_is_plain_letters_digits_and_x() -> None:
    out = encode_new("'; DROP TABLE t; --", MY)
    assert out == "x0027x003bx0020DROPx0020TABLEx0020tx003bx0020x002dx002d"
    assert encode_new("'; DROP TABLE t; --", PG) == (
        "x0027x003bx0020x0044x0052x004fx0050x0020x0054x0041x0042x004cx0045x0020tx003bx0020x002dx002d"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("car1", "car1"), ("/4wheels", "_4wheels"), ("a-b.c d", "a_b_c_d"), ("é😀", "__"), ("`;'", "___")],
)
def test_old_encoding(text: str, expected: str) -> None:
    assert encode_old(text) == expected
    assert encode_old(text, PG) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("car1", "car1"), ("/4wheels", "_4wheels"), ("a-b.c d", "a-b.c_d"), ("a_b", "a_b"), ("é😀", "__"),
     ("`;'", "___"), ("smart-city", "smart-city")],
)  # fmt: skip
def test_old_encoding_mysql_keeps_dash_and_dot_as_cygnus(text: str, expected: str) -> None:
    """Cygnus NGSIUtils.encode: ENCODEPATTERN = [^a-zA-Z0-9\\.\\-] -> '_' (the MySQL sink backtick-quotes)."""
    assert encode_old(text, MY) == expected


# Cygnus's own names for service "smart-city", path "/my.zone-1", entity "car-1.a" of type "Car",
# old encoding: NGSIMySQLSink.buildDbName / buildTableName (NGSIUtils.encode keeps '-' and '.'), and
# NGSIPostgreSQLSink.buildSchemaName / buildTableName for PostgreSQL, where this platform differs on
# purpose: Cygnus's unquoted "CREATE SCHEMA smart-city" is a syntax error (and a '.' makes a
# qualified name), so no such table exists; '-' and '.' become '_', and PostgreSQL folds to lower case.
CYGNUS_OLD = [
    # model, MySQL database, MySQL table, PostgreSQL schema, PostgreSQL table
    (E, "smart-city", "my.zone-1_car-1.a_Car", "smart_city", "my_zone_1_car_1_a_car"),
    (DataModel.BY_ENTITY_DATABASE, "smart-city", "my.zone-1_car-1.a_Car", None, None),
    (ET, "smart-city", "my.zone-1_Car", "smart_city", "my_zone_1_car"),
    (DataModel.BY_ENTITY_TYPE_DATABASE, "smart-city", "my.zone-1_Car", None, None),
    (SP, "smart-city", "my.zone-1", "smart_city", "my_zone_1"),
    (FET, "smart-city", "Car", "smart_city", "car"),
    (DataModel.BY_FIXED_ENTITY_TYPE_DATABASE, "smart-city", "Car", None, None),
]


# New encoding, same names (NGSICharsets.encodeMySQL / encodePostgreSQL): dm-by-fixed-entity-type is
# the encoded type alone.
CYGNUS_NEW = [
    (E, "smartx002dcity", "x002fmyx002ezonex002d1xffffcarx002d1x002eaxffffCar",
     "smartx002dcity", "x002fmyx002ezonex002d1xffffcarx002d1x002eaxffffx0043ar"),
    (DataModel.BY_ENTITY_DATABASE, "smartx002dcity", "x002fmyx002ezonex002d1xffffcarx002d1x002eaxffffCar", None, None),
    (ET, "smartx002dcity", "x002fmyx002ezonex002d1xffffCar", "smartx002dcity", "x002fmyx002ezonex002d1xffffcar"),
    (FET, "smartx002dcity", "Car", "smartx002dcity", "x0043ar"),
    (DataModel.BY_FIXED_ENTITY_TYPE_DATABASE, "smartx002dcity", "Car", None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("encoding", "model", "my_db", "my_table", "pg_schema", "pg_table"),
    [(False, *row) for row in CYGNUS_OLD] + [(True, *row) for row in CYGNUS_NEW],
)
def test_cygnus_names(
    encoding: bool, model: DataModel, my_db: str, my_table: str, pg_schema: str | None, pg_table: str | None
) -> None:
    c = cfg(MY, model, encoding)
    assert (db_name("smart-city", c), table_name("/my.zone-1", "car-1.a", "Car", c)) == (my_db, my_table)
    if pg_schema is not None:
        c = cfg(PG, model, encoding)
        assert (db_name("smart-city", c), table_name("/my.zone-1", "car-1.a", "Car", c)) == (pg_schema, pg_table)


def test_fixed_entity_type_ignores_path_and_id_and_names_the_root_path() -> None:
    c = cfg(MY, FET, False)
    assert table_name("/", "a", "Car", c) == table_name("/x/y", "b", "Car", c) == "Car"
    assert table_name("/", "a", "Car", cfg(PG, FET, False)) == "car"


# The seed's example (car1 of type car, service vehicles), every model and encoding, both dialects.
@pytest.mark.parametrize(
    ("model", "encoding", "path", "expected"),
    [
        (E, False, "/", "car1_car"),
        (E, False, "/4wheels", "4wheels_car1_car"),
        (SP, False, "/4wheels", "4wheels"),
        (ET, False, "/", "car"),
        (ET, False, "/4wheels", "4wheels_car"),
        # Cygnus's code prefixes the encoded root path (the seed's second table shows it too).
        (E, True, "/", "x002fxffffcar1xffffcar"),
        (E, True, "/4wheels", "x002f4wheelsxffffcar1xffffcar"),
        (SP, True, "/", "x002f"),
        (SP, True, "/4wheels", "x002f4wheels"),
        (ET, True, "/", "x002fxffffcar"),
        (ET, True, "/4wheels", "x002f4wheelsxffffcar"),
    ],
)
@pytest.mark.parametrize("dialect", [MY, PG])
def test_seed_table_names(model: DataModel, encoding: bool, path: str, expected: str, dialect: Dialect) -> None:
    c = cfg(dialect, model, encoding)
    assert table_name(path, "car1", "car", c) == expected
    assert db_name("vehicles", c) == "vehicles"


def test_root_path_with_dm_by_service_path_old_encoding_is_an_error() -> None:
    with pytest.raises(NamingError, match="root service path"):
        table_name("/", "car1", "car", cfg(MY, SP, False))


def test_defaults_service_and_path() -> None:
    c = cfg(MY, E, False)
    assert db_name(None, c) == "default"
    assert db_name("", c) == "default"
    assert table_name(None, "car1", "car", c) == "car1_car"
    assert table_name("", "car1", None, c) == "car1_"


def test_upper_case_mysql_keeps_case_unless_lowercase() -> None:
    assert table_name("/Fleet", "Car1", "Car", cfg(MY, E, False)) == "Fleet_Car1_Car"
    assert table_name("/Fleet", "Car1", "Car", cfg(MY, E, False, lower=True)) == "fleet_car1_car"
    assert db_name("Vehicles", cfg(MY, E, True)) == "Vehicles"
    assert db_name("Vehicles", cfg(MY, E, True, lower=True)) == "vehicles"


def test_postgresql_folds_names_like_unquoted_cygnus_sql() -> None:
    assert table_name("/Fleet", "Car1", "Car", cfg(PG, E, False)) == "fleet_car1_car"
    assert db_name("Vehicles", cfg(PG, E, False)) == "vehicles"
    assert table_name("/Fleet", "Car1", "Car", cfg(PG, E, True)) == "x002fx0046leetxffffx0043ar1xffffx0043ar"
    # dm-by-entity-type: Cygnus uses encodeMySQL there, then PostgreSQL folds the unquoted name.
    assert table_name("/Fleet", "Car1", "Car", cfg(PG, ET, True)) == "x002ffleetxffffcar"


def test_last_data_suffix_counts_towards_the_limit() -> None:
    assert table_name("/a", "e", "t", cfg(MY), "_last_data") == "a_e_t_last_data"


@pytest.mark.parametrize(("dialect", "limit"), [(MY, 64), (PG, 63)])
def test_length_limits_at_and_one_over(dialect: Dialect, limit: int) -> None:
    c = cfg(dialect, E, False)
    # table "<id>_t": at the limit, then one over
    at = "e" * (limit - 2)
    assert len(table_name("/", at, "t", c)) == limit
    with pytest.raises(NamingError, match=f"limit of {limit}"):
        table_name("/", at + "e", "t", c)
    assert db_name("s" * limit, c) == "s" * limit
    with pytest.raises(NamingError, match=f"{limit + 1} characters"):
        db_name("s" * (limit + 1), c)
    with pytest.raises(NamingError):
        table_name("/", at, "t", c, "_last_data")


@pytest.mark.parametrize(("dialect", "limit"), [(MY, 64), (PG, 63)])
def test_attribute_column_limits(dialect: Dialect, limit: int) -> None:
    at = "a" * (limit - 3)  # its _md column is exactly at the limit
    assert attribute_column(at, dialect) == at
    with pytest.raises(NamingError, match="_md"):
        attribute_column(at + "a", dialect)


def test_attribute_columns() -> None:
    assert attribute_column("oil_level", MY) == "oil_level"
    assert attribute_column("fillingLevel", MY) == "fillingLevel"
    assert attribute_column("fillingLevel", PG) == "fillinglevel"
    assert attribute_column("a`b", MY) == "ax0060b"
    assert attribute_column('a"; DROP', PG) == "ax0022x003bx0020drop"
    with pytest.raises(NamingError, match="fixed column"):
        attribute_column("entityId", MY)
    with pytest.raises(NamingError, match="fixed column"):
        attribute_column("RECVTIME", PG)
    with pytest.raises(NamingError, match="empty"):
        attribute_column("", MY)


def test_quote_ident_doubles_quotes() -> None:
    assert quote_ident('a"b', PG) == '"a""b"'
    assert quote_ident("a`b", MY) == "`a``b`"


# PostgreSQL's database-per-service models, service "smart-city", path "/my.zone-1", entity "car-1.a"
# of type "Car": NGSIPostgreSQLSink.buildDBName (the JDBC URL's database: NGSIUtils.encode keeps '-'
# and '.', no case folding), buildSchemaName (the service, or the service path for
# *-database-schema) and buildTableName (as the model without "-database...").
PG_DATABASE_MODELS = [
    # model, encoding, database, schema, table
    ("dm-by-entity-database", False, "smart-city", "smart_city", "my_zone_1_car_1_a_car"),
    ("dm-by-entity-database-schema", False, "smart-city", "my_zone_1", "my_zone_1_car_1_a_car"),
    ("dm-by-entity-type-database", False, "smart-city", "smart_city", "my_zone_1_car"),
    ("dm-by-entity-type-database-schema", False, "smart-city", "my_zone_1", "my_zone_1_car"),
    ("dm-by-fixed-entity-type-database", False, "smart-city", "smart_city", "car"),
    ("dm-by-fixed-entity-type-database-schema", False, "smart-city", "my_zone_1", "car"),
    ("dm-by-entity-database", True, "smartx002dcity", "smartx002dcity",
     "x002fmyx002ezonex002d1xffffcarx002d1x002eaxffffx0043ar"),
    ("dm-by-entity-database-schema", True, "smartx002dcity", "x002fmyx002ezonex002d1",
     "x002fmyx002ezonex002d1xffffcarx002d1x002eaxffffx0043ar"),
    ("dm-by-entity-type-database-schema", True, "smartx002dcity", "x002fmyx002ezonex002d1",
     "x002fmyx002ezonex002d1xffffcar"),
    ("dm-by-fixed-entity-type-database-schema", True, "smartx002dcity", "x002fmyx002ezonex002d1", "x0043ar"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "encoding", "database", "schema", "table"), PG_DATABASE_MODELS)
def test_postgresql_database_per_service_models(
    model: str, encoding: bool, database: str, schema: str, table: str
) -> None:
    c = cfg(PG, DataModel(model), encoding)
    got = (
        database_name("smart-city", c),
        db_name("smart-city", c, "/my.zone-1"),
        table_name("/my.zone-1", "car-1.a", "Car", c),
    )
    assert got == (database, schema, table)
    # MySQL has no separate database: the "-database" models name the database as the service.
    if not model.endswith("-schema"):
        assert database_name("smart-city", cfg(MY, DataModel(model), encoding)) is None


def test_database_name_keeps_case_unless_lowercase_and_other_models_have_none() -> None:
    assert database_name("Smart-City", cfg(PG, DataModel.BY_ENTITY_DATABASE)) == "Smart-City"
    assert database_name("Smart-City", cfg(PG, DataModel.BY_ENTITY_DATABASE, lower=True)) == "smart-city"
    assert database_name("Smart-City", cfg(PG, E)) is None
    with pytest.raises(
        NamingError, match="database name 'xxxx.*' is 64 characters long, over the postgresql limit of 63"
    ):
        database_name("x" * 64, cfg(PG, DataModel.BY_ENTITY_DATABASE))


def test_root_path_cannot_name_a_schema_with_the_old_encoding() -> None:
    c = cfg(PG, DataModel.BY_ENTITY_DATABASE_SCHEMA)
    with pytest.raises(
        NamingError, match="the root service path '/' cannot name a schema with dm-by-entity-database-schema"
    ):
        db_name("s", c, "/")
    assert db_name("s", cfg(PG, DataModel.BY_ENTITY_DATABASE_SCHEMA, True), "/") == "x002f"


@pytest.mark.parametrize(
    ("dialect", "encoding", "db", "table"),
    [
        # Old encoding: NGSIUtils.encode turns the space and the ñ into '_' (the path loses its '/').
        (MY, False, "ciudad__", "zona_uno_coche___Coche"),
        (PG, False, "ciudad__", "zona_uno_coche___coche"),
        # New encoding: NGSICharsets.encodeMySQL / encodePostgreSQL write each as x + 4 hex digits.
        (MY, True, "ciudadx0020x00f1", "x002fzonax0020unoxffffcochex0020x00f1xffffCoche"),
        (PG, True, "ciudadx0020x00f1", "x002fzonax0020unoxffffcochex0020x00f1xffffx0043oche"),
    ],
)
def test_spaces_and_unicode_in_every_part(dialect: Dialect, encoding: bool, db: str, table: str) -> None:
    c = cfg(dialect, E, encoding)
    assert (db_name("ciudad ñ", c), table_name("/zona uno", "coche ñ", "Coche", c)) == (db, table)
