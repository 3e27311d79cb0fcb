"""``ngsi-assets config import-cygnus``: Cygnus agent configurations to this platform's settings, and back
through the platform's own loaders."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from ngsi_assets.cli import main
from ngsi_assets.cygnus_import import CygnusImportError, import_agent_conf, write_outputs
from ngsi_assets.ngsi.sql_config import AttrPersistence, LastDataMode, load_sink_configs
from ngsi_assets.ngsi.sql_naming import DataModel, Dialect
from ngsi_assets.ngsi.sth_config import Resolution, STHConfig
from resources.mongo_raw import MongoRawSinkResource
from resources.sth_mongo import STHSinkResource

FIXTURES = Path(__file__).parent / "fixtures" / "cygnus"


def _load(name: str, agent: str | None = None):  # noqa: ANN202
    return import_agent_conf((FIXTURES / name).read_text(), agent)


def _env_file(path: Path) -> dict[str, str]:
    """The variables a POSIX shell gets from ``set -a; . ngsi.env``."""
    script = f"set -a; . {shlex.quote(str(path))}; env -0"
    out = subprocess.run(["sh", "-c", script], env={}, capture_output=True, check=True).stdout.decode()
    return dict(
        item.split("=", 1) for item in out.split("\0") if item and not item.startswith(("PWD=", "SHLVL=", "_="))
    )


def test_documentation_examples_carry_every_sink_parameter_the_platform_has(tmp_path: Path) -> None:
    result = _load("doc_examples.conf")
    assert result.agent == "cygnus-ngsi"
    assert result.sql[Dialect.MYSQL] == {
        "default_service": "def_serv",
        "default_service_path": "/def_servpath",
        "enable_encoding": False,
        "enable_lowercase": False,
        "data_model": "dm-by-entity",
        "attr_persistence": "row",
        "batch_size": 100,
        "batch_ttl": 10,
        "batch_retry_intervals": [5000],
        "persistence_policy": {"max_records": 5, "expiration_time": 86400},
        "url": "mysql://myuser:mypassword@192.168.80.34:3306/",
    }
    assert result.sql[Dialect.POSTGRESQL]["url"] == "postgresql://myuser:mypassword@192.168.80.34:5432/mydatabase"
    assert result.mongo_url == "mongodb://myuser:mypassword@192.168.80.34:27017/?authSource=admin&replicaSet=replica"
    assert result.sth_env["NGSI_STH_RESOLUTIONS"] == "month,day"
    assert result.sth_env["NGSI_STH_DB_PREFIX"] == "cygnus_"
    assert result.receiver == {
        "port": "5050",
        "notification_target": "/notify",
        "default_service": "def_serv",
        "default_service_path": "/def_servpath",
    }
    reasons = {n.key: n.reason for n in result.not_carried}
    assert set(reasons) == {
        # the documentation's own slip: a parameter of a sink named "postgresql", which is not declared
        "cygnus-ngsi.sinks.postgresql.backend.enable_cache",
        *(f"cygnus-ngsi.sinks.{d}-sink.{d}_{p}" for d in ("mysql", "postgresql")
          for p in ("maxPoolSize", "maxPoolIdle", "minPoolIdle", "minPoolIdleTimeMillis", "options")),
        "cygnus-ngsi.sinks.mysql-sink.batch_timeout",
        "cygnus-ngsi.sinks.postgresql-sink.batch_timeout",
        "cygnus-ngsi.sinks.mysql-sink.persistence_policy.checking_time",
    }  # fmt: skip
    assert "a typo?" in reasons["cygnus-ngsi.sinks.postgresql.backend.enable_cache"]
    # Values that ask for what the platform does anyway are not reported: enable_name_mappings=false,
    # attr_native_types=false, persist_errors, the STH sink's enable_lowercase=false.
    assert not any(k.endswith(("enable_name_mappings", "attr_native_types", "persist_errors")) for k in reasons)

    # The files written load back through the platform's own loaders.
    sql_path, env_path = write_outputs(result, tmp_path / "out")
    env = _env_file(env_path)
    assert env["NGSI_SQL_SINKS_CONFIG"] == str(sql_path)
    configs = load_sink_configs(env)
    mysql = configs[Dialect.MYSQL]
    assert (mysql.batch_size, mysql.persistence_policy.max_records, mysql.default_service) == (100, 5, "def_serv")
    assert configs[Dialect.POSTGRESQL].attr_persistence is AttrPersistence.ROW
    sth = STHConfig.from_env(env)
    assert (sth.resolutions, sth.db_prefix, sth.collection_prefix) == (
        (Resolution.MONTH, Resolution.DAY), "cygnus_", "cygnus_",
    )  # fmt: skip
    assert STHSinkResource.from_env(env).mongo_url == result.mongo_url
    for path in (sql_path, env_path):  # they hold passwords
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_docker_image_agent_defaults_empty_users_and_reports_what_has_no_counterpart() -> None:
    result = _load("docker_agent.conf")
    assert result.sql[Dialect.MYSQL]["url"] == "mysql://root@iot-mysql:3306/"
    assert result.sql[Dialect.POSTGRESQL]["url"] == "postgresql://postgres@iot-postgresql:5432/postgres"
    assert result.sql_sink_names == {Dialect.MYSQL: "mysql-sink", Dialect.POSTGRESQL: "postgresql-sink"}
    assert result.mongo_url == "mongodb://iot-mongo:27017/"
    assert result.sth_env == {}  # nothing but the connection: every STH parameter keeps its default
    assert result.raw_env == {"NGSI_MONGO_RAW_ENABLED": "true"}  # NGSIMongoSink: on, with Cygnus's defaults
    reasons = {n.key: n.reason for n in result.not_carried}
    assert reasons == {
        "cygnus-ngsi.sources.http-source.interceptors.nmi.type": "name mappings are not supported",
        "cygnus-ngsi.sinks.mysql-sink.mysql_username": (
            "empty: used Cygnus's default 'root'; put the real one in the url"
        ),
        "cygnus-ngsi.sinks.postgresql-sink.postgresql_username": (
            "empty: used Cygnus's default 'postgres'; put the real one in the url"
        ),
        "cygnus-ngsi.sinks.sth-sink.collections_size": "STH collections are not capped",
        "cygnus-ngsi.sinks.ckan-sink.type": "NGSICKANSink has no counterpart in this platform",
        "cygnus-ngsi.sinks.postgis-sink.type": (
            "a second postgresql sink (NGSIPostgisSink); this platform has one postgresql sink, imported from "
            "'postgresql-sink'"
        ),
    }


def test_last_data_agent_postgis_as_postgresql_and_refused_values_named() -> None:
    result = _load("last_data_agent.conf", agent="cygnusagent")
    pg = result.sql[Dialect.POSTGRESQL]
    # A password with URL metacharacters is percent-encoded, so the URL parses back to it.
    assert pg["url"] == "postgresql://cygnus:p%40ss%3Aword%2F1@gis.example.org:5433/city"
    assert (pg["data_model"], pg["attr_persistence"], pg["last_data_mode"], pg["last_data_table_suffix"]) == (
        "dm-by-entity-type", "column", "both", "_lastdata",
    )  # fmt: skip
    assert pg["persistence_policy"] == {"max_records": 0, "expiration_time": 0}  # Cygnus's -1: off
    assert pg["default_service"] == "smart-city"
    assert (pg["last_data_timestamp_key"], pg["last_data_sql_timestamp_format"]) == (
        "TimeInstant", 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"',
    )  # fmt: skip
    mysql = result.sql[Dialect.MYSQL]
    assert "data_model" not in mysql and "batch_ttl" not in mysql
    assert (mysql["attr_persistence"], mysql["last_data_mode"]) == ("column", "upsert")
    reasons = {n.key: n.reason for n in result.not_carried}
    assert reasons["cygnusagent.sinks.mysql-sink.data_model"].startswith("refused by this platform: Input should be")
    assert reasons["cygnusagent.sinks.mysql-sink.batch_ttl"].startswith(
        "refused by this platform: Input should be a valid integer"
    )
    # A format Spark could not read as MySQL does is refused with the specifier named.
    assert "unsupported specifier %z" in reasons["cygnusagent.sinks.mysql-sink.last_data_sql_timestamp_format"]
    assert reasons["cygnusagent.sinks.mysql-sink.colour"] == (
        "not a parameter of Cygnus's NGSIMySQLSink this platform knows"
    )
    assert reasons["cygnusagent.sinks.postgis-sink.type"] == (
        "NGSIPostgisSink imported as a PostgreSQL sink: no geometry columns"
    )
    assert "cygnusagent.sinks.postgis-sink.enable_geo_parse" in reasons
    cfg = load_sink_configs({"NGSI_POSTGRES_URL": pg["url"]})[Dialect.POSTGRESQL]  # the URL is one the platform accepts
    assert cfg.url == pg["url"]
    assert DataModel(pg["data_model"]) is DataModel.BY_ENTITY_TYPE
    assert LastDataMode(pg["last_data_mode"]) is LastDataMode.BOTH


def test_mongo_sink_parameters_load_back_and_refused_values_are_named(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "a.sinks = raw sth",
            "a.sinks.raw.type = com.telefonica.iot.cygnus.sinks.NGSIMongoSink",
            "a.sinks.raw.mongo_hosts = mongo:27017",
            "a.sinks.raw.data_model = dm-by-service-path",
            "a.sinks.raw.attr_persistence = column",
            "a.sinks.raw.attr_metadata_store = true",
            "a.sinks.raw.collections_size = 1048576",
            "a.sinks.raw.max_documents = 1000",
            "a.sinks.raw.db_prefix = raw_",
            "a.sinks.raw.enable_lowercase = true",
            "a.sinks.sth.type = com.telefonica.iot.cygnus.sinks.NGSISTHSink",
            "a.sinks.sth.mongo_hosts = other:27017",
        ]
    )
    result = import_agent_conf(text)
    assert result.raw_sink_name == "raw"
    assert result.mongo_url == "mongodb://mongo:27017/"
    reasons = {n.key: n.reason for n in result.not_carried}
    assert reasons == {
        "a.sinks.raw.enable_lowercase": "MongoDB names are not lower-cased",
        "a.sinks.sth.mongo_hosts": "a second MongoDB server; both MongoDB sinks use 'mongodb://mongo:27017/'",
    }
    (env_path,) = write_outputs(result, tmp_path / "out")  # no SQL sink: no sql_sinks.yaml
    env = _env_file(env_path)
    sink = MongoRawSinkResource.from_env(env)
    assert sink.enabled and sink.mongo_url == "mongodb://mongo:27017/"
    config = sink.raw_config()
    assert (config.data_model.value, config.attr_persistence.value, config.attr_metadata_store) == (
        "dm-by-service-path", "column", True,
    )  # fmt: skip
    assert (config.capped, config.collections_size, config.max_documents, config.db_prefix) == (
        True,
        1048576,
        1000,
        "raw_",
    )

    refused = import_agent_conf(text.replace("a.sinks.raw.max_documents = 1000", ""))
    reasons = {n.key: n.reason for n in refused.not_carried}
    assert reasons["a.sinks.raw.collections_size"].startswith(
        "refused by this platform: Value error, collections_size and max_documents must be set together"
    )
    assert "NGSI_MONGO_RAW_COLLECTIONS_SIZE" not in refused.raw_env
    assert refused.raw_env["NGSI_MONGO_RAW_DB_PREFIX"] == "raw_"


def test_java_properties_syntax_is_read_as_java_reads_it() -> None:
    text = "\n".join(
        [
            "! a comment",
            "a.sinks = s",
            "a.sinks.s.type : com.telefonica.iot.cygnus.sinks.NGSIMySQLSink",
            "a.sinks.s.mysql_host = db.\\",
            "    example.org",
            "a.sinks.s.mysql_username=us\\u00e9r",
            "a.sinks.s.mysql_password   pass word",
        ]
    )
    result = import_agent_conf(text)
    assert result.sql[Dialect.MYSQL]["url"] == "mysql://us%C3%A9r:pass%20word@db.example.org:3306/"


@pytest.mark.parametrize(
    ("text", "agent", "message"),
    [
        ("just = text\nno = agent", None, "no Flume agent with sinks or sources"),
        ((FIXTURES / "last_data_agent.conf").read_text(), None, "several agents ['cygnusagent', 'other-agent']"),
        ((FIXTURES / "docker_agent.conf").read_text(), "cygnusagent", "no agent 'cygnusagent' in the file"),
    ],
)
def test_files_that_cannot_be_imported_say_why(text: str, agent: str | None, message: str) -> None:
    with pytest.raises(CygnusImportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        import_agent_conf(text, agent)


def test_cli_writes_the_files_and_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imported"
    assert main(["config", "import-cygnus", str(FIXTURES / "docker_agent.conf"), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {(out / 'sql_sinks.yaml').resolve()}" in printed
    assert "not carried over (6):" in printed
    assert "raw MongoDB history: imported from sink 'mongo-sink'" in printed
    assert _env_file(out / "ngsi.env")["NGSI_MONGO_URL"] == "mongodb://iot-mongo:27017/"
    assert main(["config", "import-cygnus", str(tmp_path / "missing.conf")]) == 2
    assert "missing.conf" in capsys.readouterr().err
    assert main(["config", "import-cygnus", str(FIXTURES / "last_data_agent.conf")]) == 2
    assert "choose one with --agent" in capsys.readouterr().err


def test_connection_parameters_the_platform_cannot_use_are_reported_not_crashed_on() -> None:
    text = "\n".join(
        [
            "a.sinks = s",
            "a.sinks.s.type = com.telefonica.iot.cygnus.sinks.NGSIPostgreSQLSink",
            "a.sinks.s.postgresql_host = db.example.org",
            "a.sinks.s.postgresql_port = not-a-port",
        ]
    )
    result = import_agent_conf(text)
    assert "url" not in result.sql[Dialect.POSTGRESQL]  # the section loads, as a sink with no server
    (note,) = result.not_carried
    assert note.key == "a.sinks.s.postgresql_host"
    assert note.reason.startswith("no usable connection URL: ")
    assert "not-a-port" in note.reason
