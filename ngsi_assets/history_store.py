"""The transaction history's store in the lake, its commit protocol, and its publication to PostgreSQL.

Layout, per space (``<folder>`` = ``entity_folder(space)``):

- ``transaction_history/<folder>/txn=N/``: the history rows of the space's N-th transaction (HISTORY);
- ``transaction_log/<folder>/<N, 12 digits>.json``: the transaction record; its presence commits txn N;
- ``transaction_head/<folder>/bucket=B/``: the newest row of every feature (HEAD), by versioned bucket;
- ``transaction_head/<folder>/_state.json``: the transaction HEAD reflects, the signature of every
  versioned-entities bucket it has compared (so a transaction reads only the buckets that changed),
  and the bucket count HEAD's buckets follow (the versioned entities', ``_follow_bucket_count``);
- ``transaction_tags/<folder>.json``: the space's tags (name -> tnx).

A transaction writes its history rows, then its record (the commit point), then HEAD and the state.
Recovery at the start of the next one deletes history rows no record commits (a crash before the
commit) and replays committed rows onto HEAD when the state says HEAD is behind (a crash after it), so
a crash at any point neither loses a committed change nor writes one twice. ``record_all`` does this
for several spaces: every space's rows in one write, records one after the other in the order given,
every HEAD in one write.

One writer at a time: on a local lake an exclusive ``flock`` on ``<root>/transaction_log/.lock``; on
object storage give the ``transaction_history`` Dagster pool a limit of 1.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ngsi_assets.ngsi.entity_schema import entity_folder
from ngsi_assets.ngsi.transactions import Action, tnx_of
from ngsi_assets.sinks import history_pg
from ngsi_assets.sinks.executors import on_each_partition
from ngsi_assets.transforms.history_publication import feature_rows
from ngsi_assets.transforms.partitioning import cluster_by
from ngsi_assets.transforms.transaction_history import (
    BUCKET,
    CURRENT,
    FAULT_CHAIN,
    FAULT_UUID,
    HEAD,
    HISTORY,
    SPACE_N,
    TXN,
    Numbering,
    advance_head,
    as_of,
    by_space,
    changes,
    current_features,
    difference,
    last_updated_by,
    layer,
    number_changes,
    numbering_counts,
    partition_offsets,
    sorted_for_numbering,
    transaction_faults,
)
from ngsi_assets.transforms.versioned_entities import OPEN_PREFIX, bucket_column
from resources.frames import empty_frame
from resources.history import DEFAULT_SCHEMA
from resources.lake import LakeResource
from resources.parallel import DEFAULT_WORKERS, results, side_by_side
from resources.versioning import VERSIONS_DS, stored_bucket_count, stored_table_schema

HISTORY_DS = "transaction_history"
LOG_DS = "transaction_log"
HEAD_DS = "transaction_head"
TAGS_DS = "transaction_tags"
STATE_FILE = "_state.json"
# Versioned-entities Parquet bytes per numbering partition of a space's first transaction (about
# ROWS_PER_PART versions).
FIRST_PART_BYTES = 8 * 2**20
# History rows per numbering partition.
ROWS_PER_PART = 50_000


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Commit:
    """One committed transaction of one space (a row of the transactions table)."""

    space: str
    txn: int  # the space's transaction counter (1, 2, ...)
    tnx: int  # the seed's 64-bit transaction id
    ts: datetime
    id: int  # global sequential id over all spaces
    schema: str
    table: str
    commit_msg: str
    commit_json: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The record as plain JSON values (ts in ISO 8601, UTC)."""
        return {**self.__dict__, "ts": self.ts.astimezone(UTC).isoformat()}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Commit:
        d = json.loads(text)
        d["ts"] = datetime.fromisoformat(d["ts"])
        return Commit(**d)

    @property
    def first_i(self) -> int:
        return int(self.commit_json["first_i"])

    @property
    def last_i(self) -> int:
        return int(self.commit_json["last_i"])


@dataclass(frozen=True)
class Verification:
    """The faults ``record`` found in a transaction's rows (see ``transaction_faults``)."""

    chain_breaks: int
    break_examples: list[dict[str, Any]]
    uuid_faults: int


@dataclass(frozen=True)
class _Compared:
    """A space whose versioned buckets changed since HEAD: its changes, planned, not yet counted."""

    space: str
    folder: str
    latest: Commit | None
    changed_buckets: list[int]
    now_sigs: dict[str, str]
    head: DataFrame  # HEAD's rows of the changed buckets before the transaction
    current: DataFrame  # the features of the changed buckets now (CURRENT)
    expected: int  # about how many rows (sizes the numbering's partitions)


@dataclass(frozen=True)
class _Staged:
    """A space's next transaction whose rows are written and verified, not yet committed."""

    space: str
    folder: str
    txn: int
    tnx: int
    ts: datetime
    first_i: int
    total: int
    counts: dict[int, int]
    changed_buckets: list[int]
    now_sigs: dict[str, str]
    head: DataFrame  # HEAD's rows of the changed buckets before the transaction
    rows: DataFrame  # the transaction's rows as written
    verification: Verification


class HistoryError(ValueError):
    """A history request that cannot be answered (unknown space, tag or transaction)."""


class HistoryStore:
    """The transaction history of every space in one lake: recording, and reading it back."""

    def __init__(
        self,
        spark: SparkSession,
        lake: LakeResource,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.spark = spark
        self.lake = lake
        self.fs = lake.files()
        self.schema = schema
        self.clock = clock if clock is not None else utc_now
        self.verifications: dict[tuple[str, int], Verification] = {}

    # -- paths and small files --------------------------------------------------------------------

    def _log_uri(self, folder: str) -> str:
        return self.lake.folder_uri(LOG_DS, folder)

    def _state_uri(self, folder: str) -> str:
        return f"{self.lake.folder_uri(HEAD_DS, folder)}/{STATE_FILE}"

    def _tags_uri(self, folder: str) -> str:
        return f"{self.lake.dataset_uri(TAGS_DS)}/{folder}.json"

    def _read_state(self, folder: str) -> dict[str, Any]:
        text = self.fs.read_text(self._state_uri(folder))
        return json.loads(text) if text else {"head_txn": 0, "signatures": {}}

    def _write_state(self, folder: str, state: dict[str, Any]) -> None:
        self.fs.write_text(self._state_uri(folder), json.dumps(state, sort_keys=True))

    @contextlib.contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Exclusive for the whole lake (see the module docstring)."""
        with self.lake.exclusive(LOG_DS):
            yield

    # -- the transactions table ------------------------------------------------------------------

    def folders(self) -> list[str]:
        return [n for n in self.fs.list_names(self.lake.dataset_uri(LOG_DS)) if not n.startswith(".")]

    def commits(self, space: str, *, after: int = 0) -> list[Commit]:
        """The space's committed transactions with txn > ``after``, oldest first (one small file each)."""
        folder = entity_folder(space)
        names = [n for n in self.fs.list_names(self._log_uri(folder)) if n.endswith(".json") and int(n[:-5]) > after]
        out = []
        for name in names:
            text = self.fs.read_text(f"{self._log_uri(folder)}/{name}")
            if text:
                out.append(Commit.from_json(text))
        return sorted(out, key=lambda c: c.txn)

    def commit(self, space: str, txn: int) -> Commit | None:
        """The space's transaction ``txn``, or None."""
        text = self.fs.read_text(f"{self._log_uri(entity_folder(space))}/{txn:012d}.json")
        return Commit.from_json(text) if text else None

    def latest(self, folder: str) -> Commit | None:
        names = [n for n in self.fs.list_names(self._log_uri(folder)) if n.endswith(".json")]
        if not names:
            return None
        text = self.fs.read_text(f"{self._log_uri(folder)}/{max(names)}")
        return Commit.from_json(text) if text else None

    def newest(self) -> dict[str, Commit]:
        """Space name -> its newest committed transaction, for every space with one."""
        out = {}
        for folder in self.folders():
            commit = self.latest(folder)
            if commit is not None:
                out[commit.space] = commit
        return out

    def spaces(self) -> dict[str, str]:
        """Space name -> lake folder, for every space with a committed transaction."""
        return {space: entity_folder(space) for space in self.newest()}

    def transactions(self) -> list[Commit]:
        """Every committed transaction of every space, in global id order."""
        return sorted((c for space in self.spaces() for c in self.commits(space)), key=lambda c: c.id)

    # -- recording ------------------------------------------------------------------------------

    def _history_rows(self, folder: str, txns: Sequence[int] | None = None) -> DataFrame:
        df = self.lake.read_folders(self.spark, HISTORY_DS, TXN, txns, subfolder=folder, schema=HISTORY)
        return df if df is not None else empty_frame(self.spark, HISTORY)

    def _head(self, folder: str, buckets: Sequence[int] | None) -> DataFrame:
        df = self.lake.read_folders(self.spark, HEAD_DS, BUCKET, buckets, subfolder=folder, schema=HEAD)
        return df if df is not None else empty_frame(self.spark, HEAD)

    def recover(self, folder: str) -> None:
        """Undo an unfinished transaction of the space (see the module docstring)."""
        latest = self.latest(folder)
        committed = latest.txn if latest else 0
        written = [int(v) for v in self.fs.list_partition_values(self.lake.folder_uri(HISTORY_DS, folder), TXN)]
        for txn in written:
            if txn > committed:
                self.fs.delete(f"{self.lake.folder_uri(HISTORY_DS, folder)}/{TXN}={txn}")
        state = self._read_state(folder)
        behind = [t for t in range(int(state["head_txn"]) + 1, committed + 1)]
        if not behind:
            return
        rows = self._history_rows(folder, behind).persist()
        try:
            buckets = sorted({int(r[0]) for r in rows.select(BUCKET).distinct().collect()})
            if buckets:
                head = advance_head(self._head(folder, buckets), rows)
                self.lake.replace_folders(head, HEAD_DS, BUCKET, buckets, subfolder=folder)
        finally:
            rows.unpersist()
        # The signatures are dropped: the buckets are compared again (and found unchanged).
        self._write_state(folder, {**state, "head_txn": committed, "signatures": {}})

    def record(
        self,
        space: str,
        key_fields: Sequence[str],
        messages: DataFrame,
        *,
        table: str | None = None,
        commit_msg: str = "",
        commit_json: dict[str, Any] | None = None,
    ) -> Commit | None:
        """Compare the space's versioned entities with HEAD and commit the differences as one transaction.

        ``messages`` (message_identifier, user, source_system) name who made the changes. Returns the
        commit, or None when nothing changed (then nothing is written but the bucket signatures).
        Call it inside ``writer_lock``.
        """
        commits = self.record_all(
            {space: key_fields},
            messages,
            tables={space: table or space},
            commit_msg=commit_msg,
            commit_json=commit_json,
        )
        return commits[0] if commits else None

    def record_all(
        self,
        spaces: Mapping[str, Sequence[str]],
        messages: DataFrame,
        *,
        tables: Mapping[str, str] | None = None,
        commit_msg: str = "",
        commit_json: dict[str, Any] | None = None,
        workers: int = DEFAULT_WORKERS,
    ) -> list[Commit]:
        """``record`` for several spaces (space -> key fields) at one transaction time; the commits made,
        in the order of ``spaces``. Call it inside ``writer_lock``.

        The spaces' changed buckets are found side by side (file listings); their changes are then
        counted in one Spark job, numbered and written in one write, and verified in one job, whatever
        the number of spaces. The transactions are committed one after the other in the order of
        ``spaces`` (so their global ids follow it), and every HEAD moves in one write. A crash at any
        point leaves each space as ``record`` would.
        """
        now = self.clock().astimezone(UTC)
        # The versioned entities' bucket count, which every space's HEAD follows (``_follow_bucket_count``).
        buckets = stored_bucket_count(self.lake)
        compared = results(
            side_by_side(
                [functools.partial(self._compare, s, tuple(k), buckets) for s, k in spaces.items()],
                name="history-space",
                workers=workers,
            )
        )
        staged = self._stage_transactions([c for c in compared if c is not None], messages, now, buckets)
        # Global ids are given out in order, under the writer lock: the newest one is read once.
        newest_id = max((c.id for c in (self.latest(f) for f in self.folders()) if c is not None), default=0)
        tables = tables or {}
        commits = [
            self._commit_staged(st, newest_id + n, tables.get(st.space, st.space), commit_msg, commit_json or {})
            for n, st in enumerate(staged, start=1)
        ]
        self._advance_heads(staged, buckets)
        return commits

    def _compare(self, space: str, key_fields: Sequence[str], buckets: int | None) -> _Compared | None:
        """What the space's next transaction compares: HEAD and the features of the versioned buckets
        that changed since it (plans: nothing is computed), or None when none changed. Finishes an
        unfinished transaction of the space first."""
        folder = entity_folder(space)
        self.recover(folder)
        state = self._follow_bucket_count(folder, self._read_state(folder), buckets)
        seen: dict[str, str] = state["signatures"]
        now_sigs = self.fs.file_signatures(self.lake.folder_uri(VERSIONS_DS, folder), BUCKET)
        changed_buckets = sorted(
            {int(b) for b, sig in now_sigs.items() if seen.get(b) != sig} | {int(b) for b in seen if b not in now_sigs}
        )
        if not changed_buckets:
            return None
        latest = self.latest(folder)
        versions = self._open_versions(folder, changed_buckets)
        head = self._head(folder, changed_buckets)
        current = empty_frame(self.spark, CURRENT) if versions is None else current_features(versions, key_fields)
        # How many rows to expect, to size the numbering's partitions before the changes are counted:
        # the previous transaction's, or for a first transaction from the size of the versions it reads.
        if latest is not None:
            expected = latest.last_i - latest.first_i + 1
        else:
            expected = self.fs.tree_bytes(self.lake.folder_uri(VERSIONS_DS, folder)) * ROWS_PER_PART // FIRST_PART_BYTES
        return _Compared(space, folder, latest, changed_buckets, now_sigs, head, current, expected)

    def _follow_bucket_count(self, folder: str, state: dict[str, Any], count: int | None) -> dict[str, Any]:
        """The space's state, after HEAD's rows were moved to the buckets of the versioned entities' count.

        HEAD is stored by versioned bucket, and a transaction reads HEAD's buckets of the same numbers
        as the versioned buckets that changed. After the entity tables are rebuilt with another count
        (docs/features/versioned-entities.md, "Storage and cost"), HEAD's rows sit in their old
        buckets: compared as they are, every key whose bucket number changed would look created. So
        when the count the state names is not the tables' (or a state from before it was kept names
        none), HEAD's rows are checked, moved to their buckets if any is elsewhere (one rewrite of HEAD,
        one row per key), and every bucket is compared again. Safe to interrupt: the state names the
        count only once HEAD follows it.
        """
        if count is None or state.get("buckets") == count:
            return state
        if not state["head_txn"] and not state["signatures"]:
            # Nothing recorded yet (HEAD holds only committed rows): its first transaction keeps the count.
            return {**state, "buckets": count}
        head = self._head(folder, None)
        placed = bucket_column(F.col("guid"), count)
        if not head.where(F.col(BUCKET) != placed).isEmpty():
            old = [int(v) for v in self.lake.folder_values(HEAD_DS, BUCKET, folder)]
            moved = head.withColumn(BUCKET, placed)
            self.lake.replace_folders(moved, HEAD_DS, BUCKET, sorted({*old, *range(count)}), subfolder=folder)
            state = {**state, "signatures": {}}
        state = {**state, "buckets": count}
        self._write_state(folder, state)
        return state

    def _stage_transactions(
        self, compared: Sequence[_Compared], messages: DataFrame, now: datetime, buckets: int | None
    ) -> list[_Staged]:
        """The compared spaces' changes found and counted (one job), numbered and written as each space's
        next transaction's rows (one write, not yet committed) and verified (one job), in the order
        given. The spaces go through every step together, told apart by ``SPACE_N`` (their index in
        ``compared``): a step's Spark stages do not multiply with the spaces. A space with no change gets
        its bucket signatures saved and no transaction."""
        if not compared:
            return []
        by = [SPACE_N]
        changed = last_updated_by(
            changes(_tagged([c.head for c in compared]), _tagged([c.current for c in compared]), by), messages, by
        )
        # The numbering's partitions only spread the work (the order is global within a space): one
        # unless about 50,000 rows are expected (more than one costs a sampling job).
        shuffle = int(self.spark.conf.get("spark.sql.shuffle.partitions", "8"))
        parts = min(shuffle, 1 + sum(c.expected for c in compared) // ROWS_PER_PART)
        ordered = sorted_for_numbering(changed, parts).persist()
        try:
            counts: dict[int, dict[int, int]] = {n: {} for n in range(len(compared))}
            per_part: dict[tuple[int, int], tuple[int, int]] = {}
            for r in numbering_counts(ordered).collect():
                n, part, action, count = int(r[SPACE_N]), int(r["_part"]), int(r["action"]), int(r["count"])
                counts[n][action] = counts[n].get(action, 0) + count
                rows, start = per_part.get((n, part), (0, int(r["start"])))
                per_part[(n, part)] = (rows + count, min(start, int(r["start"])))
            numbering: dict[int, Numbering] = {}
            for n, c in enumerate(compared):
                if not counts[n]:
                    self._write_state(
                        c.folder,
                        {"head_txn": c.latest.txn if c.latest else 0, "signatures": c.now_sigs, "buckets": buckets},
                    )
                    continue
                # The wall clock went back: keep tnx non-decreasing.
                ts = max(now, c.latest.ts) if c.latest is not None else now
                txn = (c.latest.txn if c.latest else 0) + 1
                numbering[n] = Numbering((c.latest.last_i if c.latest else 0) + 1, tnx_of(ts, txn), ts, txn)
            if not numbering:
                return []
            rows = number_changes(ordered, offsets=partition_offsets(per_part), numbering=numbering)
            self.lake.replace_in_subfolders(
                rows,
                HISTORY_DS,
                TXN,
                [(c.folder, [numbering[n].txn] if n in numbering else []) for n, c in enumerate(compared)],
                by=SPACE_N,
            )
        finally:
            ordered.unpersist()
        # Checked against HEAD before it moves (and HEAD moved) from the rows as written.
        written = {n: self._history_rows(compared[n].folder, [num.txn]) for n, num in numbering.items()}
        totals = {n: sum(counts[n].values()) for n in numbering}
        verifications = self._verify_all(
            [(compared[n].head, written[n], num.first_i, num.first_i + totals[n] - 1) for n, num in numbering.items()]
        )
        return [
            _Staged(
                compared[n].space,
                compared[n].folder,
                num.txn,
                num.tnx,
                num.ts,
                num.first_i,
                totals[n],
                counts[n],
                compared[n].changed_buckets,
                compared[n].now_sigs,
                compared[n].head,
                written[n],
                verification,
            )
            for (n, num), verification in zip(numbering.items(), verifications, strict=True)
        ]

    def _verify_all(self, transactions: Sequence[tuple[DataFrame, DataFrame, int, int]]) -> list[Verification]:
        """The faults of each transaction (HEAD before it, its rows, its first and last ``i``: see
        ``transaction_faults``), in order: one job for all of them, and one more per transaction that
        breaks a chain (its examples)."""
        by = [SPACE_N]
        faults = transaction_faults(
            _tagged([t[0] for t in transactions]),
            _tagged([t[1] for t in transactions]),
            by_space(dict(enumerate(t[2] for t in transactions))),
            by_space(dict(enumerate(t[3] for t in transactions))),
            by,
        ).persist()
        try:
            counts = {
                (int(r[SPACE_N]), r["check"]): int(r["count"])
                for r in faults.groupBy(SPACE_N, "check").count().collect()
            }
            out = []
            for n in range(len(transactions)):
                breaks = counts.get((n, FAULT_CHAIN), 0)
                examples = (
                    [
                        r.asDict()
                        for r in faults.where((F.col(SPACE_N) == n) & (F.col("check") == FAULT_CHAIN))
                        .drop(SPACE_N)
                        .limit(3)
                        .collect()
                    ]
                    if breaks
                    else []
                )
                out.append(Verification(breaks, examples, counts.get((n, FAULT_UUID), 0)))
            return out
        finally:
            faults.unpersist()

    def _open_versions(self, folder: str, buckets: Sequence[int]) -> DataFrame | None:
        """The versions of ``buckets`` a transaction compares with HEAD: their open rows' files where
        they keep them apart (``OPEN_PREFIX``), else the whole bucket. Other rows are left out, so the
        read costs the buckets' keys, not their history; a column only other rows have is null here,
        and a state leaves nulls out. Read with the table's kept columns (``stored_table_schema``), or
        for a lake from before they were kept with the files' schemas merged (a Spark job)."""
        names = self.lake.folder_file_names(VERSIONS_DS, BUCKET, buckets, subfolder=folder)
        opened = {b: [n for n in ns if n.startswith(OPEN_PREFIX)] for b, ns in names.items()}
        schema = stored_table_schema(self.lake, folder)
        parts = [
            self.lake.read_folder_files(
                self.spark, VERSIONS_DS, BUCKET, {b: ns for b, ns in opened.items() if ns}, schema, subfolder=folder
            )
        ]
        whole = [int(b) for b, ns in opened.items() if not ns]
        if whole:
            parts.append(
                self.lake.read_folders(self.spark, VERSIONS_DS, BUCKET, whole, subfolder=folder, schema=schema)
            )
        present = [p for p in parts if p is not None]
        if not present:
            return None
        return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), present)

    def _commit_staged(
        self, st: _Staged, global_id: int, table: str, commit_msg: str, commit_json: dict[str, Any]
    ) -> Commit:
        """Write the transaction's record: the commit point."""
        commit = Commit(
            space=st.space,
            txn=st.txn,
            tnx=st.tnx,
            ts=st.ts,
            id=global_id,
            schema=self.schema,
            table=table,
            commit_msg=commit_msg,
            commit_json={
                **commit_json,
                "first_i": st.first_i,
                "last_i": st.first_i + st.total - 1,
                "actions": {Action(a).name: n for a, n in sorted(st.counts.items())},
                "buckets": st.changed_buckets,
            },
        )
        self.fs.write_text(f"{self._log_uri(st.folder)}/{st.txn:012d}.json", commit.to_json())
        self.verifications[(st.space, st.txn)] = st.verification
        return commit

    def _advance_heads(self, staged: Sequence[_Staged], buckets: int | None) -> None:
        """Move the HEADs past committed transactions, in one write (``recover`` does it for a space
        whose HEAD a crash left behind), then save each space's state."""
        if not staged:
            return
        moved = advance_head(_tagged([st.head for st in staged]), _tagged([st.rows for st in staged]), [SPACE_N])
        self.lake.replace_in_subfolders(
            moved, HEAD_DS, BUCKET, [(st.folder, st.changed_buckets) for st in staged], by=SPACE_N
        )
        for st in staged:
            self._write_state(st.folder, {"head_txn": st.txn, "signatures": st.now_sigs, "buckets": buckets})

    def verification(self, space: str, txn: int) -> Verification | None:
        """What ``record`` found wrong in the rows of transaction ``txn`` of ``space`` (this store's only)."""
        return self.verifications.get((space, txn))

    # -- reading --------------------------------------------------------------------------------

    def _committed(self, space: str) -> tuple[str, Commit]:
        """The space's lake folder and newest transaction; HistoryError for a space without history."""
        folder = entity_folder(space)
        latest = self.latest(folder)
        if latest is None:
            known = ", ".join(sorted(self.spaces())) or "none"
            raise HistoryError(f"no transaction history for space {space!r} (spaces: {known})")
        return folder, latest

    def folder_of(self, space: str) -> str:
        return self._committed(space)[0]

    def history(self, space: str, txns: Sequence[int] | None = None) -> DataFrame:
        """The history rows of the space (HISTORY): of every committed transaction, or of ``txns``."""
        folder, latest = self._committed(space)
        # Rows of a transaction whose record is missing (a crash before the commit) are not history.
        return self._history_rows(folder, txns).where(F.col(TXN) <= F.lit(latest.txn))

    def head(self, space: str) -> DataFrame:
        return self._head(self.folder_of(space), None)

    def resolve(self, space: str, at: str | int | None) -> int | None:
        """A transaction id from ``at``: None (the newest), a tnx, ``txn:N`` or a tag name."""
        if at is None:
            return None
        if isinstance(at, int) or (isinstance(at, str) and at.lstrip("-").isdigit()):
            return int(at)
        if at.startswith("txn:"):
            wanted = at[4:]
            commit = self.commit(space, int(wanted)) if wanted.isdigit() else None
            if commit is None:
                raise HistoryError(f"space {space!r} has no transaction {wanted}")
            return commit.tnx
        tags = self.tags(space)
        if at not in tags:
            raise HistoryError(f"space {space!r} has no tag {at!r} (tags: {', '.join(sorted(tags)) or 'none'})")
        return int(tags[at]["tnx"])

    def state(
        self, space: str, *, at: str | int | None = None, ts: datetime | None = None, ids: Sequence[str] | None = None
    ) -> DataFrame:
        """The space (or the features ``ids``) as of a transaction or a time: one row per feature."""
        rows = self.history(space)
        if ids is not None:
            rows = rows.where(F.col("id").isin(list(ids)))
        return as_of(rows, tnx=self.resolve(space, at), ts=ts)

    def diff(self, space: str, before: str | int, after: str | int | None = None) -> DataFrame:
        rows = self.history(space)
        return difference(as_of(rows, tnx=self.resolve(space, before)), as_of(rows, tnx=self.resolve(space, after)))

    def layer_view(
        self, base: str, delta: str, *, base_at: str | int | None = None, delta_at: str | int | None = None
    ) -> DataFrame:
        return layer(self.state(base, at=base_at), self.state(delta, at=delta_at))

    # -- tags -----------------------------------------------------------------------------------

    def tags(self, space: str) -> dict[str, dict[str, Any]]:
        text = self.fs.read_text(self._tags_uri(self.folder_of(space)))
        return json.loads(text) if text else {}

    def tag(self, space: str, name: str, at: str | int | None = None, message: str = "") -> dict[str, Any]:
        """Name a transaction of the space (the newest by default); an existing name is moved."""
        if not name or name.startswith("txn:") or name.lstrip("-").isdigit() or len(name) > 200:
            raise HistoryError(f"bad tag name {name!r}: 1 to 200 characters, not a number and not 'txn:...'")
        folder = self.folder_of(space)
        commits = self.commits(space)
        tnx = self.resolve(space, at) if at is not None else commits[-1].tnx
        if tnx not in {c.tnx for c in commits}:
            raise HistoryError(f"space {space!r} has no transaction with tnx {tnx}")
        with self.writer_lock():
            tags = self.tags(space)
            tags[name] = {"tnx": tnx, "ts": self.clock().astimezone(UTC).isoformat(), "message": message}
            self.fs.write_text(self._tags_uri(folder), json.dumps(tags, sort_keys=True))
        return tags[name]

    def untag(self, space: str, name: str) -> None:
        folder = self.folder_of(space)
        with self.writer_lock():
            tags = self.tags(space)
            if name not in tags:
                raise HistoryError(f"space {space!r} has no tag {name!r}")
            del tags[name]
            self.fs.write_text(self._tags_uri(folder), json.dumps(tags, sort_keys=True))


def _tagged(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames (of the same columns) as one, each row with ``SPACE_N``: its frame's index."""
    return functools.reduce(DataFrame.unionByName, [f.withColumn(SPACE_N, F.lit(n)) for n, f in enumerate(frames)])


def publish(store: HistoryStore, url: str, schema: str, rows_per_partition: int = 100_000) -> dict[str, Any]:
    """Bring PostgreSQL up to the lake: every space's unpublished rows, transactions and tags.

    A space's watermark is the last ``i`` of its newest *published transaction*; a transaction's row
    is inserted only after all its history rows are, so a publication that fails midway is simply
    redone (rows are inserted idempotently) by the next one. Rows go from the executors.
    """
    spaces = store.spaces()
    conn = history_pg.connect(url)
    try:
        history_pg.install(conn, schema)
        geo = {space: history_pg.ensure_space_tables(conn, schema, space).has_geo for space in spaces}
        conn.commit()
        out: dict[str, Any] = {}
        for space in sorted(spaces):
            done = history_pg.published_last_i(conn, schema, space)
            with conn.cursor() as cur:
                cur.execute(
                    """SELECT COALESCE(MAX((commit_json->>'txn')::int8), 0) FROM xyz_config.transactions
                       WHERE space = %s AND "schema" = %s""",
                    (space, schema),
                )
                done_txn = int(cur.fetchone()[0])
            commits = [c for c in store.commits(space, after=done_txn) if c.last_i > done]
            if not commits:
                out[space] = {"rows": 0, "transactions": 0}
                continue
            rows = store.history(space, [c.txn for c in commits]).where(F.col("i") > done)
            n = sum(c.last_i - max(c.first_i, done + 1) + 1 for c in commits)
            parts = max(1, min(64, -(-n // rows_per_partition)))
            features = cluster_by(feature_rows(rows), "id", partitions=parts)
            stats = on_each_partition(  # one small dict per partition
                features, lambda it, space=space: history_pg.publish_partition(it, url, schema, space)
            )
            inserted = history_pg.publish_transactions(
                conn,
                [
                    {
                        "i": c.id,
                        "id": c.id,
                        "tnx": c.tnx,
                        "schema": c.schema,
                        "table": history_pg.history_table_names(space)[0],
                        "ts": c.ts,
                        "space": c.space,
                        "commit_msg": c.commit_msg,
                        "commit_json": {**c.commit_json, "txn": c.txn},
                    }
                    for c in commits
                ],
            )
            history_pg.replace_tags(
                conn,
                space,
                [{"name": k, **v, "ts": datetime.fromisoformat(v["ts"])} for k, v in store.tags(space).items()],
            )
            conn.commit()
            out[space] = {
                "rows": sum(s["history_inserted"] for s in stats),
                "transactions": inserted,
                "geo_column": geo[space],
            }
        return out
    finally:
        conn.close()
