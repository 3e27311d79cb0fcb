"""Connection-level resource for the MongoDB sink (STH aggregates): one pymongo client per use.

``client()`` opens a ``MongoClient`` with bounded timeouts, checks that the server answers (and accepts
the login) before handing the client out, and closes it at the end of the block. Failures raise
``MongoConnectionError`` naming the server (never the password) and the reason.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from dagster import ConfigurableResource, EnvVar
from pydantic import ConfigDict, Field, model_validator
from pymongo import MongoClient
from pymongo.database import Database
from pymongo.errors import ConfigurationError, OperationFailure, PyMongoError
from pymongo.uri_parser import parse_uri

from ngsi_assets.ngsi.sth_naming import LEGACY_NAMESPACE_BYTES, MAX_NAMESPACE_BYTES

_EXAMPLE = "mongodb://user:password@host:27017/database"
_AUTH_FAILED = 18


class MongoConnectionError(ConnectionError):
    """A MongoDB server could not be reached, or refused the login."""


def _masked(url: str) -> str:
    """``url`` with any password replaced by ``***``, for error messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, _, hosts = rest.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hosts}" if ":" in userinfo else url


def check_mongo_url(url: str) -> None:
    """Raise ValueError saying what is wrong with ``url`` (a ``mongodb://`` or ``mongodb+srv://`` URL)."""
    shown = _masked(url)
    scheme = url.partition("://")[0].lower()
    if scheme not in ("mongodb", "mongodb+srv"):
        raise ValueError(f"MongoDB URL {shown!r} must start with mongodb:// or mongodb+srv:// (like {_EXAMPLE})")
    if scheme == "mongodb+srv":
        # Full validation of an SRV URL resolves DNS; leave that to the first connection.
        if not urlsplit(url).hostname:
            raise ValueError(f"MongoDB URL {shown!r} names no host (like {_EXAMPLE})")
        return
    try:
        parse_uri(url)
    except (ConfigurationError, ValueError) as exc:
        raise ValueError(f"invalid MongoDB URL {shown!r}: {exc} (expected like {_EXAMPLE})") from exc


# MongoDB 4.4 raised the namespace limit from 120 bytes to 255 (Cygnus and STH-Comet use 113).
MODERN_NAMESPACES = (4, 4)


def namespace_limit(client: MongoClient[dict[str, Any]]) -> int:
    """The longest ``database.collection`` (UTF-8 bytes) the server behind ``client`` takes, by its version."""
    info = client.admin.command("buildInfo")
    version = tuple(int(v) for v in (info.get("versionArray") or [])[:2])
    if not version:
        version = tuple(int(p) for p in re.findall(r"\d+", str(info.get("version", "")))[:2])
    return MAX_NAMESPACE_BYTES if version >= MODERN_NAMESPACES else LEGACY_NAMESPACE_BYTES


def with_server_limit(config: Any, url: str) -> Any:
    """``config`` (an STH or raw sink configuration) with ``max_namespace_bytes`` of the server at ``url``,
    unless the user set it. Connects either way: an unreachable server raises MongoConnectionError."""
    with MongoResource(url=url).client() as client:
        if config.max_namespace_bytes is not None:
            return config
        return config.model_copy(update={"max_namespace_bytes": namespace_limit(client)})


class MongoResource(ConfigurableResource):
    """A MongoDB deployment reached through pymongo; times are returned timezone-aware (UTC)."""

    # The URL may carry a password: keep it out of reprs and validation errors.
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str = Field(repr=False, description=f"Connection URL, like {_EXAMPLE}.")
    database: str | None = Field(default=None, description="Database to use; defaults to the one in the URL's path.")
    server_selection_timeout_ms: int = Field(
        default=10_000, ge=1, description="How long to wait for a usable server before failing."
    )
    connect_timeout_ms: int = Field(default=10_000, ge=1, description="TCP connect timeout.")
    socket_timeout_ms: int = Field(
        default=300_000, ge=1, description="How long one operation may wait for a reply (large bulk writes)."
    )
    app_name: str = Field(default="ngsi-assets", description="Shown in the server's logs and currentOp.")

    @model_validator(mode="before")
    @classmethod
    def _check_url(cls, data: Any) -> Any:
        # Runs on the raw input, where an EnvVar is still an EnvVar; a URL from the environment is
        # checked when Dagster builds the resource for a run.
        if isinstance(data, dict):
            url = data.get("url")
            if isinstance(url, str) and not isinstance(url, EnvVar):
                check_mongo_url(url)
        return data

    @property
    def database_name(self) -> str | None:
        """``database``, else the database in the URL's path, else None."""
        if self.database:
            return self.database
        path = urlsplit(self.url).path.lstrip("/")
        return unquote(path) or None

    def _describe(self) -> str:
        parts = urlsplit(self.url)
        user = f"{unquote(parts.username)}@" if parts.username else ""
        return f"{user}{parts.netloc.rpartition('@')[2]}"

    @contextlib.contextmanager
    def client(self) -> Iterator[MongoClient[dict[str, Any]]]:
        """A connected client (the server has answered a ping); closed when the block ends."""
        client: MongoClient[dict[str, Any]] = MongoClient(
            self.url,
            serverSelectionTimeoutMS=self.server_selection_timeout_ms,
            connectTimeoutMS=self.connect_timeout_ms,
            socketTimeoutMS=self.socket_timeout_ms,
            appname=self.app_name,
            tz_aware=True,
            uuidRepresentation="standard",
        )
        try:
            try:
                client.admin.command("ping")
            except OperationFailure as exc:
                errmsg = (exc.details or {}).get("errmsg") or str(exc)
                reason = "authentication failed" if exc.code == _AUTH_FAILED else errmsg
                raise MongoConnectionError(f"MongoDB at {self._describe()} refused the connection: {reason}") from exc
            except PyMongoError as exc:
                # pymongo appends its timeout settings and topology; the first part is the reason.
                reason = re.split(r" \(configured timeouts|, Timeout:", str(exc))[0]
                raise MongoConnectionError(
                    f"cannot reach MongoDB at {self._describe()} within {self.server_selection_timeout_ms} ms: {reason}"
                ) from exc
            yield client
        finally:
            client.close()

    def get_database(self, client: MongoClient[dict[str, Any]]) -> Database[dict[str, Any]]:
        """The configured database on ``client``; a ValueError if neither config nor URL names one."""
        name = self.database_name
        if name is None:
            raise ValueError(f"MongoResource: no database configured; set database or put it in the URL ({_EXAMPLE})")
        return client[name]
