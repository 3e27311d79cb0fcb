"""Increments: what a continuous run processes, as byte ranges of landing segments.

The landing sensor asks for a run of one hour with the tag ``ngsi/increment``: the ranges of that
hour's segments that landed since the previous increment, each ending at a line boundary. The run's
assets read only those lines and add their rows to the hour as the increment's own files, so
writing an increment again replaces exactly its rows. A run without the tag (a backfill, a
materialization from the UI) recomputes its hours whole.

The message store keeps, in each hour's folder, how far into each segment its rows go
(``_positions.json``). A whole-hour run writes it with the rows it swaps in; an increment run
advances it after its rows are in. An increment reads only past those positions, so an increment
run after a whole-hour run (or run twice) never stores a line twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resources.parallel import DEFAULT_WORKERS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from resources.lake import LakeResource

INCREMENT_TAG = "ngsi/increment"
POSITIONS_FILE = "_positions.json"
# An increment run with this tag also takes what landed in its hour after it was asked for, up to
# the moment its message store starts: the landing sensor's increments, so that a run can wait while
# another executes without leaving what lands meanwhile to the run after it. What it takes is its
# claim, written once (``claim_file``) before any row is stored, so a rerun takes exactly the same.
EXTENDS_TAG = "ngsi/increment-extends"
# How many independent pieces of a run (entities, history spaces) its assets process side by side.
# The landing sensor gives its derived runs a narrow width so that they leave the cores to the
# increments that run beside them; a run without the tag uses the assets' default.
SIDE_BY_SIDE_TAG = "ngsi/side-by-side"


# The landing sensor's derived runs fold only the increments a derived asset (the versioned entities,
# the STH aggregates) has not folded yet, on top of what it folded before; a run without the tag folds
# its hours whole.
NEW_INCREMENTS_TAG = "ngsi/new-increments"


def folds_new_increments(tags: Mapping[str, str]) -> bool:
    """Whether a run with ``tags`` folds only the increments a derived asset has not folded yet: a
    derived run, or an increment run (its own increment, and any an earlier run did not get to)."""
    return bool(tags.get(NEW_INCREMENTS_TAG) or tags.get(INCREMENT_TAG))


# In each hour folder of a derived asset's ledger dataset: what of the hour the asset holds (``HourContent``).
FOLDED_FILE = "_folded.json"


@dataclass(frozen=True)
class HourContent:
    """What of an hour a derived asset folded: the names of the message store's and the events'
    whole-hour files, the increments whose events were all in, and the ids (``batch_id``) of the
    batches of increments folded on top of the whole hour (their rows in the hour's message log)."""

    whole: Mapping[str, Sequence[str]]
    increments: frozenset[str]
    batches: frozenset[str] = frozenset()

    def to_text(self) -> str:
        whole = {k: sorted(v) for k, v in sorted(self.whole.items())}
        return json.dumps(
            {"whole": whole, "increments": sorted(self.increments), "batches": sorted(self.batches)}, sort_keys=True
        )

    def with_batch(self, increments: Sequence[str]) -> HourContent:
        return HourContent(self.whole, self.increments | set(increments), self.batches | {batch_id(increments)})

    @staticmethod
    def from_text(text: str | None) -> HourContent | None:
        """None for no text or damaged text (the hour is then folded whole again)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            whole = {str(k): sorted(str(n) for n in v) for k, v in raw["whole"].items()}
            return HourContent(
                whole, frozenset(str(i) for i in raw["increments"]), frozenset(str(b) for b in raw.get("batches", []))
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def new_increments(self, now: HourContent) -> list[str] | None:
        """The increments of ``now`` to fold on top of this content, or None when the hour must be
        folded whole: its whole-hour files changed (a repair or a backfill rewrote it) or an
        increment folded before is gone."""
        same_whole = {k: sorted(v) for k, v in self.whole.items()} == {k: sorted(v) for k, v in now.whole.items()}
        if not same_whole or not self.increments <= now.increments:
            return None
        return sorted(now.increments - self.increments)


def hour_content(lake: LakeResource, key: str) -> HourContent:
    """What of an hour a derived run folds: the whole-hour files, and the increments whose events are all in."""
    whole = {ds: lake.whole_hour_files(ds, key) for ds in ("message_store", "ngsi_events")}
    marked = lake.increment_ids("ngsi_events", key, marked_done=True)
    # An hour whose increments were written before ``ngsi_events`` marked them: every stored one
    # counts, as it did then.
    done = marked | lake.increment_ids("ngsi_events", key) if marked else lake.increment_ids("message_store", key)
    return HourContent(whole, frozenset(done))


@dataclass(frozen=True)
class FoldPlan:
    """What a derived asset's run folds. ``contents``: per hour, what it holds now (the increments in
    flight left out). ``todo``: the increments to fold on top of what the one hour's ledger says the
    asset holds (``folded``); ``[]`` when there is nothing new, None when the hours are folded whole."""

    contents: Mapping[str, HourContent]
    folded: HourContent | None
    todo: list[str] | None

    @staticmethod
    def of(
        lake: LakeResource, keys: Sequence[str], ledger: str, *, new_only: bool, outputs: Sequence[str] = ()
    ) -> FoldPlan:
        """Read the hours' contents and (``new_only``, one hour) the ledger's ``FOLDED_FILE``.

        With no ledger, the hour is folded whole, except when (``outputs``: the asset's hourly
        datasets, the ledger among them) the hour holds only increments and none of ``outputs`` holds
        a file of it: then nothing of the hour was ever folded, and its increments are the first batch
        on top of an empty hour (continuous mode's first derived run of each hour).
        """
        contents = {k: hour_content(lake, k) for k in keys}
        folded = None
        if new_only and len(keys) == 1:
            key = keys[0]
            folded = HourContent.from_text(lake.read_hour_file(ledger, key, FOLDED_FILE))
            if folded is None and outputs and _nothing_folded(lake, key, contents[key], outputs):
                folded = HourContent(contents[key].whole, frozenset())  # no whole-hour files: empty
        todo = folded.new_increments(contents[keys[0]]) if folded is not None else None
        return FoldPlan(contents, folded, todo)

    @property
    def batch(self) -> str | None:
        """The id of the files a batch adds to its hour, or None when the run folds nothing on top."""
        return batch_id(self.todo) if self.todo else None

    def read(self, lake: LakeResource, spark: SparkSession, dataset: str, schema: StructType) -> DataFrame:
        """The rows of ``dataset`` the run folds: the batch's increments of the one hour; or each hour's
        whole-hour files and done increments (one whose events are still being written is left to the
        next run, which the ledger tells)."""
        if self.todo:
            key = next(iter(self.contents))
            return lake.read_hour_parts(spark, dataset, schema, {key: self.todo}, whole=False)
        parts = {k: c.increments for k, c in self.contents.items()}
        return lake.read_hour_parts(spark, dataset, schema, parts)

    def unfinished_batches(self, lake: LakeResource, dataset: str) -> set[str]:
        """The batches whose files ``dataset`` holds in the hour but the ledger does not name: their
        runs were killed before it did (the batch folded now includes their increments)."""
        assert self.folded is not None and self.todo
        return lake.increment_ids(dataset, next(iter(self.contents))) - self.folded.batches

    def drop_unfinished_batches(self, lake: LakeResource, datasets: Sequence[str]) -> None:
        """Remove from the hour the files of the unfinished batches."""
        key = next(iter(self.contents))
        for ds in datasets:
            for stale in self.unfinished_batches(lake, ds):
                lake.delete_increment(ds, key, stale)

    def record(self, lake: LakeResource, ledger: str) -> None:
        """Write each hour's ledger once its rows are all in: the batch on top, or what it was folded from."""
        assert self.todo != [], "nothing new was folded: the ledger stays as it is"
        if self.todo:
            assert self.folded is not None
            key = next(iter(self.contents))
            lake.write_hour_file(ledger, key, FOLDED_FILE, self.folded.with_batch(self.todo).to_text())
            return
        for key, content in self.contents.items():
            lake.write_hour_file(ledger, key, FOLDED_FILE, content.to_text())


def _nothing_folded(lake: LakeResource, key: str, content: HourContent, outputs: Sequence[str]) -> bool:
    """The hour's inputs are increments only, and no output dataset holds a file of the hour: not a
    whole-hour file (a whole fold killed before its ledger) nor a batch's (a first batch killed so)."""
    if any(content.whole.values()):
        return False
    return not any(lake.whole_hour_files(ds, key) or lake.increment_ids(ds, key) for ds in outputs)


def batch_id(increment_ids: Sequence[str]) -> str:
    """The id of the files a run that folds these increments adds to an hour (hex, like an increment's)."""
    return hashlib.sha256(json.dumps(sorted(increment_ids)).encode()).hexdigest()[:20]


def side_by_side_width(tags: Mapping[str, str], default: int = DEFAULT_WORKERS) -> int:
    """The run's ``ngsi/side-by-side`` tag (a whole number from 1), else ``default``."""
    text = tags.get(SIDE_BY_SIDE_TAG)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"run tag {SIDE_BY_SIDE_TAG}={text!r}: expected a whole number from 1")
    return int(text)


def segment_hour(name: str) -> str:
    """The hourly partition key of a segment named ``dt=YYYY-MM-DD-HH/<file>`` (relative to the root)."""
    return name.split("/", 1)[0].removeprefix("dt=") + ":00"


@dataclass(frozen=True)
class Increment:
    """``ranges``: {segment name relative to the landing root: (start, end)}; ``id``: their digest."""

    id: str
    ranges: dict[str, tuple[int, int]]

    @staticmethod
    def of(ranges: Mapping[str, Sequence[int]]) -> Increment:
        clean = {str(k): (int(v[0]), int(v[1])) for k, v in sorted(ranges.items())}
        for name, (start, end) in clean.items():
            if not 0 <= start < end:
                raise ValueError(f"increment range of {name}: [{start}, {end}) is empty or negative")
        digest = hashlib.sha256(json.dumps(sorted(clean.items())).encode()).hexdigest()[:20]
        return Increment(digest, clean)

    def hour_of(self, partition_keys: Sequence[str]) -> str:
        """The one hour a run of this increment is for; its ranges must all be segments of that hour."""
        if len(partition_keys) != 1:
            raise ValueError(f"an increment run is for one hour, not {len(partition_keys)}: {list(partition_keys)[:3]}")
        key = partition_keys[0]
        foreign = sorted(n for n in self.ranges if segment_hour(n) != key)
        if foreign:
            raise ValueError(f"increment {self.id} of hour {key} names segments of other hours: {foreign[:3]}")
        return key

    def to_tag(self) -> str:
        return json.dumps({"id": self.id, "ranges": {k: list(v) for k, v in self.ranges.items()}}, sort_keys=True)

    @staticmethod
    def from_tags(tags: Mapping[str, str]) -> Increment | None:
        """The increment a run's tags ask for, or None for a whole-hour run; a damaged tag raises."""
        text = tags.get(INCREMENT_TAG)
        if not text:
            return None
        try:
            raw = json.loads(text)
            inc = Increment.of(raw["ranges"])
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"run tag {INCREMENT_TAG} is not an increment: {exc}") from exc
        if inc.id != raw.get("id"):
            raise ValueError(f"run tag {INCREMENT_TAG}: id {raw.get('id')!r} does not match its ranges ({inc.id})")
        return inc


# Per segment, the sorted, disjoint [start, end) ranges the message store holds of it (``POSITIONS_FILE``).
Positions = Mapping[str, Sequence[tuple[int, int]]]


def claim_file(increment_id: str) -> str:
    """The message store hour's file naming the ranges an extending increment took (``EXTENDS_TAG``)."""
    if not increment_id or not all(c in "0123456789abcdef" for c in increment_id):
        raise ValueError(f"bad increment id {increment_id!r}")
    return f"_claim-{increment_id}.json"


def claim_text(claim: Sequence[tuple[str, int, int]]) -> str:
    return json.dumps([[n, s, e] for n, s, e in claim])


def parse_claim(text: str) -> list[tuple[str, int, int]]:
    return [(str(n), int(s), int(e)) for n, s, e in json.loads(text)]


def reach(stored: Mapping[str, Sequence[Sequence[int]]], ranges: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Per segment, where an extending increment looks for more lines: past its own range, else past
    the last stored range (``LandingZoneResource.complete_ranges``'s ``positions``)."""
    out = {n: max(int(r[1]) for r in rs) for n, rs in stored.items() if rs}
    out.update({n: int(r[1]) for n, r in ranges.items()})
    return out


def extended(ranges: Mapping[str, Sequence[int]], landed: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, int]]:
    """``ranges`` grown by ``landed`` (per segment, [from, to) of the complete lines past ``reach``):
    a segment of ``ranges`` to the end of its landed lines, another segment with its landed lines."""
    out = {str(n): (int(r[0]), int(r[1])) for n, r in ranges.items()}
    for n, r in landed.items():
        start, end = int(r[0]), int(r[1])
        out[n] = (out[n][0], max(out[n][1], end)) if n in out else (start, end)
    return out


def parse_positions(text: str | None) -> dict[str, list[tuple[int, int]]]:
    """``_positions.json`` -> {segment name: sorted, disjoint [start, end) ranges stored}."""
    if not text:
        return {}
    return {str(k): [(int(r[0]), int(r[1])) for r in v] for k, v in json.loads(text).items()}


def positions_text(positions: Mapping[str, Sequence[Sequence[int]]]) -> str:
    return json.dumps({k: [list(r) for r in v] for k, v in sorted(positions.items())}, sort_keys=True)


def unread_ranges(
    ranges: Mapping[str, Sequence[int]], stored: Mapping[str, Sequence[Sequence[int]]]
) -> list[tuple[str, int, int]]:
    """The parts of ``ranges`` that no stored range covers, as (segment, start, end).

    Ranges are stored as they commit, in any order: an increment whose run died after its rows
    were in but before its range was recorded, rerun after a later increment, still finds its own
    range unread.
    """
    out = []
    for name, (start, end) in sorted(ranges.items()):
        pos = start
        for s, e in stored.get(name, ()):
            if e <= pos or s >= end:
                continue
            if s > pos:
                out.append((name, pos, s))
            pos = max(pos, e)
        if pos < end:
            out.append((name, pos, end))
    return out


def advanced(
    stored: Mapping[str, Sequence[Sequence[int]]], ranges: Sequence[tuple[str, int, int]]
) -> dict[str, list[tuple[int, int]]]:
    """``stored`` with ``ranges`` added, each segment's ranges merged where they touch."""
    out = {k: [(int(r[0]), int(r[1])) for r in v] for k, v in stored.items()}
    for name, start, end in ranges:
        out.setdefault(name, []).append((start, end))
    for name, rs in out.items():
        merged: list[tuple[int, int]] = []
        for s, e in sorted(rs):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        out[name] = merged
    return out
