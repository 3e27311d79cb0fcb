"""The transaction history (seed 003): each materialization that changes a space's versioned entities is
one transaction, with the seed's 64-bit transaction id, uuids, puuid chains and actions.

The store and its commit protocol are in ``ngsi_assets.history_store``; the transforms in
``ngsi_assets.transforms.transaction_history``. Published to PostgreSQL in the seed's layout when
``NGSI_HISTORY_POSTGRES_URL`` (or ``NGSI_POSTGRES_URL``) is set.
"""

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import LazyPySparkResource

from ngsi_assets.assets.versioned_entities import INDEX_DS, INDEX_DT, LOG_DS, versioned_entities
from ngsi_assets.freshness import ledger_received, received_metadata
from ngsi_assets.history_store import Commit, HistoryStore, publish
from ngsi_assets.increments import side_by_side_width
from ngsi_assets.ngsi.entity_schema import NGSI_KEYS, EntitySchema
from ngsi_assets.ngsi.transactions import tnx_of
from ngsi_assets.partitions import hourly_partitions
from ngsi_assets.transforms.schemas import MESSAGE_STORE
from resources.history import TransactionHistoryResource
from resources.lake import LakeResource
from resources.versioning import VersioningResource

GROUP = "entities"


def spaces_to_examine(store: HistoryStore, schema: EntitySchema, indexed: list[str]) -> dict[str, tuple[str, ...]]:
    """Space -> key fields: the schema's entities, the entities the run's hours wrote, and every space with history.

    Examining a space that did not change costs one listing of its buckets.
    """
    names = set(schema.entities) | set(indexed) | set(store.spaces())
    return {n: (schema.entities[n].key_fields if n in schema.entities else tuple(NGSI_KEYS)) for n in sorted(names)}


def check_results(store: HistoryStore, commits: list[Commit]) -> list[AssetCheckResult]:
    """The three checks over this run's transactions.

    The chain and uuid checks are those ``record`` made of each transaction's stored rows against
    the features' previous rows (HEAD before it), so their cost follows the transaction, not the
    length of the history; a transaction this store did not record counts as failed.
    """
    breaks = 0
    duplicate_uuids = 0
    out_of_order = 0
    unverified = 0
    break_examples: list[dict] = []
    for c in commits:
        verification = store.verification(c.space, c.txn)
        if verification is None:
            unverified += 1
        else:
            breaks += verification.chain_breaks
            break_examples += verification.break_examples
            duplicate_uuids += verification.uuid_faults
        prev = store.commit(c.space, c.txn - 1)
        if prev is not None and c.first_i <= prev.last_i:
            duplicate_uuids += 1  # its i range overlaps the previous one's: uuids can repeat
        in_layout = c.tnx == tnx_of(c.ts, c.txn)
        if not in_layout or (prev is not None and not (c.tnx > prev.tnx and c.ts >= prev.ts)):
            out_of_order += 1
    return [
        AssetCheckResult(
            check_name="puuid_chains_unbroken",
            passed=breaks == 0 and unverified == 0,
            description="Per feature touched, puuid is null only where a chain starts and else the previous uuid.",
            metadata={
                "rows_breaking_a_chain": breaks,
                "transactions_not_verified": unverified,
                "examples": MetadataValue.json(break_examples[:3]),
            },
        ),
        AssetCheckResult(
            check_name="uuids_unique",
            passed=duplicate_uuids == 0 and unverified == 0,
            description="No uuid appears twice in the history of a space this run wrote to: each new row's uuid is "
            "the one of its (tnx, i), its i in its transaction's range (ranges follow each other), and not "
            "already taken.",
            metadata={"rows_with_a_uuid_fault": duplicate_uuids, "transactions_not_verified": unverified},
        ),
        AssetCheckResult(
            check_name="tnx_non_decreasing",
            passed=out_of_order == 0,
            description="Each new transaction's tnx is the seed layout of (ts, txn), above the previous one's, "
            "with a ts not below it.",
            metadata={"transactions_out_of_order": out_of_order},
        ),
    ]


@asset(
    deps=[versioned_entities],
    partitions_def=hourly_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=GROUP,
    kinds={"spark", "parquet", "postgres"},
    pool="transaction_history",
    check_specs=[
        AssetCheckSpec("puuid_chains_unbroken", asset="transaction_history"),
        AssetCheckSpec("uuids_unique", asset="transaction_history"),
        AssetCheckSpec("tnx_non_decreasing", asset="transaction_history"),
    ],
)
def transaction_history(
    context: AssetExecutionContext,
    spark: LazyPySparkResource,
    lake: LakeResource,
    versioning: VersioningResource,
    history: TransactionHistoryResource,
) -> MaterializeResult:
    """One history row per changed feature (i, action, tnx, ts, id, uuid, puuid, lastUpdatedBy, state) per
    space (target entity), one transaction per space this run changed; rerunning commits nothing new.
    """
    keys = context.partition_keys
    session = spark.spark_session
    store = HistoryStore(session, lake, schema=history.schema_name)
    schema = versioning.load_schema()
    messages = lake.read(session, "message_store", MESSAGE_STORE, keys).select(
        "message_identifier", "user", "source_system"
    )
    indexed = [r[0] for r in lake.read(session, INDEX_DS, INDEX_DT, keys).select("entity").distinct().collect()]
    # What the versioned entities held when their state was read (read first: a lower bound).
    received = ledger_received(lake, LOG_DS, keys)
    with store.writer_lock():
        # Every space at one transaction time, compared side by side, committed in name order.
        commits = store.record_all(
            spaces_to_examine(store, schema, indexed),
            messages,
            commit_msg=f"dagster run {context.run_id}",
            commit_json={"run_id": context.run_id, "partitions": [keys[0], keys[-1]], "hours": len(keys)},
            workers=side_by_side_width(context.run.tags),
        )
    for commit in commits:
        context.log.info(f"space {commit.space!r}: transaction {commit.txn} tnx {commit.tnx} {commit.commit_json}")
    published = (
        publish(store, history.postgres_url, history.schema_name)
        if history.postgres_url
        else {"skipped": "no PostgreSQL configured"}
    )
    return MaterializeResult(
        metadata={
            "transactions": len(commits),
            **received_metadata(received),
            "dagster/row_count": sum(c.last_i - c.first_i + 1 for c in commits),
            "per_space": MetadataValue.json(
                {c.space: {"txn": c.txn, "tnx": str(c.tnx), **c.commit_json["actions"]} for c in commits}
            ),
            "published": MetadataValue.json(published),
        },
        check_results=check_results(store, commits),
    )
