"""The lake's commit journal: a write killed after any of its file operations is finished by the next
access to the dataset, so the dataset reads as if the write had not been interrupted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from resources.lake import (
    COMMITS,
    STAGING,
    STALE_COMMIT_S,
    FileSplit,
    FolderAdd,
    FolderWrite,
    LakeFiles,
    LakeResource,
    SubfoldersWrite,
    _process_start,
    apply_steps,
    staging_name,
    writer_gone,
)

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
HOUR = "2026-03-01-10:00"


class Killed(BaseException):
    """The process dies here: nothing after it runs (no handler catches a BaseException here)."""


class DyingFiles(LakeFiles):
    """Lake file operations that die at the ``die_at``-th rename or delete (1-based)."""

    def __init__(self, die_at: int) -> None:
        super().__init__()
        self.die_at = die_at
        self.calls = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls == self.die_at:
            raise Killed

    def rename(self, src: str, dst: str) -> None:
        self._tick()
        super().rename(src, dst)

    def delete(self, uri: str) -> None:
        self._tick()
        super().delete(uri)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and STAGING not in p.parts
    }


def _layout(root: Path) -> list[dict[str, str]]:
    """A dataset with folders a=1, b=1, c=1 and staged new a and b (c now has no rows), an increment
    folder with an old file replaced by two staged ones."""
    for name, text in (("ds/v=a/f", "old a"), ("ds/v=b/f", "old b"), ("ds/v=c/f", "old c"), ("inc/x-1", "old inc")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    st = root / STAGING / "ds" / "s1"
    for name, text in (("v=a/g", "new a"), ("v=b/g", "new b"), ("i/1", "inc 1"), ("i/2", "inc 2")):
        (st / name).parent.mkdir(parents=True, exist_ok=True)
        (st / name).write_text(text)
    return [
        {"op": "swap", "new": f"{st}/v=a", "final": f"{root}/ds/v=a", "old": f"{st}-old-a"},
        {"op": "swap", "new": f"{st}/v=b", "final": f"{root}/ds/v=b", "old": f"{st}-old-b"},
        {"op": "empty", "final": f"{root}/ds/v=c", "old": f"{st}-old-c"},
        {"op": "delete", "uri": f"{root}/inc/x-1"},
        {"op": "move", "src": f"{st}/i/1", "dst": f"{root}/inc/y-1"},
        {"op": "move", "src": f"{st}/i/2", "dst": f"{root}/inc/y-2"},
        {"op": "delete", "uri": str(st)},
    ]


EXPECTED = {"ds/v=a/g": "new a", "ds/v=b/g": "new b", "inc/y-1": "inc 1", "inc/y-2": "inc 2"}


def test_journal_steps_applied_whole_give_the_new_layout(tmp_path: Path) -> None:
    steps = _layout(tmp_path)
    apply_steps(LakeFiles(), steps)
    assert _tree(tmp_path) == EXPECTED
    assert not (tmp_path / STAGING / "ds").exists() or not any((tmp_path / STAGING / "ds").iterdir())


def test_journal_steps_cut_after_any_operation_then_applied_again_give_the_same_layout(tmp_path: Path) -> None:
    counting = DyingFiles(die_at=0)
    apply_steps(counting, _layout(tmp_path / "count"))
    total = counting.calls
    assert total >= 10
    for k in range(1, total + 1):
        root = tmp_path / f"cut{k}"
        steps = _layout(root)
        with pytest.raises(Killed):
            apply_steps(DyingFiles(die_at=k), steps)
        apply_steps(LakeFiles(), steps)  # the recovery
        assert _tree(root) == EXPECTED, f"cut at operation {k}"
        assert not any((root / STAGING / "ds").iterdir()), f"staging left after a cut at operation {k}"
        apply_steps(LakeFiles(), steps)  # and once more: nothing changes
        assert _tree(root) == EXPECTED, f"applied twice after a cut at operation {k}"


def test_a_journal_is_finished_only_when_its_writer_is_gone() -> None:
    me = socket.gethostname()
    now = time.time()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert writer_gone({"host": me, "pid": gone.pid, "start": "1"}, now)
    parent = os.getppid()
    start = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert not writer_gone({"host": me, "pid": parent, "start": start}, now)  # running
    assert writer_gone({"host": me, "pid": parent, "start": str(int(start) + 1)}, now)  # its pid, reused
    # Another machine: finished only once stale.
    assert not writer_gone({"host": me + "-elsewhere", "pid": 1, "start": "1"}, now - 5, now)
    assert writer_gone({"host": me + "-elsewhere", "pid": 1, "start": "1"}, now - STALE_COMMIT_S - 1, now)


# -- the lake's writes, killed in process at every file operation -----------------------------------


def _kill_at_each_file_operation(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write: Callable[[LakeResource, int], None],
    read: Callable[[LakeResource], T],
) -> tuple[T, int]:
    """A reference lake gets ``write(lake, 1)`` then ``write(lake, 2)``; ``read`` of it is what is
    expected. Then for k = 1, 2, ...: a fresh lake gets ``write(lake, 1)``, then ``write(lake, 2)``
    killed at its k-th file operation; the next ``read`` must give the expected rows (the write
    finished), with no journal left. Ends at the first k the write outlives; returns (expected, k)."""
    reference = LakeResource(root=str(tmp_path / "ref"))
    write(reference, 1)
    write(reference, 2)
    expected = read(reference)
    k = 1
    while True:
        lake = LakeResource(root=str(tmp_path / f"cut{k}"))
        write(lake, 1)
        dying = DyingFiles(die_at=k)
        monkeypatch.setattr(LakeResource, "files", lambda self, f=dying: f)
        try:
            write(lake, 2)
        except Killed:
            monkeypatch.undo()
            assert read(lake) == expected, f"killed at file operation {k}"
            assert not list((tmp_path / f"cut{k}" / STAGING / COMMITS).rglob("*.json"))
            k += 1
            continue
        monkeypatch.undo()
        return expected, k


def _bucket_rows(spark: SparkSession, lake: LakeResource) -> list[tuple]:
    df = lake.read_folders(spark, "state", "bucket", None, subfolder="pg")
    return sorted(tuple(r) for r in df.select("k", "v", "bucket").collect()) if df is not None else []


def _write_buckets(spark: SparkSession, lake: LakeResource, version: int) -> None:
    rows = [(f"k{i}", version, i % 3) for i in range(6) if not (version == 2 and i % 3 == 2)]
    df = spark.createDataFrame(rows, "k string, v int, bucket int")
    lake.replace_folders(df, "state", "bucket", [0, 1, 2], subfolder="pg")


@pytest.mark.spark
def test_replace_folders_killed_at_any_file_operation_reads_as_finished(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets 0..2 rewritten (bucket 2 now empty): whichever operation the kill follows, the next
    read finishes the write; the folders are never found missing."""
    expected, cuts = _kill_at_each_file_operation(
        tmp_path, monkeypatch, lambda lake, v: _write_buckets(spark, lake, v), lambda lake: _bucket_rows(spark, lake)
    )
    assert expected and {b for _, _, b in expected} == {0, 1}
    assert cuts > 4  # the write has at least the swaps of three buckets and the staging removal


def _subfolder_rows(spark: SparkSession, lake: LakeResource) -> dict[str, list[tuple]]:
    out = {}
    for sub in ("pg", "my"):
        df = lake.read_folders(spark, "state", "bucket", None, subfolder=sub)
        out[sub] = sorted(tuple(r) for r in df.select("k", "v", "bucket").collect()) if df is not None else []
    return out


def _write_subfolders(spark: SparkSession, lake: LakeResource, version: int) -> None:
    """Subfolder pg (n=0): buckets 0..2, bucket 2 empty from version 2 on; subfolder my (n=1): bucket 5."""
    rows = [(f"k{i}", version, i % 3, 0) for i in range(6) if not (version == 2 and i % 3 == 2)]
    rows += [(f"m{i}", version, 5, 1) for i in range(2)]
    df = spark.createDataFrame(rows, "k string, v int, bucket int, n int")
    lake.replace_in_subfolders(df, "state", "bucket", [("pg", [0, 1, 2]), ("my", [5])], by="n")


@pytest.mark.spark
def test_replace_in_subfolders_killed_at_any_file_operation_reads_as_finished(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two subfolders written by one write: whichever operation the kill follows, the next read
    finishes the write in both; ``n`` is not stored."""
    expected, cuts = _kill_at_each_file_operation(
        tmp_path,
        monkeypatch,
        lambda lake, v: _write_subfolders(spark, lake, v),
        lambda lake: _subfolder_rows(spark, lake),
    )
    assert {b for _, _, b in expected["pg"]} == {0, 1} and {b for _, _, b in expected["my"]} == {5}
    assert {v for rows in expected.values() for _, v, _ in rows} == {2}
    stored = LakeResource(root=str(tmp_path / "ref")).read_folders(spark, "state", "bucket", None, subfolder="my")
    assert "n" not in stored.columns
    assert cuts > 5  # at least the swaps of four folders and the staging removal


@pytest.mark.spark
def test_replace_in_subfolders_refuses_rows_for_folders_not_asked_for(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    _write_subfolders(spark, lake, 1)
    before = _subfolder_rows(spark, lake)
    stray = spark.createDataFrame([("x", 9, 1, 0), ("y", 9, 7, 1)], "k string, v int, bucket int, n int")
    with pytest.raises(ValueError, match=r"rows for n=1 bucket \['7'\] were given to write state bucket \['5'\]"):
        lake.replace_in_subfolders(stray, "state", "bucket", [("pg", [1]), ("my", [5])], by="n")
    unknown = spark.createDataFrame([("x", 9, 1, 2)], "k string, v int, bucket int, n int")
    with pytest.raises(ValueError, match=r"rows for n=2 bucket \['1'\] were given"):
        lake.replace_in_subfolders(unknown, "state", "bucket", [("pg", [1]), ("my", [5])], by="n")
    with pytest.raises(ValueError, match="bad subfolder name"):
        lake.replace_in_subfolders(stray, "state", "bucket", [("../x", [1])], by="n")
    assert _subfolder_rows(spark, lake) == before
    assert not list((tmp_path / "lake" / STAGING / "state").glob("*"))


def _write_subfolders_together(spark: SparkSession, lake: LakeResource, version: int) -> None:
    """``_write_subfolders``'s rows as a ``SubfoldersWrite`` of ``replace_together``: pg gets buckets 0..2
    (bucket 2 empty from version 2 on), my bucket 5."""
    pg = [(f"k{i}", version, i % 3) for i in range(6) if not (version == 2 and i % 3 == 2)]
    schema = "k string, v int, bucket int"
    lake.replace_together(
        [
            SubfoldersWrite(
                [
                    FolderWrite(spark.createDataFrame(pg, schema), "state", "bucket", [0, 1, 2], subfolder="pg"),
                    FolderWrite(
                        spark.createDataFrame([(f"m{i}", version, 5) for i in range(2)], schema),
                        "state",
                        "bucket",
                        [5],
                        subfolder="my",
                    ),
                ]
            )
        ]
    )


@pytest.mark.spark
def test_subfolders_write_killed_at_any_file_operation_reads_as_finished(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two subfolders written by one Spark write of ``replace_together``: whichever operation the kill
    follows, the next read finishes the write in both, and the write's tag column is not stored."""

    expected, cuts = _kill_at_each_file_operation(
        tmp_path,
        monkeypatch,
        lambda lake, v: _write_subfolders_together(spark, lake, v),
        lambda lake: _subfolder_rows(spark, lake),
    )
    assert expected == {"pg": [(f"k{i}", 2, i % 3) for i in (0, 1, 3, 4)], "my": [("m0", 2, 5), ("m1", 2, 5)]}
    stored = LakeResource(root=str(tmp_path / "ref")).read_folders(spark, "state", "bucket", None, subfolder="pg")
    assert stored is not None and SubfoldersWrite.BY not in stored.columns
    assert cuts > 5  # at least the swaps of four folders and the staging removal


@pytest.mark.spark
def test_subfolders_write_refuses_stray_rows_and_mixed_writes(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    _write_subfolders_together(spark, lake, 1)
    before = _subfolder_rows(spark, lake)
    schema = "k string, v int, bucket int"
    good = FolderWrite(spark.createDataFrame([("x", 9, 1)], schema), "state", "bucket", [1], subfolder="pg")
    stray = FolderWrite(spark.createDataFrame([("y", 9, 7)], schema), "state", "bucket", [5], subfolder="my")
    with pytest.raises(ValueError, match=r"rows for _subfolder=1 bucket \['7'\] were given to write state bucket"):
        lake.replace_together([SubfoldersWrite([good, stray])])
    assert _subfolder_rows(spark, lake) == before
    assert not list((tmp_path / "lake" / STAGING / "state").glob("*"))
    with pytest.raises(ValueError, match="one write per subfolder"):
        SubfoldersWrite([good, good])
    with pytest.raises(ValueError, match="cannot share a Spark write"):
        SubfoldersWrite([good, replace(stray, dataset="other")])
    with pytest.raises(ValueError, match="not split, sorted or tuned"):
        SubfoldersWrite([good, replace(stray, sort_by=("k",))])
    with pytest.raises(ValueError, match="at least one write"):
        SubfoldersWrite([])
    with pytest.raises(ValueError, match="bad subfolder name"):
        lake.replace_together([SubfoldersWrite([replace(good, subfolder="../x")])])


@pytest.mark.spark
def test_append_increment_killed_at_any_file_operation_reads_as_finished(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An increment written again (its old files replaced) and killed part way: the next read of the
    hour holds its new rows once, and the other increment's rows untouched."""

    def write(lake: LakeResource, inc: str, values: range) -> None:
        df = spark.createDataFrame([(v, "2026-03-01-10") for v in values], "v int, dt string").repartition(2)
        lake.append_increment(df, "events", HOUR, inc)

    def rows(lake: LakeResource) -> list[int]:
        from pyspark.sql.types import IntegerType, StructField, StructType

        return sorted(
            r[0] for r in lake.read(spark, "events", StructType([StructField("v", IntegerType())]), [HOUR]).collect()
        )

    expected = sorted([*range(100, 104), *range(10, 16)])
    k = 1
    while True:
        lake = LakeResource(root=str(tmp_path / f"cut{k}"))
        write(lake, "aa", range(100, 104))
        write(lake, "bb", range(0, 5))
        dying = DyingFiles(die_at=k)
        monkeypatch.setattr(LakeResource, "files", lambda self, f=dying: f)
        try:
            write(lake, "bb", range(10, 16))
        except Killed:
            monkeypatch.undo()
            assert rows(lake) == expected, f"killed at file operation {k}"
            k += 1
            continue
        monkeypatch.undo()
        assert rows(lake) == expected
        break
    assert k > 3


def _split_buckets(spark: SparkSession, lake: LakeResource) -> None:
    """Buckets 0..2 of ``state/pg`` written whole, the rows with an even ``k`` number in ``open-`` files."""
    rows = [(f"k{i}", 1, i % 3, i % 2 == 0) for i in range(6)]
    df = spark.createDataFrame(rows, "k string, v int, bucket int, even boolean")
    lake.replace_together(
        [FolderWrite(df, "state", "bucket", [0, 1, 2], subfolder="pg", split=FileSplit("even", "open-"))]
    )


def _files(lake: LakeResource) -> dict[str, list[str]]:
    return {
        b: sorted(n.split("-")[0] for n in names)
        for b, names in lake.folder_file_names("state", "bucket", [0, 1, 2], subfolder="pg").items()
    }


@pytest.mark.spark
def test_a_split_write_keeps_the_flagged_rows_in_files_of_their_own(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    _split_buckets(spark, lake)
    assert _bucket_rows(spark, lake) == sorted((f"k{i}", 1, i % 3) for i in range(6))
    names = lake.folder_file_names("state", "bucket", [0, 1, 2], subfolder="pg")
    opened = {b: [n for n in v if n.startswith("open-")] for b, v in names.items()}
    assert all(len(v) == 1 for v in opened.values()), names
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    schema = StructType(
        [StructField("k", StringType()), StructField("v", IntegerType()), StructField("bucket", IntegerType())]
    )
    df = lake.read_folder_files(spark, "state", "bucket", opened, schema, subfolder="pg")
    assert df is not None and "even" not in df.columns
    assert sorted(tuple(r) for r in df.collect()) == sorted((f"k{i}", 1, i % 3) for i in range(0, 6, 2))
    assert not (tmp_path / "lake" / "state" / "pg" / "bucket=0" / "even=true").exists()


@pytest.mark.parametrize("prefix", ["", "open", "part-", "inc-", "_x-", ".x-", "a/b-", "-"])
def test_a_file_prefix_that_could_clash_with_other_files_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="bad file prefix"):
        FileSplit("c", prefix)
    with pytest.raises(ValueError, match="bad file prefix"):
        FolderAdd([], "state", "bucket", [0], remove_prefixes=(prefix,))


def _add(spark: SparkSession, lake: LakeResource) -> None:
    """Replace the open rows of buckets 0 and 1 (v 2) and add a delta file of new rows to bucket 1."""
    opened = spark.createDataFrame([("k0", 2, 0), ("k4", 2, 1)], "k string, v int, bucket int")
    delta = spark.createDataFrame([("d1", 3, 1)], "k string, v int, bucket int")
    lake.add_to_folders(
        FolderAdd(
            [(delta, "delta-ab-"), (opened, "open-")],
            "state",
            "bucket",
            [0, 1],
            subfolder="pg",
            remove_prefixes=("open-", "delta-ab-"),
        )
    )


@pytest.mark.spark
def test_add_to_folders_replaces_the_named_files_and_leaves_the_others(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    _split_buckets(spark, lake)
    expected = sorted(
        [("k0", 2, 0), ("k4", 2, 1), ("d1", 3, 1), ("k1", 1, 1), ("k3", 1, 0), ("k5", 1, 2), ("k2", 1, 2)]
    )
    _add(spark, lake)
    assert _bucket_rows(spark, lake) == expected
    _add(spark, lake)  # again: the same files replaced, nothing twice
    assert _bucket_rows(spark, lake) == expected
    assert _files(lake) == {"0": ["open", "part"], "1": ["delta", "open", "part"], "2": ["open", "part"]}


@pytest.mark.spark
def test_add_to_folders_killed_at_any_file_operation_reads_as_finished(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = LakeResource(root=str(tmp_path / "ref"))
    _split_buckets(spark, reference)
    _add(spark, reference)
    expected = _bucket_rows(spark, reference)
    k = 1
    while True:
        lake = LakeResource(root=str(tmp_path / f"cut{k}"))
        _split_buckets(spark, lake)
        dying = DyingFiles(die_at=k)
        monkeypatch.setattr(LakeResource, "files", lambda self, f=dying: f)
        try:
            _add(spark, lake)
        except Killed:
            monkeypatch.undo()
            assert _bucket_rows(spark, lake) == expected, f"killed at file operation {k}"
            assert _files(lake) == _files(reference), f"killed at file operation {k}"
            k += 1
            continue
        monkeypatch.undo()
        break
    assert k > 4  # two open files removed, three files moved in, two stagings removed


# -- a real SIGKILL, another process recovering ------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from pyspark.sql import SparkSession
    from resources.lake import LakeFiles, LakeResource
    from tests.resources.test_lake_commits import _write_buckets

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    lake = LakeResource(root={root!r})
    _write_buckets(spark, lake, 1)
    calls = [0]
    real = LakeFiles.rename

    def rename(self, src, dst):
        real(self, src, dst)
        calls[0] += 1
        if calls[0] == {after}:
            os.kill(os.getpid(), signal.SIGKILL)

    LakeFiles.rename = rename
    _write_buckets(spark, lake, 2)
    print("not killed")
    """
)


@pytest.mark.spark
def test_a_write_sigkilled_between_two_renames_is_finished_by_the_next_process(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The child's swap of bucket 0 is cut after moving the old folder aside (the bucket's folder is
    then missing): this process's read finds the journal of a dead process and finishes the write."""
    root = tmp_path / "lake"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(repo=str(REPO), root=str(root), after=1)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr[-3000:]
    assert not (root / "state" / "pg" / "bucket=0").exists()  # the window the journal covers
    assert list((root / STAGING / COMMITS / "state").glob("*.json"))
    reference = LakeResource(root=str(tmp_path / "ref"))
    _write_buckets(spark, reference, 1)
    _write_buckets(spark, reference, 2)
    assert _bucket_rows(spark, LakeResource(root=str(root))) == _bucket_rows(spark, reference)
    assert not list((root / STAGING / COMMITS / "state").glob("*.json"))


@pytest.mark.spark
def test_append_increment_of_no_rows_writes_nothing_for_no_rows_and_clears_an_earlier_attempt(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = LakeResource(root=str(tmp_path))
    schema = "v int, dt string"

    def increment_files() -> list[str]:
        return sorted(p.name for p in (tmp_path / "rejects" / "dt=2026-03-01-10").glob("inc-*.parquet"))

    def append(rows: list, inc: str) -> None:
        df = spark.createDataFrame(rows, schema)
        lake.append_increment(df, "rejects", HOUR, inc, empty=df.isEmpty())

    append([(1, "2026-03-01-10")], "aa")
    assert len(increment_files()) == 1
    # The same increment again, now without rows (the rerun of an increment whose rows changed):
    # its earlier file goes and no empty file is written.
    append([], "aa")
    assert increment_files() == []
    append([], "bb")
    assert increment_files() == []


@pytest.mark.spark
def test_a_write_of_several_folders_gives_each_one_file(spark: SparkSession, tmp_path: Path) -> None:
    """Rows of every bucket spread over four tasks: one file per bucket folder, not one per task."""
    from pyspark.sql import functions as F

    lake = LakeResource(root=str(tmp_path / "lake"))
    df = spark.range(400).select(F.col("id"), (F.col("id") % 8).cast("int").alias("bucket")).repartition(4, "id")
    lake.replace_folders(df, "many", "bucket", list(range(8)))
    folders = sorted((tmp_path / "lake" / "many").glob("bucket=*"))
    assert len(folders) == 8
    assert [len(list(f.glob("*.parquet"))) for f in folders] == [1] * 8
    assert lake.read_folders(spark, "many", "bucket", None).count() == 400


@pytest.mark.spark
def test_sorted_writes_keep_each_files_rows_in_order(spark: SparkSession, tmp_path: Path) -> None:
    """``sort_by``: the rows of every file written, replaced or added, in the order of those columns,
    whatever order the rows came in; a write split into files of its own is refused."""
    import pyarrow.parquet as pq

    lake = LakeResource(root=str(tmp_path / "lake"))
    rows = spark.range(600).select(
        (F.col("id") % 3).cast("int").alias("bucket"),
        F.format_string("k%03d", (F.col("id") * 7919) % 600).alias("k"),
        (F.col("id") % 5).alias("v"),
    )
    shuffled = rows.repartition(4, "v")
    lake.replace_folders(shuffled, "sorted", "bucket", [0, 1, 2], sort_by=("k", "v"))
    more = spark.range(600, 700).select(
        (F.col("id") % 2).cast("int").alias("bucket"),
        F.format_string("k%03d", (F.col("id") * 13) % 700).alias("k"),
        (F.col("id") % 5).alias("v"),
    )
    lake.replace_together([FolderAdd([(more.repartition(3, "v"), "add-")], "sorted", "bucket", [0, 1], sort_by=("k",))])
    files = sorted((tmp_path / "lake" / "sorted").glob("bucket=*/*.parquet"))
    assert len(files) == 5, files
    for f in files:
        got = [(r["k"], r["v"]) for r in pq.read_table(f).to_pylist()]
        if f.name.startswith("add-"):  # sorted by k alone
            got = [k for k, _ in got]
        assert got == sorted(got), f
    assert lake.read_folders(spark, "sorted", "bucket", None).count() == 700
    with pytest.raises(ValueError, match="cannot be sorted"):
        lake.replace_together(
            [FolderWrite(rows.withColumn("flag", F.lit(True)), "sorted", "bucket", [0, 1, 2],
                         split=FileSplit("flag", "open-"), sort_by=("k",))]
        )  # fmt: skip


@pytest.mark.spark
def test_row_group_bytes_bounds_the_row_groups_of_rows_with_large_maps(spark: SparkSession, tmp_path: Path) -> None:
    """``row_group_bytes``: files of rows carrying large maps (about 13 KB of keys each) are written as
    row groups of about that size, by a replace, an add and a write beside others; without it, each
    file is one row group (what Parquet's vectorized reader then decodes in one batch)."""
    import pyarrow.parquet as pq

    lake = LakeResource(root=str(tmp_path / "lake"))
    keys = F.transform(F.sequence(F.lit(1), F.lit(200)), lambda i: F.sha2(F.concat_ws("/", F.col("id"), i), 256))
    rows = spark.range(600).select(
        (F.col("id") % 2).cast("int").alias("bucket"),
        F.col("id"),
        F.map_from_arrays(keys, F.sequence(F.lit(1), F.lit(200))).alias("occur"),
    )
    bound = 1024 * 1024

    def row_groups(dataset: str) -> list[int]:
        files = sorted((tmp_path / "lake" / dataset).glob("bucket=*/*.parquet"))
        assert files, dataset
        meta = [pq.ParquetFile(f).metadata for f in files]
        return [m.row_group(g).total_byte_size for m in meta for g in range(m.num_row_groups)]

    lake.replace_folders(rows, "whole", "bucket", [0, 1])
    assert len(row_groups("whole")) == 2
    lake.replace_folders(rows, "bounded", "bucket", [0, 1], row_group_bytes=bound)
    lake.replace_together(
        [
            FolderAdd([(rows, "add-")], "added", "bucket", [0, 1], row_group_bytes=bound),
            FolderWrite(rows, "beside", "bucket", [0, 1], row_group_bytes=bound),
        ]
    )
    for dataset in ("bounded", "added", "beside"):
        sizes = row_groups(dataset)
        assert len(sizes) >= 6, (dataset, sizes)
        assert max(sizes) <= 2 * bound, (dataset, sizes)
        assert lake.read_folders(spark, dataset, "bucket", None).where(F.size("occur") == 200).count() == 600


def _staged(root: Path, dataset: str, name: str, age_s: float = 0.0) -> Path:
    folder = root / STAGING / dataset / name
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"rows of a write that never finished")
    if age_s:
        then = time.time() - age_s
        os.utime(folder, (then, then))
    return folder


@pytest.mark.spark
def test_staging_left_by_a_killed_write_is_removed_by_the_next_write_and_nothing_else_is(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A write killed while Spark staged its rows leaves a staging folder no journal names: the next
    write of the dataset removes it when its process is gone. Staging of live processes (this one,
    another one) and of other machines stays, unless it is older than ``STALE_STAGING_S``."""
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    tag = staging_name().split("-")[2]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    alive = subprocess.Popen(["sleep", "300"])
    try:
        alive_start = _process_start(alive.pid)
        left = {
            "dead writer": _staged(root, "state", f"w{dead_pid}-12345-{tag}-{'a' * 32}"),
            "dead writer's old folder": _staged(root, "state", f"w{dead_pid}-12345-{tag}-{'a' * 32}-old-3"),
            "unnamed writer, two days old": _staged(root, "state", "b" * 32, age_s=2 * 86400),
            "other machine, two days old": _staged(root, "state", f"w1-1-ffffffff-{'c' * 32}", age_s=2 * 86400),
        }
        kept = {
            "this process": _staged(root, "state", staging_name()),
            "live process": _staged(root, "state", f"w{alive.pid}-{alive_start}-{tag}-{'d' * 32}"),
            "unnamed writer, fresh": _staged(root, "state", "e" * 32),
            "other machine, fresh": _staged(root, "state", f"w1-1-ffffffff-{'f' * 32}"),
            "another dataset": _staged(root, "other", f"w{dead_pid}-12345-{tag}-{'0' * 32}"),
        }
        _write_buckets(spark, lake, 1)
        assert [k for k, p in left.items() if p.exists()] == []
        assert [k for k, p in kept.items() if not p.exists()] == []
        assert _bucket_rows(spark, lake) == [(f"k{i}", 1, i % 3) for i in range(6)]
        assert lake.sweep_staging("state") == 0
        assert lake.sweep_staging("other") == 1
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.spark
def test_replace_together_stages_every_write_before_swapping_any(spark: SparkSession, tmp_path: Path) -> None:
    """A write computed from the folders another write of the same call replaces reads them as they were
    before the call, and the folders of both end up replaced."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    _write_buckets(spark, lake, 1)
    before = lake.read_folders(spark, "state", "bucket", [0, 1, 2], subfolder="pg")
    assert before is not None
    copy = before.select("k", (F.col("v") * 10).alias("v"), "bucket")
    replaced = spark.createDataFrame([("z", 2, 0)], "k string, v int, bucket int")
    lake.replace_together(
        [
            FolderWrite(replaced, "state", "bucket", [0, 1, 2], subfolder="pg"),
            FolderWrite(copy, "copy", "bucket", [0, 1, 2]),
        ]
    )
    assert _bucket_rows(spark, lake) == [("z", 2, 0)]
    copied = lake.read_folders(spark, "copy", "bucket", None)
    assert copied is not None
    assert sorted(tuple(r) for r in copied.select("k", "v", "bucket").collect()) == [
        (f"k{i}", 10, i % 3) for i in range(6)
    ]
    assert not any(p.is_dir() for p in (tmp_path / "lake" / STAGING / "state").iterdir())


@pytest.mark.spark
def test_replace_together_swaps_nothing_when_one_write_fails(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    _write_buckets(spark, lake, 1)
    good = spark.createDataFrame([("z", 2, 0)], "k string, v int, bucket int")
    stray = spark.createDataFrame([("y", 3, 7)], "k string, v int, bucket int")  # bucket 7 was not asked for
    with pytest.raises(ValueError, match=r"rows for bucket \['7'\]"):
        lake.replace_together(
            [
                FolderWrite(good, "state", "bucket", [0, 1, 2], subfolder="pg"),
                FolderWrite(stray, "other", "bucket", [0]),
            ]
        )
    assert _bucket_rows(spark, lake) == [(f"k{i}", 1, i % 3) for i in range(6)]
    assert lake.read_folders(spark, "other", "bucket", None) is None
    for dataset in ("state", "other"):
        folder = tmp_path / "lake" / STAGING / dataset
        assert not folder.exists() or not any(folder.iterdir())


class RacedFiles:
    """The local file system, where another process removes part of a folder while this one deletes it:
    the recursive delete finds a file gone and fails the way pyarrow does."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()
        self.raced = 0

    def get_file_info(self, path: str) -> pafs.FileInfo:
        return self.local.get_file_info(path)

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def delete_dir(self, path: str) -> None:
        if self.raced < 2:
            self.raced += 1
            first = sorted(os.listdir(path))[0]
            os.remove(os.path.join(path, first))  # the other process's work
            raise FileNotFoundError(f"Cannot delete directory '{path}': '{first}' is gone")
        self.local.delete_dir(path)


def test_delete_finishes_a_folder_another_process_is_removing_at_the_same_time(tmp_path: Path) -> None:
    folder = tmp_path / "staging"
    folder.mkdir()
    for i in range(5):
        (folder / f"part-{i}.parquet").write_bytes(b"rows")
    files = LakeFiles()
    raced = RacedFiles()
    files._local = raced
    files.delete(str(folder))
    assert raced.raced == 2
    assert not folder.exists()
    files.delete(str(folder))  # already gone: nothing to do
    (tmp_path / "a-file").write_bytes(b"x")
    files.delete(str(tmp_path / "a-file"))
    assert not (tmp_path / "a-file").exists()


def test_threads_writing_one_dataset_finish_a_dead_writers_leftovers_once(tmp_path: Path) -> None:
    """The entities of a run are written side by side, each write first finishing what a killed run
    left: one dead journal and one abandoned staging folder are finished by exactly one thread, and no
    thread fails on what another removed."""
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    tag = staging_name().split("-")[2]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_writer = {"host": socket.gethostname(), "pid": int(dead.stdout), "start": "12345"}
    staging = _staged(root, "state", f"w{dead_writer['pid']}-12345-{tag}-{'a' * 32}")
    for i in range(300):
        (staging / f"part-{i:05d}.parquet").write_bytes(b"rows")
    final = root / "state" / "bucket=1"
    final.mkdir(parents=True)
    new = root / STAGING / "state" / "half-done"
    new.mkdir(parents=True)
    (new / "part-0.parquet").write_bytes(b"new rows")
    journal = root / STAGING / COMMITS / "state" / "dead.json"
    journal.parent.mkdir(parents=True)
    steps = [{"op": "swap", "new": str(new), "final": str(final), "old": str(final) + "-old"}]
    journal.write_text(json.dumps({"writer": dead_writer, "at": time.time(), "steps": steps}))

    start = threading.Barrier(8)

    def clean() -> tuple[int, int]:
        start.wait()
        return lake.recover("state"), lake.sweep_staging("state")

    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda _: clean(), range(8)))
    assert sum(j for j, _ in done) == 1
    assert sum(s for _, s in done) == 1
    assert not staging.exists() and not journal.exists() and not new.exists()
    assert (final / "part-0.parquet").read_bytes() == b"new rows"


@pytest.mark.spark
@pytest.mark.parametrize("clustered", [False, True])
def test_a_clustered_write_keeps_each_task_s_file(spark: SparkSession, tmp_path: Path, clustered: bool) -> None:
    """Rows whose tasks each hold one hour are written as they are (a file per task), not gathered per
    hour by a shuffle; the hours read back the same either way."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    keys = ["2026-01-05-10:00", "2026-01-05-11:00"]
    # Four tasks, two per hour, each holding rows of one hour only (ids sort with their hour).
    rows = [(f"m{i:02d}", "2026-01-05-10" if i < 40 else "2026-01-05-11") for i in range(80)]
    df = spark.createDataFrame(rows, "id string, dt string").coalesce(1).repartitionByRange(4, "id")
    lake.replace_partitions(df, "events", keys, clustered=clustered)
    back = lake.read(spark, "events", StructType([StructField("id", StringType())]), keys)
    assert sorted(tuple(r) for r in back.select("id", "dt").collect()) == sorted(rows)
    files = {k: lake.whole_hour_files("events", k) for k in keys}
    expected = 2 if clustered else 1
    assert {k: len(v) for k, v in files.items()} == {k: expected for k in keys}, files
