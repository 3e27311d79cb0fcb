"""``ngsi-assets sth-api``: STH-Comet's HTTP read API over the STH aggregates and the raw collections.

Routes (``lib/server/sthServer.js`` in telefonicaid/fiware-sth-comet):

- ``GET /STH/v1/contextEntities/type/{entityType}/id/{entityId}/attributes/{attrName}``
- ``GET /STH/v2/entities/{entityId}/attrs/{attrName}?type=...``
- ``GET /version``; anything else is STH-Comet's 404.

Validation, filters and bodies are in :mod:`ngsi_assets.ngsi.sth_query`; this module only reads
MongoDB (``pymongo.AsyncMongoClient``) and answers. Aggregated queries read the collections the
``sth_aggregates`` asset writes (``NGSI_STH_*`` naming), raw queries those of ``mongo_raw``
(``NGSI_MONGO_RAW_*`` naming): each is named with its own sink's configuration. Every query is a
``find`` on the data model's fields sorted by time, which the sinks' indexes (``cyg_agg_opt``,
``sth_raw_query``) serve, with a limit for raw pages; a CSV export streams its cursor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

from aiohttp import web
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from ngsi_assets.ngsi.mongo_raw_config import MongoRawConfig
from ngsi_assets.ngsi.sth_config import STHConfig
from ngsi_assets.ngsi.sth_naming import STHNameError, sth_names
from ngsi_assets.ngsi.sth_query import (
    DEFAULT_MAX_PAGE_SIZE,
    RAW_PROJECTION,
    Query,
    QueryError,
    aggregated_filter,
    aggregated_projection,
    aggregated_values,
    csv_header,
    csv_line,
    error_body,
    ngsi_payload,
    not_found_body,
    parse_query,
    raw_filter,
    raw_plan,
    raw_values,
    to_json,
)

DEFAULT_PORT = 8666  # STH-Comet's
MONGO_URL_ENV = "NGSI_MONGO_URL"
MAX_PAGE_SIZE_ENV = "NGSI_STH_API_MAX_PAGE_SIZE"
FILTER_OUT_EMPTY_ENV = "NGSI_STH_API_FILTER_OUT_EMPTY"
CORRELATOR = "Fiware-Correlator"
TOTAL_COUNT = "Fiware-Total-Count"
JSON_TYPE = "application/json; charset=utf-8"
_MONGO_KEY: web.AppKey[AsyncMongoClient] = web.AppKey("mongo", AsyncMongoClient)


@dataclass(frozen=True)
class ApiSettings:
    """What the API reads and how: the server, each sink's naming, STH-Comet's two options."""

    mongo_url: str
    sth: STHConfig = field(default_factory=STHConfig)
    raw: MongoRawConfig = field(default_factory=MongoRawConfig)
    max_page_size: int = DEFAULT_MAX_PAGE_SIZE
    filter_out_empty: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        env = os.environ if environ is None else environ
        url = env.get(MONGO_URL_ENV)
        if not url:
            raise ValueError(f"{MONGO_URL_ENV} is not set: the STH API reads MongoDB")
        page = env.get(MAX_PAGE_SIZE_ENV, str(DEFAULT_MAX_PAGE_SIZE))
        if not page.isdigit() or int(page) < 1:
            raise ValueError(f"{MAX_PAGE_SIZE_ENV}={page!r}: expected a positive integer")
        flag = env.get(FILTER_OUT_EMPTY_ENV, "true").strip().lower()
        if flag not in ("true", "false"):
            raise ValueError(f"{FILTER_OUT_EMPTY_ENV}={flag!r}: expected true or false")
        return cls(
            mongo_url=url,
            sth=STHConfig.from_env(env),
            raw=MongoRawConfig.from_env(env),
            max_page_size=int(page),
            filter_out_empty=flag == "true",
        )


def _package_version() -> str:
    try:
        return version("ngsi-assets")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "No version information available"


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=to_json(body), status=status, content_type="application/json", charset="utf-8", headers=headers
    )


def _correlator(request: web.Request) -> str:
    return request.headers.get(CORRELATOR) or str(uuid.uuid4())


class STHApi:
    """The request handlers, bound to the settings."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings

    def _collection(self, request: web.Request, query: Query, aggregated: bool) -> Any:
        config = self.settings.sth if aggregated else self.settings.raw.naming()
        names = sth_names(
            query.service,
            query.service_path,
            query.entity_id,
            query.entity_type or None,
            query.attr_name,
            config,
            aggregated=aggregated,
        )
        return request.app[_MONGO_KEY][names.database][names.collection]

    async def data(self, request: web.Request, version: int) -> web.StreamResponse:
        info = request.match_info
        try:
            query = parse_query(
                version,
                request.headers,  # case-insensitive, as HTTP header names are
                info["entityId"],
                info.get("entityType"),
                info["attrName"],
                list(request.query.items()),
                self.settings.max_page_size,
            )
            collection = self._collection(request, query, aggregated=not query.raw)
        except QueryError as exc:
            return _json(error_body(version, exc), 400)
        except STHNameError as exc:
            return _json(error_body(version, QueryError(str(exc), None)), 400)
        headers = {CORRELATOR: _correlator(request)}
        try:
            if query.raw:
                return await self._raw(request, query, collection, headers)
            return await self._aggregated(query, collection, headers)
        except PyMongoError:
            message = "MongoDB is not connected"
            if version == 2:
                return _json({"error": "InternalServerError", "description": message}, 500, headers)
            return _json({"statusCode": 500, "error": "Internal Server Error", "message": message}, 500, headers)

    async def _aggregated(self, query: Query, collection: Any, headers: dict[str, str]) -> web.Response:
        model = self.settings.sth.data_model
        cursor = collection.find(aggregated_filter(query, model), aggregated_projection(query)).sort("_id.origin", 1)
        documents = [doc async for doc in cursor]
        values = aggregated_values(documents, query, model, self.settings.filter_out_empty)
        return _json(ngsi_payload(query, values), headers=headers)

    async def _raw(
        self, request: web.Request, query: Query, collection: Any, headers: dict[str, str]
    ) -> web.StreamResponse:
        model = self.settings.raw.data_model
        cond = raw_filter(query, model)
        direction, skip, limit = raw_plan(query, self.settings.max_page_size)
        if query.count:
            headers[TOTAL_COUNT] = str(await collection.count_documents(cond))
        cursor = collection.find(cond, RAW_PROJECTION).sort("recvTime", direction).skip(skip).limit(limit)
        if query.filetype is not None and query.filetype.lower() == "csv":
            return await self._csv(request, query, cursor, headers)
        values = raw_values([doc async for doc in cursor], query)
        return _json(ngsi_payload(query, values), headers=headers)

    async def _csv(
        self, request: web.Request, query: Query, cursor: Any, headers: dict[str, str]
    ) -> web.StreamResponse:
        """Stream the documents as CSV (STH-Comet writes a temporary file and sends it as an attachment)."""
        documents = cursor if query.last_n is None else _reversed(cursor)
        stamp = int(datetime.now(UTC).timestamp() * 1000)
        response = web.StreamResponse(
            headers={
                **headers,
                "Content-Type": "text/csv; charset=utf-8",
                "Content-Disposition": f"attachment; filename*=utf-8''{_rfc5987(query.attr_name)}-{stamp}.csv",
            }
        )
        await response.prepare(request)
        await response.write(csv_header().encode())
        chunk: list[str] = []
        async for doc in documents:
            chunk.append(csv_line(query.attr_name, doc))
            if len(chunk) >= 500:
                await response.write("".join(chunk).encode())
                chunk.clear()
        if chunk:
            await response.write("".join(chunk).encode())
        await response.write_eof()
        return response

    async def version(self, _request: web.Request) -> web.Response:
        return _json({"version": _package_version()})


async def _reversed(cursor: Any) -> Any:
    # lastN reads newest first and is at most maxPageSize documents: reverse them in memory.
    docs = [doc async for doc in cursor]
    for doc in reversed(docs):
        yield doc


def _rfc5987(text: str) -> str:
    return quote(text, safe="!#$&+-.^_`|~")


@web.middleware
async def _not_found(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return _json(not_found_body(request.path), 404, {CORRELATOR: _correlator(request)})


def build_app(settings: ApiSettings) -> web.Application:
    """The aiohttp application; its MongoDB client opens on startup and closes on cleanup."""
    api = STHApi(settings)
    app = web.Application(middlewares=[_not_found])

    async def mongo(app: web.Application) -> Any:
        client: AsyncMongoClient = AsyncMongoClient(
            settings.mongo_url, tz_aware=True, appname="ngsi-assets-sth-api", serverSelectionTimeoutMS=10_000
        )
        app[_MONGO_KEY] = client
        yield
        await client.close()

    app.cleanup_ctx.append(mongo)

    async def v1(request: web.Request) -> web.StreamResponse:
        return await api.data(request, 1)

    async def v2(request: web.Request) -> web.StreamResponse:
        return await api.data(request, 2)

    app.router.add_get("/STH/v1/contextEntities/type/{entityType}/id/{entityId}/attributes/{attrName}", v1)
    app.router.add_get("/STH/v2/entities/{entityId}/attrs/{attrName}", v2)
    app.router.add_get("/version", api.version)
    return app


def serve(host: str, port: int, settings: ApiSettings) -> None:
    """Run until SIGTERM or SIGINT; prints one "listening on" line when ready (port 0: any free port)."""

    async def main() -> None:
        runner = web.AppRunner(build_app(settings), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        print(f"STH API listening on http://{host}:{bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())
