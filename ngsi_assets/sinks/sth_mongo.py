"""STH documents -> MongoDB: whole documents replaced (or deleted) by ``_id``, bulk writes from executors.

Every document is written whole with ``replace_one(upsert=True)`` (never ``$inc``), its fields in
one fixed order (``_id``, ``attrType``, ``points``; points by offset; occur keys sorted), so the
stored bytes depend only on the aggregates in the lake, whatever order hours were run in.

Writes run in Spark executors (``on_each_partition``, a ``mapInArrow``): each task opens its own
client from a plain URL, groups its rows by collection and sends ordered-free bulk writes of
``batch_size`` operations. A bulk write that fails for a transient reason (network, primary
stepping down) is retried after ``batch_retry_intervals`` up to ``batch_ttl`` times; replacing a
whole document is idempotent, so a retry cannot count a sample twice. Only per-collection counts
come back to the driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pymongo import DeleteOne, MongoClient, ReplaceOne
from pyspark.sql import DataFrame

from ngsi_assets.ngsi.sth_config import DataModel, STHConfig
from ngsi_assets.ngsi.sth_naming import (
    AGGR_SUFFIX,
    encode_collection_new,
    encode_collection_old,
    encode_database_new,
    encode_database_old,
    id_fields,
)
from ngsi_assets.sinks.mongo_bulk import MongoWriteError, run_by_collection, with_retries, write_by_collection
from ngsi_assets.transforms.sth import ACTION_DELETE, ACTION_UPSERT

_ID_COLUMN = {"entityId": "idEntityId", "entityType": "idEntityType", "attrName": "idAttrName"}


class STHPublishError(MongoWriteError):
    """A bulk write of STH documents failed for good (after its retries)."""


def origin_datetime(origin_ms: int) -> datetime:
    return datetime.fromtimestamp(origin_ms / 1000, UTC)


def document_id(row: dict[str, Any], data_model: DataModel) -> dict[str, Any]:
    """The ``_id`` of a document row: the data model's entity/attribute fields, origin, resolution, range."""
    doc_id: dict[str, Any] = {name: row[_ID_COLUMN[name]] for name in id_fields(data_model)}
    doc_id["origin"] = origin_datetime(row["origin"])
    doc_id["resolution"] = row["resolution"]
    doc_id["range"] = row["range"]
    return doc_id


def to_document(row: dict[str, Any], data_model: DataModel) -> dict[str, Any]:
    """The STH-Comet document of a row of ``build_documents`` (fields in a fixed order).

    Points hold offset and samples, then sum, sum2, min, max when the document has numbers, then
    occur when it has text.
    """
    points: list[dict[str, Any]] = []
    for p in sorted(row["points"], key=lambda p: p["offset"]):
        point: dict[str, Any] = {"offset": int(p["offset"]), "samples": int(p["samples"])}
        if row["numeric"]:
            point.update(sum=float(p["sum"]), sum2=float(p["sum2"]), min=float(p["min"]), max=float(p["max"]))
        if row["text"]:
            # A document with numbers and text (a sensor's "n/a") carries both in every point, as
            # STH-Comet's documents do once Cygnus has $inc-ed both kinds into them.
            occur = p["occur"] or {}
            point["occur"] = {k: int(occur[k]) for k in sorted(occur)}
        points.append(point)
    return {"_id": document_id(row, data_model), "attrType": row["attrType"], "points": points}


def _operation(row: dict[str, Any], config: STHConfig) -> tuple[Any, str] | None:
    if row["action"] == ACTION_UPSERT:
        doc = to_document(row, config.data_model)
        return ReplaceOne({"_id": doc["_id"]}, doc, upsert=True), "replaced"
    if row["action"] == ACTION_DELETE:
        return DeleteOne({"_id": document_id(row, config.data_model)}), "deleted"
    return None


def _send(collection: Any, ops: list[Any], target: str, config: STHConfig) -> dict[str, int]:  # noqa: ANN401
    with_retries(lambda: collection.bulk_write(ops, ordered=False), target, config, error=STHPublishError)
    return {}


def write_partition(rows: Iterable[Any], url: str, config: STHConfig) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Write one Spark partition of document rows; yield (database, collection, counts of replaced
    and deleted). Rows are expected grouped by (database, collection) (the caller sorts within partitions).
    """
    return write_by_collection(
        rows,
        url,
        "ngsi-assets-sth",
        config.batch_size,
        lambda row: _operation(row, config),
        lambda collection, ops, target: _send(collection, ops, target, config),
    )


def publish_documents(documents: DataFrame, url: str, config: STHConfig) -> dict[tuple[str, str], tuple[int, int]]:
    """Replace or delete ``documents`` (rows of ``build_documents``) in MongoDB, from the executors.

    Returns (documents replaced, documents deleted) per (database, collection): each partition reports
    one small row per collection it touched, summed here.
    """
    todo = documents.where(documents["action"].isin(ACTION_UPSERT, ACTION_DELETE)).sortWithinPartitions(
        "database", "collection"
    )
    summed = run_by_collection(todo, lambda rows: write_partition(rows, url, config))
    return {key: (tally["replaced"], tally["deleted"]) for key, tally in summed.items()}


AGGREGATE_INDEX = "cyg_agg_opt"


def aggregate_index_keys(data_model: DataModel) -> list[tuple[str, int]]:
    """Cygnus's ``cyg_agg_opt`` keys (``MongoBackendImpl.createCollection``): the ``_id`` fields the
    read API matches, then resolution and origin, which it filters and sorts on."""
    return [(f"_id.{name}", 1) for name in (*id_fields(data_model), "resolution", "origin")]


def ensure_aggregate_indexes(client: MongoClient, collections: Iterable[tuple[str, str]], config: STHConfig) -> None:
    """Create ``cyg_agg_opt`` on ``collections`` (idempotent; the caller passes the new ones)."""
    keys = aggregate_index_keys(config.data_model)
    for database, collection in collections:
        client[database][collection].create_index(keys, name=AGGREGATE_INDEX)


def database_prefix(config: STHConfig) -> str:
    return encode_database_new(config.db_prefix) if config.enable_encoding else encode_database_old(config.db_prefix)


def collection_prefix(config: STHConfig) -> str:
    if config.enable_encoding:
        return encode_collection_new(config.collection_prefix)
    return encode_collection_old(config.collection_prefix)


def expire_documents(client: MongoClient, config: STHConfig, now: datetime) -> dict[tuple[str, str], int]:
    """Delete documents whose ``_id.origin`` is older than ``data_expiration`` seconds before ``now``.

    Looks in every STH collection (``collection_prefix`` ... ``.aggr``) of every database starting
    with ``db_prefix``; returns the documents deleted per collection (collections with none left out).
    """
    if config.data_expiration <= 0:
        return {}
    cutoff = datetime.fromtimestamp(now.timestamp() - config.data_expiration, UTC)
    db_prefix, coll_prefix = database_prefix(config), collection_prefix(config)
    deleted: dict[tuple[str, str], int] = {}
    for database in sorted(client.list_database_names()):
        if not database.startswith(db_prefix):
            continue
        for collection in sorted(client[database].list_collection_names()):
            if collection.startswith(coll_prefix) and collection.endswith(AGGR_SUFFIX):
                n = client[database][collection].delete_many({"_id.origin": {"$lt": cutoff}}).deleted_count
                if n:
                    deleted[(database, collection)] = n
    return deleted
