"""Raw documents -> MongoDB (Cygnus NGSIMongoSink): collections, indexes, and inserts from executors.

Collections are created as Cygnus's ``MongoBackendImpl.createCollection`` creates them (capped with
``collections_size`` and ``max_documents``; an existing one is left as it is), with its index
``cyg_raw_opt`` and, with ``data_expiration``, the TTL index ``cyg_raw_exp`` on ``recvTime``. One
more index, ``sth_raw_query``, puts the entity/attribute fields before ``recvTime`` (the index
STH-Comet's ``db_indexes.md`` recommends), so the read API's ``lastN`` and paging queries walk an
index instead of sorting the collection.

Documents are inserted unordered in batches of ``batch_size`` from the executors; into a capped
collection, by one task per collection, oldest first, so that the server drops the oldest. Their ``_id`` is
deterministic (``transforms.mongo_raw.object_id``): a document already there is a duplicate-key
error, which is success, so a rerun inserts exactly what is missing. Transient errors are retried
after ``batch_retry_intervals``, ``batch_ttl`` times.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
from bson import ObjectId
from pymongo import MongoClient
from pymongo.errors import CollectionInvalid, OperationFailure
from pyspark.sql import DataFrame

from ngsi_assets.ngsi.mongo_raw_config import AttrPersistence, MongoRawConfig
from ngsi_assets.ngsi.sth_config import DataModel
from ngsi_assets.sinks.mongo_bulk import (
    MongoWriteError,
    connect,
    existing_collections,
    run_by_collection,
    with_retries,
    write_by_collection,
)
from ngsi_assets.transforms.mongo_raw import KIND_BOOLEAN, KIND_DATE, KIND_JSON, KIND_NULL, KIND_NUMBER
from ngsi_assets.transforms.partitioning import cluster_by

DUPLICATE_KEY = 11000
NAMESPACE_EXISTS = 48
RAW_INDEX = "cyg_raw_opt"
RAW_TTL_INDEX = "cyg_raw_exp"
QUERY_INDEX = "sth_raw_query"
APP_NAME = "ngsi-assets-mongo-raw"


class MongoRawWriteError(MongoWriteError):
    """An insert of raw documents failed for good (after its retries)."""


def raw_index_keys(data_model: DataModel) -> list[tuple[str, int]]:
    """Cygnus's ``cyg_raw_opt`` keys for a data model."""
    if data_model is DataModel.BY_SERVICE_PATH:
        names = ["recvTime", "entityId", "entityType", "attrName", "attrType", "attrValue"]
    elif data_model is DataModel.BY_ENTITY:
        names = ["recvTime", "attrName", "attrType", "attrValue"]
    else:
        names = ["recvTime", "attrType", "attrValue"]
    return [(n, 1) for n in names]


def query_index_keys(data_model: DataModel) -> list[tuple[str, int]] | None:
    """Equality fields, then ``recvTime``: what the read API filters and sorts on (None: cyg_raw_opt serves)."""
    if data_model is DataModel.BY_SERVICE_PATH:
        return [("entityId", 1), ("entityType", 1), ("attrName", 1), ("recvTime", 1)]
    if data_model is DataModel.BY_ENTITY:
        return [("attrName", 1), ("recvTime", 1)]
    return None  # dm-by-attribute: cyg_raw_opt starts with recvTime


def ensure_collection(client: MongoClient, database: str, collection: str, config: MongoRawConfig) -> None:
    """Create the collection (capped if configured) and its indexes; idempotent."""
    db = client[database]
    try:
        if config.capped:
            db.create_collection(collection, capped=True, size=config.collections_size, max=config.max_documents)
        else:
            db.create_collection(collection)
    except CollectionInvalid:
        pass  # it exists: left as it is, like Cygnus
    except OperationFailure as exc:
        if exc.code != NAMESPACE_EXISTS:
            raise
    coll = db[collection]
    coll.create_index(raw_index_keys(config.data_model), name=RAW_INDEX)
    query = query_index_keys(config.data_model)
    if query is not None:
        coll.create_index(query, name=QUERY_INDEX)
    if config.data_expiration:
        coll.create_index([("recvTime", 1)], name=RAW_TTL_INDEX, expireAfterSeconds=config.data_expiration)


def _date(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def typed_value(text: str | None, kind: str) -> Any:
    """The stored form of a value: its JSON type where ``kind`` says so, else the text."""
    if kind == KIND_NULL or text is None:
        return None
    if kind == KIND_NUMBER:
        if text.lstrip("-").isdigit():
            number = int(text)
            if -(2**63) <= number < 2**63:
                return number
        return float(text)
    if kind == KIND_BOOLEAN:
        return text == "true"
    if kind == KIND_JSON:
        return orjson.loads(text)
    if kind == KIND_DATE:
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            return text  # Spark read a time Python does not: keep the text rather than fail the batch
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return text


def _metadata(md_text: str | None) -> list[Any]:
    return orjson.loads(md_text) if md_text else []


def to_raw_document(row: dict[str, Any], config: MongoRawConfig) -> dict[str, Any]:
    """The NGSIMongoSink document of a row of ``raw_rows`` (fields in Cygnus's order)."""
    doc: dict[str, Any] = {"_id": ObjectId(row["docId"])}
    if config.data_model is DataModel.BY_SERVICE_PATH:
        doc["entityId"] = row["entityId"]
        if row["entityType"] is not None:
            doc["entityType"] = row["entityType"]
    if config.attr_persistence is AttrPersistence.ROW:
        if config.data_model is not DataModel.BY_ATTRIBUTE:
            doc["attrName"] = row["attrName"]
        if row["attrType"] is not None:
            doc["attrType"] = row["attrType"]
        value = typed_value(row["attrValue"], row["valueKind"])
        if value is not None:
            doc["attrValue"] = value
        if config.attr_metadata_store:
            doc["attrMetadata"] = _metadata(row["attrMd"])
    else:
        for attr in row["attrs"]:
            value = typed_value(attr["value"], attr["kind"])
            if value is not None:
                doc[attr["name"]] = value
            if config.attr_metadata_store:
                doc[attr["name"] + "_md"] = _metadata(attr["md"])
    doc["recvTime"] = _date(row["recvTimeMs"])
    return doc


def _insert(collection: Any, docs: list[Any], target: str, config: MongoRawConfig) -> dict[str, int]:  # noqa: ANN401
    """Insert ``docs`` unordered; counts the new ones (duplicates are documents already stored)."""
    inserted = with_retries(
        lambda: len(collection.insert_many(docs, ordered=False).inserted_ids),
        target,
        config,
        harmless={DUPLICATE_KEY},
        partial=lambda exc: int(exc.details.get("nInserted", 0)),
        error=MongoRawWriteError,
    )
    return {"inserted": inserted}


def write_partition(rows: Iterable[Any], url: str, config: MongoRawConfig) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Insert one Spark partition of raw rows; yield (database, collection, counts of documents and of
    those newly inserted). Rows are expected grouped by (database, collection) (the caller sorts).
    """
    return write_by_collection(
        rows,
        url,
        APP_NAME,
        config.batch_size,
        lambda row: (to_raw_document(row, config), "documents"),
        lambda collection, docs, target: _insert(collection, docs, target, config),
    )


def write_raw(rows: DataFrame, url: str, config: MongoRawConfig) -> dict[tuple[str, str], tuple[int, int]]:
    """Insert ``rows`` (of ``raw_rows``) from the executors; (documents, newly inserted) per collection.

    New collections are created first, on the driver: their number follows the new entities (or
    service paths), not the rows.
    """
    touched = {(r["database"], r["collection"]) for r in rows.select("database", "collection").distinct().collect()}
    with connect(url, APP_NAME) as client:
        # Collections that exist are left as they are (as Cygnus leaves them): only new ones are
        # created, with their indexes, so a run costs calls per new collection, not per collection.
        for database, collection in sorted(touched - existing_collections(client, {db for db, _ in touched})):
            ensure_collection(client, database, collection, config)
    if config.capped:
        # A capped collection drops what was inserted first: one task per collection inserts its
        # documents oldest first, so the newest survive (as when Cygnus inserts them as they come).
        ordered = cluster_by(rows, "database", "collection").sortWithinPartitions(
            "database", "collection", "recvTimeMs", "docId"
        )
    else:
        ordered = rows.sortWithinPartitions("database", "collection", "docId")
    summed = run_by_collection(ordered, lambda part: write_partition(part, url, config))
    return {key: (tally["documents"], tally["inserted"]) for key, tally in summed.items()}
