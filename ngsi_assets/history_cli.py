"""``ngsi-assets history``: inspect and rewind the transaction history from the shell.

Every answer is JSON lines on stdout (one object per row), so it pipes into ``jq``; errors go to
stderr with exit status 2. ``--at`` takes a tnx, ``txn:N`` (the space's N-th transaction) or a tag.

    ngsi-assets history spaces
    ngsi-assets history log product
    ngsi-assets history show product --at txn:3            # the space as of its third transaction
    ngsi-assets history show product --time 2026-03-01T10:40:00Z --id A
    ngsi-assets history feature product A                  # every state feature A had
    ngsi-assets history diff product txn:1 txn:3
    ngsi-assets history tag product release-1 --at txn:3 -m "before the migration"
    ngsi-assets history layer product override --base-at release-1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lake-root", default=None, help="lake folder or URI (default: $NGSI_LAKE_ROOT, else .data/lake)"
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("spaces", help="the spaces with history, with their newest transaction")
    p = sub.add_parser("log", help="a space's transactions, oldest first")
    p.add_argument("space")
    p = sub.add_parser("show", help="the state of a space (or of some features) as of a transaction or time")
    p.add_argument("space")
    _add_at(p, "--at")
    p.add_argument("--time", type=_timestamp, default=None, help="ISO time with zone: the state at that time")
    p.add_argument("--id", action="append", default=None, help="only this feature id (repeatable)")
    p.add_argument("--live", action="store_true", help="leave deleted features out")
    p = sub.add_parser("feature", help="every history row of one feature, oldest first")
    p.add_argument("space")
    p.add_argument("id")
    p = sub.add_parser("diff", help="features that differ between two transactions")
    p.add_argument("space")
    p.add_argument("before", help="tnx, txn:N or tag")
    p.add_argument("after", nargs="?", default=None, help="tnx, txn:N or tag (default: newest)")
    p = sub.add_parser("tag", help="name a transaction (the newest by default); moves an existing tag")
    p.add_argument("space")
    p.add_argument("name")
    _add_at(p, "--at")
    p.add_argument("-m", "--message", default="")
    p = sub.add_parser("untag", help="delete a tag")
    p.add_argument("space")
    p.add_argument("name")
    p = sub.add_parser("tags", help="a space's tags")
    p.add_argument("space")
    p = sub.add_parser("layer", help="a delta space read through onto a base space")
    p.add_argument("base")
    p.add_argument("delta")
    _add_at(p, "--base-at")
    _add_at(p, "--delta-at")


def _add_at(parser: argparse.ArgumentParser, flag: str) -> None:
    parser.add_argument(flag, default=None, help="tnx, txn:N or tag (default: newest)")


def _timestamp(text: str) -> datetime:
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if ts.tzinfo is None:
        raise argparse.ArgumentTypeError(f"time {text!r} has no zone; add Z or +HH:MM")
    return ts


def _emit(rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    for row in rows:
        sys.stdout.write(json.dumps(row, default=str, sort_keys=True) + "\n")
        n += 1
    return n


def _rows(df: Any, order: list[str]) -> Iterator[dict[str, Any]]:
    """A result's rows, state parsed (``toLocalIterator``: one partition at a time, not all at once)."""
    for r in df.orderBy(*order).toLocalIterator():
        d = r.asDict()
        for key in ("state", "state_before", "state_after"):
            if d.get(key) is not None:
                d[key] = json.loads(d[key])
        d.pop("state_hash", None)
        yield d


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    from ngsi_assets import settings
    from ngsi_assets.history_store import HistoryError, HistoryStore
    from resources.lake import LakeResource
    from resources.spark import default_spark_config

    builder = SparkSession.builder
    conf = default_spark_config(ui=False)
    if "spark.remote" not in conf:
        conf["spark.log.level"] = "ERROR"  # the driver is this process: keep its stderr to errors
    for k, v in conf.items():
        builder = builder.config(k, str(v))
    # The JVM inherits file descriptor 1 when it starts, and its logging writes there: give it stderr,
    # so stdout carries only the JSON lines.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        spark = builder.getOrCreate()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    store = HistoryStore(spark, LakeResource(root=args.lake_root or settings.lake_root()))
    try:
        return _answer(store, args)
    except HistoryError as exc:
        sys.stderr.write(f"ngsi-assets history: {exc}\n")
        return 2


def _answer(store: Any, args: argparse.Namespace) -> int:
    from ngsi_assets.ngsi.transactions import Action
    from ngsi_assets.transforms.transaction_history import live

    a = args.action
    if a == "spaces":
        _emit(
            {"space": space, "transactions": c.txn, "tnx": c.tnx, "ts": c.ts.isoformat(), "last_i": c.last_i}
            for space, c in sorted(store.newest().items())
        )
    elif a == "log":
        _emit(c.as_dict() for c in store.commits(args.space))
    elif a == "show":
        state = store.state(args.space, at=args.at, ts=args.time, ids=args.id)
        if args.live:
            state = live(state)
        _emit(_named(_rows(state.drop("txn", "bucket"), ["id"]), Action))
    elif a == "feature":
        rows = store.history(args.space)
        rows = rows.where(rows["id"] == args.id)
        _emit(_named(_rows(rows.drop("bucket"), ["i"]), Action))
    elif a == "diff":
        _emit(_rows(store.diff(args.space, args.before, args.after), ["id"]))
    elif a == "tag":
        _emit([{"space": args.space, "name": args.name, **store.tag(args.space, args.name, args.at, args.message)}])
    elif a == "untag":
        store.untag(args.space, args.name)
    elif a == "tags":
        _emit({"name": n, **t} for n, t in sorted(store.tags(args.space).items()))
    elif a == "layer":
        _emit(_rows(store.layer_view(args.base, args.delta, base_at=args.base_at, delta_at=args.delta_at), ["id"]))
    return 0


def _named(rows: Iterable[dict[str, Any]], action: Any) -> Iterator[dict[str, Any]]:
    for row in rows:
        row["action"] = action(row["action"]).name
        yield row
