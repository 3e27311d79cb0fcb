"""STH documents -> MongoDB, from executors: whole documents replaced (or deleted) by ``_id``, or a
batch's point updates added in place.

A whole-hour run writes every document it touches whole with ``replace_one(upsert=True)``, its
fields in one fixed order (``_id``, ``attrType``, ``points``; points by offset; occur keys sorted),
so the stored bytes depend only on the aggregates in the lake, whatever order hours were run in.

A continuous increment (a batch of an hour's increments) adds its samples to the documents in place,
as Cygnus's ``MongoBackendImpl`` does per notification: the document prepopulated if new
(``$setOnInsert`` of every point of the range), then ``$inc`` of the points' samples, sum, sum2
and occur counts, ``$min``/``$max`` of min and max, ``$set`` of attrType. Those updates are not
idempotent, so each collection records the batches it received (``INCREMENTS_LEDGER``, one entry
per collection, hour and batch): marked ``applying`` before the collection's updates and ``done``
after them. A collection whose entry says ``done`` is skipped (a rerun adds nothing twice); one
left ``applying`` by a run that died, or ``done`` for a batch the lake's ledger never named (the run
died after MongoDB had it), is rebuilt whole from the lake's rollups by the next batch of the hour
(``stale_collections``), which holds every sample the dead run had.

Writes run in Spark executors (``on_each_partition``, a ``mapInArrow``): each task opens its own
client from a plain URL, groups its rows by collection and sends ordered-free bulk writes of
``batch_size`` operations. A bulk write that fails for a transient reason (network, primary
stepping down) is retried after ``batch_retry_intervals`` up to ``batch_ttl`` times; replacing a
whole document is idempotent, so a retry cannot count a sample twice. Only per-collection counts
come back to the driver.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo import DeleteOne, MongoClient, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError, PyMongoError
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
from ngsi_assets.sinks.mongo_bulk import (
    MongoWriteError,
    connect,
    run_by_collection,
    with_retries,
    write_by_collection,
)
from ngsi_assets.transforms.partitioning import cluster_by
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


# Where each STH database records the batches its collections received (see the module's docstring):
# one small document per (collection, hour, batch); a whole-hour run removes its hours' entries.
INCREMENTS_LEDGER = "ngsi_assets_sth_increments"
APPLYING = "applying"
DONE = "done"
# The server refuses an update that would take a document over 16 MiB: the document is left as it was,
# as a whole rebuild leaves a document it rejects for its size.
TOO_LARGE_CODES = frozenset({10334, 17419, 17420})


class STHIncrementError(STHPublishError):
    """A batch's point updates to a collection failed part way: the collection is left ``applying``,
    and the next batch of the hour rebuilds its documents whole."""


def ledger_id(collection: str, hour: str, batch: str) -> str:
    return f"{collection}|{hour}|{batch}"


def _ledger_entry(collection: str, hour: str, batch: str, state: str, **counts: int) -> dict[str, Any]:
    return {"collection": collection, "hour": hour, "batch": batch, "state": state, "at": datetime.now(UTC), **counts}


def prepopulated(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every point of the range, empty: what Cygnus's ``buildPrepopulatedPoints`` inserts, with the
    fields of the kinds the row brings (a document with both kinds carries both in every point)."""
    points = []
    for offset in range(int(row["first"]), int(row["last"]) + 1):
        point: dict[str, Any] = {"offset": offset, "samples": 0}
        if row["numeric"]:
            point.update(sum=0.0, sum2=0.0, min=float("inf"), max=float("-inf"))
        if row["text"]:
            point["occur"] = {}
        points.append(point)
    return points


def _id_key(doc_id: Mapping[str, Any]) -> tuple:
    """A document ``_id`` as a hashable key (dates as epoch ms, whatever their tzinfo)."""
    return tuple((k, int(v.timestamp() * 1000) if isinstance(v, datetime) else v) for k, v in sorted(doc_id.items()))


def _shape_ops(doc_id: dict[str, Any], row: Mapping[str, Any], stored: set[str] | None) -> list[UpdateOne]:
    """What a document needs before the batch's additions: prepopulated if new (``stored`` None; an
    upsert with ``$setOnInsert``, so a document written meanwhile is left as it is), or its points
    given the fields of a kind the batch brings that it had none of (``stored``: the fields of its
    first point; a number after text only, or the reverse)."""
    if stored is None:
        points = prepopulated(row)
        return [
            UpdateOne({"_id": doc_id}, {"$setOnInsert": {"attrType": row["attrType"], "points": points}}, upsert=True)
        ]
    count = int(row["last"]) - int(row["first"]) + 1
    fields: dict[str, Any] = {}
    if row["numeric"] and "sum" not in stored:
        empty = {"sum": 0.0, "sum2": 0.0, "min": float("inf"), "max": float("-inf")}
        fields.update({f"points.{i}.{k}": v for i in range(count) for k, v in empty.items()})
    if row["text"] and "occur" not in stored:
        fields.update({f"points.{i}.occur": {} for i in range(count)})
    return [UpdateOne({"_id": doc_id}, {"$set": fields})] if fields else []


def point_update(doc_id: dict[str, Any], row: Mapping[str, Any]) -> UpdateOne:
    """The batch's samples added to the stored points (a row of ``point_updates``)."""
    inc: dict[str, Any] = {}
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for p in row["points"]:
        at = f"points.{int(p['offset']) - int(row['first'])}"
        inc[f"{at}.samples"] = int(p["samples"])
        if p["numSamples"]:
            inc[f"{at}.sum"] = float(p["sum"])
            inc[f"{at}.sum2"] = float(p["sum2"])
            low[f"{at}.min"] = float(p["min"])
            high[f"{at}.max"] = float(p["max"])
        for key, n in sorted((p["occur"] or {}).items()):
            inc[f"{at}.occur.{key}"] = int(n)
    update: dict[str, Any] = {"$set": {"attrType": row["attrType"]}, "$inc": inc}
    if low:
        update["$min"] = low
        update["$max"] = high
    return UpdateOne({"_id": doc_id}, update)


def _add_points(collection: Any, rows: list[dict[str, Any]], target: str, config: STHConfig) -> dict[str, int]:  # noqa: ANN401
    """Send a collection's point updates, each once: one read of the documents' first points (which
    exist, with which kinds), then, in order, what each needs before (``_shape_ops``) and the
    additions. A failure part way raises ``STHIncrementError``."""
    ids = [document_id(r, config.data_model) for r in rows]
    first: dict[tuple, set[str]] = {}
    try:
        for start in range(0, len(ids), config.batch_size):
            found = collection.find({"_id": {"$in": ids[start : start + config.batch_size]}}, {"points": {"$slice": 1}})
            first.update({_id_key(d["_id"]): set(d["points"][0]) if d.get("points") else set() for d in found})
    except PyMongoError as exc:
        raise STHIncrementError(f"point updates to {target}: reading the documents failed: {exc}") from exc
    ops = []
    for doc_id, row in zip(ids, rows, strict=True):
        ops.extend(_shape_ops(doc_id, row, first.get(_id_key(doc_id))))
        ops.append(point_update(doc_id, row))
    rejected, start = 0, 0
    while start < len(ops):
        chunk = ops[start : start + config.batch_size]
        start += len(chunk)
        try:
            collection.bulk_write(chunk, ordered=True)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if not errors or any(e.get("code") not in TOO_LARGE_CODES for e in errors):
                first_error = next((e for e in errors if e.get("code") not in TOO_LARGE_CODES), {})
                raise STHIncrementError(f"point updates to {target} failed: {first_error.get('errmsg', exc)}") from exc
            # An ordered bulk write stops at its error: the document over the limit is left as it was,
            # and the operations after it are sent again.
            rejected += 1
            start -= len(chunk) - errors[0]["index"] - 1
        except PyMongoError as exc:
            raise STHIncrementError(
                f"point updates to {target} failed part way ({exc}): the next batch of the hour rebuilds its documents"
            ) from exc
    return {"updated": len(rows) - rejected, "rejected": rejected}


def add_partition(
    rows: Iterable[Any], url: str, config: STHConfig, hour: str, batch: str
) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Add one Spark partition's point updates (rows of ``point_updates``, every row of a collection in
    this partition, grouped by database and collection). Per database, the ledger entries of the
    partition's collections are read, those without the batch marked ``applying`` (one write), their
    updates sent collection by collection, and the entries marked ``done`` (one write). Yields
    (database, collection, counts)."""
    dicts = (r.asDict(recursive=True) for r in rows)
    with connect(url, "ngsi-assets-sth") as client:
        for database, db_rows in itertools.groupby(dicts, key=lambda r: r["database"]):
            by_collection: dict[str, list[dict[str, Any]]] = {}
            for r in db_rows:
                by_collection.setdefault(r["collection"], []).append(r)
            ledger = client[database][INCREMENTS_LEDGER]
            keys = {name: ledger_id(name, hour, batch) for name in by_collection}
            done = {e["collection"] for e in ledger.find({"_id": {"$in": list(keys.values())}, "state": DONE})}
            for name in sorted(done):
                yield database, name, {"already": len(by_collection[name])}
            todo = [name for name in by_collection if name not in done]
            if not todo:
                continue
            marks = [ReplaceOne({"_id": keys[n]}, _ledger_entry(n, hour, batch, APPLYING), upsert=True) for n in todo]
            ledger.bulk_write(marks, ordered=False)
            counts = {}
            for name in todo:
                counts[name] = _add_points(client[database][name], by_collection[name], f"{database}.{name}", config)
            ledger.bulk_write(
                [ReplaceOne({"_id": keys[n]}, _ledger_entry(n, hour, batch, DONE, **counts[n])) for n in todo],
                ordered=False,
            )
            for name in todo:
                yield database, name, counts[name]


def add_point_updates(
    updates: DataFrame, url: str, config: STHConfig, hour: str, batch: str
) -> dict[tuple[str, str], dict[str, int]]:
    """Add a batch's point updates (rows of ``point_updates`` whose action is ``update``) to MongoDB,
    from the executors; counts per (database, collection): ``updated``, ``rejected`` (over 16 MiB),
    ``already`` (the collection had the batch). Every collection's rows go to one task (its ledger
    entry covers them all)."""
    rows = cluster_by(updates, "database", "collection").sortWithinPartitions("database", "collection")
    summed = run_by_collection(rows, lambda part: add_partition(part, url, config, hour, batch))
    return {key: dict(tally) for key, tally in summed.items()}


def stale_collections(
    client: MongoClient, databases: Iterable[str], hour: str, finished: Iterable[str]
) -> dict[tuple[str, str], list[str]]:
    """Per (database, collection), the ledger entries of ``hour`` that a run left unfinished: marked
    ``applying``, or naming a batch not among ``finished`` (the batches the lake's ledger names).

    The entries of finished batches are removed on the way: the lake's ledger keeps their increments
    from being folded again, so they have nothing left to tell (the ledger holds about one batch's
    entries per hour)."""
    done = set(finished)
    out: dict[tuple[str, str], list[str]] = {}
    for database in sorted(databases):
        ledger = client[database][INCREMENTS_LEDGER]
        if done:
            ledger.delete_many({"hour": hour, "state": DONE, "batch": {"$in": sorted(done)}})
        for entry in ledger.find({"hour": hour}):
            if entry.get("state") != DONE or entry.get("batch") not in done:
                out.setdefault((database, entry["collection"]), []).append(entry["_id"])
    return out


def settle_rebuilt(client: MongoClient, rebuilt: Mapping[tuple[str, str], list[str]], hour: str, batch: str) -> None:
    """After the collections' documents were rebuilt whole (with ``batch`` in them): each marked as
    having the batch, and the stale entries gone."""
    for (database, name), stale in sorted(rebuilt.items()):
        ledger = client[database][INCREMENTS_LEDGER]
        key = ledger_id(name, hour, batch)
        ledger.replace_one({"_id": key}, _ledger_entry(name, hour, batch, DONE, rebuilt=1), upsert=True)
        ledger.delete_many({"_id": {"$in": [s for s in stale if s != key]}})


def forget_hours(client: MongoClient, databases: Iterable[str], hours: Iterable[str]) -> None:
    """A whole-hour run rewrote the hours' documents: their ledger entries say nothing any more."""
    keys = sorted(hours)
    for database in sorted(databases):
        client[database][INCREMENTS_LEDGER].delete_many({"hour": {"$in": keys}})


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
