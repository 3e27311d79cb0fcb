"""``ngsi-assets config import-cygnus agent.conf``: a Cygnus agent configuration as this platform's settings.

Cygnus is configured by a Flume agent file (Java properties): ``<agent>.sinks = a b c`` lists the
active sinks, ``<agent>.sinks.<name>.type`` names each sink's class and ``<agent>.sinks.<name>.<param>``
its parameters; ``<agent>.sources.<name>.handler.*`` configure the HTTP receiver. This module reads
such a file (parsed with ``javaproperties``, so escapes, continuation lines and ``:`` separators
behave as in Java) and produces:

- the ``postgresql:`` and ``mysql:`` sections of ``NGSI_SQL_SINKS_CONFIG`` (``NGSIPostgreSQLSink`` or
  ``NGSIPostgisSink``, and ``NGSIMySQLSink``), with the connection parameters turned into a URL;
- ``NGSI_MONGO_URL`` and ``NGSI_STH_<PARAMETER>`` variables for ``NGSISTHSink``;
- ``NGSI_MONGO_RAW_ENABLED=true`` and ``NGSI_MONGO_RAW_<PARAMETER>`` variables for ``NGSIMongoSink``;
- the receiver's settings (port, default service and service path);
- every parameter that could not be carried over, and why.

A parameter absent from the file keeps this platform's default, except the connection parameters,
which take Cygnus's defaults (``localhost``, user ``root`` / ``postgres``, database ``postgres``), so
the import connects where Cygnus connected. Every section is validated with the same pydantic models
the platform loads; a value they refuse is left out and reported with the validator's message.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from ngsi_assets.ngsi.mongo_raw_config import ENV_PREFIX as RAW_ENV_PREFIX
from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sql_config import CONFIG_ENV, SqlSinkConfig
from ngsi_assets.ngsi.sql_naming import Dialect
from ngsi_assets.ngsi.sth_config import ENV_PREFIX, STHConfig

SINK_CLASS_PREFIX = "com.telefonica.iot.cygnus.sinks."
REST_HANDLER = "com.telefonica.iot.cygnus.handlers.NGSIRestHandler"

# Sink class -> (dialect, prefix of its connection parameters).
SQL_SINKS: dict[str, tuple[Dialect, str]] = {
    "NGSIPostgreSQLSink": (Dialect.POSTGRESQL, "postgresql_"),
    "NGSIPostgisSink": (Dialect.POSTGRESQL, "postgis_"),
    "NGSIMySQLSink": (Dialect.MYSQL, "mysql_"),
}
STH_SINK = "NGSISTHSink"
RAW_SINK = "NGSIMongoSink"

# Cygnus's connection defaults (NGSIMySQLSink / NGSIPostgreSQLSink / NGSIPostgisSink DEFAULT_*).
CONNECTION_DEFAULTS: dict[Dialect, dict[str, str]] = {
    Dialect.MYSQL: {"host": "localhost", "port": "3306", "username": "root", "password": ""},
    Dialect.POSTGRESQL: {
        "host": "localhost",
        "port": "5432",
        "username": "postgres",
        "password": "",
        "database": "postgres",
    },
}

# Parameters carried over under the same name (the platform keeps Cygnus's names).
SQL_PARAMETERS = (
    "data_model",
    "attr_persistence",
    "enable_encoding",
    "enable_lowercase",
    "last_data_mode",
    "last_data_table_suffix",
    "last_data_unique_key",
    "last_data_timestamp_key",
    "last_data_sql_timestamp_format",
    "batch_size",
    "batch_ttl",
    "batch_retry_intervals",
)
POLICY_PARAMETERS = ("persistence_policy.max_records", "persistence_policy.expiration_time")
STH_PARAMETERS = (
    "resolutions",
    "db_prefix",
    "collection_prefix",
    "data_model",
    "enable_encoding",
    "data_expiration",
    "ignore_white_spaces",
    "batch_size",
    "batch_timeout",
    "batch_ttl",
    "batch_retry_intervals",
)
RAW_PARAMETERS = (
    "db_prefix",
    "collection_prefix",
    "data_model",
    "enable_encoding",
    "attr_persistence",
    "attr_metadata_store",
    "collections_size",
    "max_documents",
    "data_expiration",
    "batch_size",
    "batch_timeout",
    "batch_ttl",
    "batch_retry_intervals",
)
MONGO_CONNECTION = ("mongo_hosts", "mongo_username", "mongo_password", "mongo_auth_source", "mongo_replica_set")

# Parameters this platform does not take, and why (keys without the connection prefix).
NOT_CARRIED: dict[str, str] = {
    "maxPoolSize": "no connection pool: each Spark task opens one connection for its table batches",
    "maxPoolIdle": "no connection pool: each Spark task opens one connection for its table batches",
    "minPoolIdle": "no connection pool: each Spark task opens one connection for its table batches",
    "minPoolIdleTimeMillis": "no connection pool: each Spark task opens one connection for its table batches",
    "options": "JDBC driver options have no psycopg2/pymysql equivalent; set what you need on the server",
    "batch_timeout": "runs are batch jobs started by the landing sensor: nothing waits for a batch to fill",
    "persistence_policy.checking_time": "capping and expiration run in every run that writes the table",
    "attr_native_types": "values are stored as text, as with Cygnus's default attr_native_types=false",
    "attr_metadata_store": "metadata is always stored (attrMd in row mode, <attr>_md columns in column mode)",
    "enable_name_mappings": "name mappings are not supported",
    "enable_grouping": "grouping rules are not supported (Cygnus deprecated them)",
    "persist_errors": "records that cannot be written go to the lake's *_rejects datasets instead",
    "max_latest_errors": "records that cannot be written go to the lake's *_rejects datasets instead",
    "backend.enable_cache": "no backend cache: table creation is idempotent DDL",
    "enable_geo_parse": "geometries are not computed: a PostGIS sink is imported as a PostgreSQL sink",
    "swap_coordinates": "geometries are not computed: a PostGIS sink is imported as a PostgreSQL sink",
    "should_hash": "hashed collection names are not supported (Cygnus removed them)",
    "enable_lowercase": "MongoDB names are not lower-cased",
    "collections_size": "STH collections are not capped",
    "max_documents": "STH collections are not capped",
    "mongo_ssl": "put tls=true (and tlsCAFile=...) in NGSI_MONGO_URL yourself",
    "mongo_ssl_invalid_host_allowed": "put tlsAllowInvalidHostnames=true in NGSI_MONGO_URL yourself",
    "mongo_ssl_keystore_path_file": "Java key stores are not read: use tlsCertificateKeyFile in NGSI_MONGO_URL",
    "mongo_ssl_keystore_password": "Java key stores are not read: use tlsCertificateKeyFile in NGSI_MONGO_URL",
    "mongo_ssl_truststore_path_file": "Java trust stores are not read: use tlsCAFile in NGSI_MONGO_URL",
    "mongo_ssl_truststore_password": "Java trust stores are not read: use tlsCAFile in NGSI_MONGO_URL",
}
STRUCTURAL = frozenset({"type", "channel"})
# Values of parameters in NOT_CARRIED that ask for what this platform does anyway: nothing to report.
SAME_BEHAVIOUR: dict[str, frozenset[str]] = {
    "enable_name_mappings": frozenset({"false"}),
    "enable_grouping": frozenset({"false"}),
    "attr_native_types": frozenset({"false"}),
    "attr_metadata_store": frozenset({"true"}),
    "enable_lowercase": frozenset({"false"}),
    "should_hash": frozenset({"false"}),
    "mongo_ssl": frozenset({"false"}),
    "mongo_ssl_invalid_host_allowed": frozenset({"false"}),
    "persist_errors": frozenset({"true", "false"}),
    "backend.enable_cache": frozenset({"false"}),
}


@dataclass(frozen=True)
class NotCarried:
    key: str  # the full property key
    reason: str


@dataclass
class CygnusImport:
    agent: str
    sql: dict[Dialect, dict[str, Any]] = field(default_factory=dict)  # sections of NGSI_SQL_SINKS_CONFIG
    sql_sink_names: dict[Dialect, str] = field(default_factory=dict)
    sth_env: dict[str, str] = field(default_factory=dict)  # NGSI_STH_* variables
    mongo_url: str | None = None
    sth_sink_name: str | None = None
    raw_env: dict[str, str] = field(default_factory=dict)  # NGSI_MONGO_RAW_* variables
    raw_sink_name: str | None = None
    receiver: dict[str, str] = field(default_factory=dict)  # port, default_service, default_service_path
    not_carried: list[NotCarried] = field(default_factory=list)


class CygnusImportError(ValueError):
    """The file is not a Cygnus agent configuration this command can read; the message says why."""


def read_properties(text: str) -> dict[str, str]:
    """A Java properties text as a dict (later keys win, as in java.util.Properties)."""
    import javaproperties

    try:
        return dict(javaproperties.loads(text))
    except Exception as exc:  # javaproperties raises ValueError subclasses on bad escapes
        raise CygnusImportError(f"not a Java properties file: {exc}") from exc


def agents_of(props: Mapping[str, str]) -> list[str]:
    """The agent names that declare sinks or sources (``<agent>.sinks.<name>.type``)."""
    names = set()
    for key in props:
        parts = key.split(".")
        if len(parts) >= 4 and parts[1] in ("sinks", "sources") and parts[3] == "type":
            names.add(parts[0])
    return sorted(names)


def _declared(props: Mapping[str, str], agent: str, kind: str) -> list[str]:
    """The components of ``kind`` (sinks, sources) in the order of ``<agent>.<kind>``, else in file order."""
    listed = props.get(f"{agent}.{kind}", "").split()
    if listed:
        return listed
    prefix = f"{agent}.{kind}."
    return [k[len(prefix) : -len(".type")] for k in props if k.startswith(prefix) and k.endswith(".type")]


def _params(props: Mapping[str, str], agent: str, kind: str, name: str) -> dict[str, str]:
    prefix = f"{agent}.{kind}.{name}."
    return {k[len(prefix) :]: v.strip() for k, v in props.items() if k.startswith(prefix)}


def _sql_url(dialect: Dialect, conn: Mapping[str, str]) -> str:
    user = quote(conn["username"], safe="")
    password = conn.get("password", "")
    login = f"{user}:{quote(password, safe='')}" if password else user
    database = quote(conn.get("database", ""), safe="")
    return f"{dialect.value}://{login}@{conn['host']}:{conn['port']}/{database}"


def _mongo_url(params: Mapping[str, str]) -> str:
    uri = params.get("mongo_uri", "")
    if uri:
        return uri
    hosts = params.get("mongo_hosts") or "localhost:27017"
    user = params.get("mongo_username", "")
    login = ""
    if user:
        login = quote(user, safe="")
        if params.get("mongo_password"):
            login += ":" + quote(params["mongo_password"], safe="")
        login += "@"
    options = (("authSource", "mongo_auth_source"), ("replicaSet", "mongo_replica_set"))
    query = {name: params[key] for name, key in options if params.get(key)}
    return f"mongodb://{login}{hosts}/" + (f"?{urlencode(query)}" if query else "")


def _validated(build: Any, values: dict[str, Any], keys: Mapping[str, str], out: CygnusImport) -> dict[str, Any]:  # noqa: ANN401
    """``values`` less every field ``build`` refuses, as the model typed them (``true``, not ``"true"``).

    Each refusal is reported against its property key.
    """
    values = dict(values)
    while True:
        try:
            typed = build(values).model_dump(mode="json")
            return {k: typed[k] for k in values}
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
            bad &= set(values) - {"dialect"}
            if not bad:
                # A rule across fields (say, collections_size without max_documents): drop the last
                # field whose removal satisfies it, reported with the rule's message.
                name = _culprit(build, values)
                if name is None:
                    raise CygnusImportError(f"the imported settings are refused: {exc}") from exc
                reason = f"refused by this platform: {exc.errors()[0]['msg']}"
                out.not_carried.append(NotCarried(keys.get(name, name), reason))
                values.pop(name)
                continue
            for err in exc.errors():
                name = str(err["loc"][0]) if err["loc"] else ""
                if name in bad:
                    out.not_carried.append(NotCarried(keys.get(name, name), f"refused by this platform: {err['msg']}"))
            for name in bad:
                values.pop(name)


def _culprit(build: Any, values: dict[str, Any]) -> str | None:  # noqa: ANN401
    for name in reversed([n for n in values if n != "dialect"]):
        try:
            build({k: v for k, v in values.items() if k != name})
        except ValidationError:
            continue
        return name
    return None


def _not_carried(out: CygnusImport, key: str, param: str, value: str) -> None:
    if value.strip().lower() not in SAME_BEHAVIOUR.get(param, frozenset()):
        out.not_carried.append(NotCarried(key, NOT_CARRIED[param]))


def _url_problem(dialect: Dialect, url: str) -> str | None:
    """Why the platform's SQL resource would refuse ``url`` (None: it accepts it)."""
    from resources.sql import MySQLResource, PostgresResource

    resource = PostgresResource if dialect is Dialect.POSTGRESQL else MySQLResource
    try:
        resource(url=url).connect_kwargs()
    except (ValueError, ValidationError) as exc:
        return " ".join(str(exc).split())
    return None


def _import_sql(
    out: CygnusImport, props: Mapping[str, str], agent: str, name: str, cls: str, defaults: Mapping[str, str]
) -> None:
    dialect, prefix = SQL_SINKS[cls]
    key = f"{agent}.sinks.{name}."
    if dialect in out.sql:
        out.not_carried.append(
            NotCarried(
                f"{key}type",
                f"a second {dialect.value} sink ({cls}); this platform has one {dialect.value} sink, "
                f"imported from {out.sql_sink_names[dialect]!r}",
            )
        )
        return
    params = _params(props, agent, "sinks", name)
    conn = dict(CONNECTION_DEFAULTS[dialect])
    values: dict[str, Any] = {"dialect": dialect.value, **defaults}
    keys: dict[str, str] = {}
    for param, value in params.items():
        if param in STRUCTURAL:
            continue
        bare = param[len(prefix) :] if param.startswith(prefix) else None
        if bare in ("host", "port", "username", "password", "database"):
            if value or bare == "password":
                conn[bare] = value
            else:
                # Cygnus would connect with an empty user (or host): nothing to connect with here.
                out.not_carried.append(
                    NotCarried(key + param, f"empty: used Cygnus's default {conn[bare]!r}; put the real one in the url")
                )
        elif param in SQL_PARAMETERS:
            values[param] = value
            keys[param] = key + param
        elif param in POLICY_PARAMETERS:
            policy = values.setdefault("persistence_policy", {})
            # Cygnus's -1 (its default) means off, which is 0 here.
            policy[param.split(".", 1)[1]] = max(int(value), 0) if value.lstrip("-").isdigit() else value
            keys["persistence_policy"] = key + param
        elif (bare or param) in NOT_CARRIED:
            _not_carried(out, key + param, bare or param, value)
        else:
            out.not_carried.append(NotCarried(key + param, f"not a parameter of Cygnus's {cls} this platform knows"))
    if cls == "NGSIPostgisSink":
        out.not_carried.append(
            NotCarried(f"{key}type", "NGSIPostgisSink imported as a PostgreSQL sink: no geometry columns")
        )
    url = _sql_url(dialect, conn)
    problem = _url_problem(dialect, url)
    if problem is None:
        values["url"] = url
    else:
        out.not_carried.append(NotCarried(f"{key}{prefix}host", f"no usable connection URL: {problem}"))
    section = _validated(lambda v: SqlSinkConfig(**v), values, keys, out)
    section.pop("dialect")
    out.sql[dialect] = section
    out.sql_sink_names[dialect] = name


@dataclass(frozen=True)
class _MongoSink:
    """One of Cygnus's MongoDB sinks: its class, the parameters carried over, its model and variables."""

    cls: str
    parameters: tuple[str, ...]
    model: Any  # the pydantic model the platform loads (STHConfig, MongoRawConfig)
    env_prefix: str
    enabled_env: dict[str, str]


MONGO_SINKS = {
    STH_SINK: _MongoSink(STH_SINK, STH_PARAMETERS, STHConfig, ENV_PREFIX, {}),
    RAW_SINK: _MongoSink(
        RAW_SINK, RAW_PARAMETERS, MongoRawConfig, RAW_ENV_PREFIX, {RAW_ENV_PREFIX + "ENABLED": "true"}
    ),
}


def _import_mongo(out: CygnusImport, props: Mapping[str, str], agent: str, name: str, sink: _MongoSink) -> None:
    key = f"{agent}.sinks.{name}."
    taken = out.sth_sink_name if sink.cls == STH_SINK else out.raw_sink_name
    if taken is not None:
        out.not_carried.append(NotCarried(f"{key}type", f"a second {sink.cls}; imported only {taken!r}"))
        return
    params = _params(props, agent, "sinks", name)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for param, value in params.items():
        if param in STRUCTURAL or param in MONGO_CONNECTION or param == "mongo_uri":
            continue
        if param in sink.parameters:
            values[param] = value
            keys[param] = key + param
        elif param in NOT_CARRIED:
            _not_carried(out, key + param, param, value)
        else:
            reason = f"not a parameter of Cygnus's {sink.cls} this platform knows"
            out.not_carried.append(NotCarried(key + param, reason))
    typed = _validated(sink.model.model_validate, values, keys, out)
    env = {**sink.enabled_env, **{sink.env_prefix + k.upper(): _env_value(v) for k, v in typed.items()}}
    url = _mongo_url(params)
    if out.mongo_url is not None and url != out.mongo_url:
        out.not_carried.append(
            NotCarried(key + "mongo_hosts", f"a second MongoDB server; both MongoDB sinks use {out.mongo_url!r}")
        )
    else:
        out.mongo_url = url
    if sink.cls == STH_SINK:
        out.sth_env, out.sth_sink_name = env, name
    else:
        out.raw_env, out.raw_sink_name = env, name


def _env_value(value: Any) -> str:  # noqa: ANN401
    """A typed setting as the NGSI_STH_* variable spells it (lists comma-separated, booleans lower case)."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def import_agent_conf(text: str, agent: str | None = None) -> CygnusImport:
    """Read a Cygnus agent configuration; ``agent`` picks one when the file configures several."""
    props = read_properties(text)
    agents = agents_of(props)
    if not agents:
        raise CygnusImportError("no Flume agent with sinks or sources (no '<agent>.sinks.<name>.type' key)")
    if agent is None:
        if len(agents) > 1:
            raise CygnusImportError(f"the file configures several agents {agents}: choose one with --agent")
        agent = agents[0]
    elif agent not in agents:
        raise CygnusImportError(f"no agent {agent!r} in the file; it configures {agents}")
    out = CygnusImport(agent=agent)

    defaults: dict[str, str] = {}
    for source in _declared(props, agent, "sources"):
        params = _params(props, agent, "sources", source)
        if params.get("handler") != REST_HANDLER:
            continue
        if out.receiver:
            out.not_carried.append(
                NotCarried(f"{agent}.sources.{source}.handler", "a second NGSIRestHandler source; one receiver")
            )
            continue
        out.receiver = {
            "port": params.get("port", "5050"),
            "notification_target": params.get("handler.notification_target", "/notify"),
            "default_service": params.get("handler.default_service", "default"),
            "default_service_path": params.get("handler.default_service_path", "/"),
        }
        defaults = {k: out.receiver[k] for k in ("default_service", "default_service_path")}
        for param in params:
            if param.startswith("interceptors.") and param.endswith(".type") and "NameMappings" in params[param]:
                reason = NOT_CARRIED["enable_name_mappings"]
                out.not_carried.append(NotCarried(f"{agent}.sources.{source}.{param}", reason))

    sinks = _declared(props, agent, "sinks")
    configured = {k.split(".")[2] for k in props if k.startswith(f"{agent}.sinks.") and k.count(".") >= 3}
    for name in sorted(configured - set(sinks)):
        keys = sorted(k for k in props if k.startswith(f"{agent}.sinks.{name}."))
        out.not_carried.append(
            NotCarried(keys[0], f"configures sink {name!r}, which {agent}.sinks does not list (a typo?)")
        )
    for name in sinks:
        cls_full = props.get(f"{agent}.sinks.{name}.type", "")
        cls = cls_full.removeprefix(SINK_CLASS_PREFIX).strip()
        if cls in SQL_SINKS:
            _import_sql(out, props, agent, name, cls, defaults)
        elif cls in MONGO_SINKS:
            _import_mongo(out, props, agent, name, MONGO_SINKS[cls])
        elif not cls_full:
            out.not_carried.append(NotCarried(f"{agent}.sinks.{name}.type", "listed sink with no type"))
        else:
            reason = f"{cls} has no counterpart in this platform"
            out.not_carried.append(NotCarried(f"{agent}.sinks.{name}.type", reason))
    return out


def sql_yaml(result: CygnusImport) -> str:
    import yaml

    sections = {d.value: result.sql[d] for d in sorted(result.sql)}
    return yaml.safe_dump(sections, sort_keys=False, default_flow_style=False)


def env_lines(result: CygnusImport, sql_path: Path | None) -> list[str]:
    """``NAME=value`` lines a POSIX shell can source (``set -a; . ngsi.env``): values are shell-quoted,
    so a URL's ``&`` or a password's ``$`` stays part of the value."""
    values: list[tuple[str, str]] = []
    if result.sql and sql_path is not None:
        values.append((CONFIG_ENV, str(sql_path)))
    if result.mongo_url:
        values.append(("NGSI_MONGO_URL", result.mongo_url))
    values += sorted(result.sth_env.items())
    values += sorted(result.raw_env.items())
    return [f"{k}={shlex.quote(v)}" for k, v in values]


def write_outputs(result: CygnusImport, out_dir: Path) -> list[Path]:
    """``sql_sinks.yaml`` and ``ngsi.env`` in ``out_dir`` (mode 0600: they hold passwords)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    sql_path = None
    if result.sql:
        sql_path = (out_dir / "sql_sinks.yaml").resolve()
        _write_private(sql_path, sql_yaml(result))
        written.append(sql_path)
    env_path = out_dir / "ngsi.env"
    _write_private(env_path, "\n".join(env_lines(result, sql_path)) + "\n")
    written.append(env_path)
    return written


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def report(result: CygnusImport) -> list[str]:
    lines = [f"agent {result.agent!r}"]
    for dialect in sorted(result.sql):
        lines.append(f"  {dialect.value}: imported from sink {result.sql_sink_names[dialect]!r}")
    if result.sth_sink_name:
        lines.append(f"  STH: imported from sink {result.sth_sink_name!r}")
    if result.raw_sink_name:
        lines.append(f"  raw MongoDB history: imported from sink {result.raw_sink_name!r}")
    if result.receiver:
        r = result.receiver
        lines.append(
            f"  receiver: ngsi-assets serve --port {r['port']} --default-service {r['default_service']} "
            f"--default-service-path {r['default_service_path']}  (notifications to {r['notification_target']})"
        )
    if result.not_carried:
        lines.append(f"not carried over ({len(result.not_carried)}):")
        lines += [f"  {n.key}: {n.reason}" for n in result.not_carried]
    else:
        lines.append("every parameter was carried over")
    return lines


def configure(parser: Any) -> None:  # noqa: ANN401 (argparse.ArgumentParser)
    parser.add_argument("agent_conf", type=Path, help="a Cygnus agent configuration (agent.conf)")
    parser.add_argument("--agent", default=None, help="the agent to import when the file configures several")
    parser.add_argument(
        "--output", type=Path, default=None, help="write sql_sinks.yaml and ngsi.env here (default: print them)"
    )


def run(args: Any) -> int:  # noqa: ANN401 (argparse.Namespace)
    import sys

    try:
        result = import_agent_conf(args.agent_conf.read_text(encoding="utf-8"), args.agent)
    except (OSError, CygnusImportError) as exc:
        print(f"import-cygnus: {args.agent_conf}: {exc}", file=sys.stderr)
        return 2
    if args.output is not None:
        for path in write_outputs(result, args.output):
            print(f"wrote {path}")
    else:
        if result.sql:
            print(f"# sql_sinks.yaml (point {CONFIG_ENV} at it)")
            print(sql_yaml(result), end="")
        print("# environment")
        print("\n".join(env_lines(result, Path("sql_sinks.yaml") if result.sql else None)))
    print("\n".join(report(result)))
    return 0
