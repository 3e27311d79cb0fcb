"""The lake: Parquet datasets under one root, partitioned by hour, replaced partition by partition.

Layout: ``<root>/<dataset>/dt=YYYY-MM-DD-HH/part-*.parquet``. The root is a local folder by default
and an object-store or HDFS URI at scale (``s3a://bucket/lake``). Spark reads and writes the
Parquet; the few file operations around it (listing hours, swapping folders, small JSON records) go
through ``pyarrow.fs``, never through the Spark driver, so they work through Spark Connect too.

Writing replaces exactly the hours a run was asked for, including hours that now have no rows, so
rerunning a partition leaves the dataset exactly as running it once.

A write that changes the lake in several file operations (swapping folders, moving an increment's
files in) first stages its rows, then records those operations in a journal
(``_staging/_commits/<dataset>/<id>.json``), applies them and removes the journal. Each operation can
be applied again, so a process killed at any point leaves a journal that the next access to the
dataset (by a read or a write, in any process) finishes before doing anything else: no folder is ever
left missing, and no increment half moved in.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from resources.frames import empty_frame
from resources.parallel import results, side_by_side

PARTITION_COLUMN = "dt"
STAGING = "_staging"
COMMITS = "_commits"
# A journal left by a process on another machine is finished only when it is this old (its process
# cannot be asked whether it still runs): the writes it records take seconds, not minutes.
STALE_COMMIT_S = 600.0
# A staging folder whose writer cannot be asked (another machine, or named before writers were) is
# removed when it is this old: staging a write takes minutes at most.
STALE_STAGING_S = 24 * 3600.0
# An hour's mark that an increment's rows are all in (``mark_increment_done``), followed by its id.
INCREMENT_DONE = "_done-"
# An hour's list of increments whose rows a whole-hour write covers (``mark_increments_covered``).
INCREMENTS_COVERED = "_covered.json"
# A folder removed by someone else at the same time is looked at again this many times.
_DELETE_ATTEMPTS = 5


def _with_partition_column(schema: StructType) -> StructType:
    """``schema`` with the ``dt`` column Spark adds when it reads hour folders."""
    if PARTITION_COLUMN in schema.fieldNames():
        return schema
    return StructType([*schema.fields, StructField(PARTITION_COLUMN, StringType())])


def _check_side_file_name(name: str) -> None:
    """Small files kept in a dataset's folders start with ``_`` (Spark skips them) and name no path."""
    if not name.startswith("_") or "/" in name:
        raise ValueError(f"bad side file name {name!r}")


def _check_file_prefix(prefix: str) -> None:
    """A prefix of Parquet files kept beside a folder's others: a plain name ending in ``-``, which is
    neither Spark's (``part-``), an hour increment's (``inc-``) nor a hidden file's."""
    if (
        not prefix.endswith("-")
        or not prefix[:-1].replace("-", "").isalnum()
        or prefix.startswith(("part-", "inc-", "-"))
    ):
        raise ValueError(f"bad file prefix {prefix!r}")


def _data_file(name: str) -> bool:
    """A Parquet file Spark reads as rows (not a hidden or side file)."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def _move_in(fs: LakeFiles, staged: str, final: str, prefix: str, write: str) -> list[dict[str, str]]:
    """Journal steps moving the Parquet files of the staged folder into ``final`` as
    ``<prefix><write>-<n>.parquet``: ``write`` is new for every write, so the new names differ from
    any file the same journal removes, and the journal can be applied again."""
    names = [n for n in fs.list_names(staged) if _data_file(n)]
    return [
        {"op": "move", "src": f"{staged}/{n}", "dst": f"{final}/{prefix}{write}-{i:05d}.parquet"}
        for i, n in enumerate(names)
    ]


def _swap_steps(
    fs: LakeFiles, staged: str, target: str, column: str, wanted: Sequence[str], old: str
) -> list[dict[str, str]]:
    """Journal steps that make ``target``'s ``column=value`` folders of ``wanted`` the ones staged in
    ``staged`` (emptying those with no staged rows); the folders replaced are moved to ``<old>-<value>``."""
    present = set(fs.list_partition_values(staged, column))
    return [
        {"op": "swap", "new": f"{staged}/{column}={v}", "final": f"{target}/{column}={v}", "old": f"{old}-{v}"}
        if v in present
        else {"op": "empty", "final": f"{target}/{column}={v}", "old": f"{old}-{v}"}
        for v in wanted
    ]


def _whole_hour_file(name: str) -> bool:
    """A Parquet file of an hour that no increment wrote (a whole-hour write's)."""
    return _data_file(name) and not name.startswith("inc-")


def key_to_dt(partition_key: str) -> str:
    """Dagster hourly key ``2026-11-22-14:00`` -> lake partition value ``2026-11-22-14``."""
    if len(partition_key) != 16 or not partition_key.endswith(":00"):
        raise ValueError(f"not an hourly partition key: {partition_key!r}")
    return partition_key[:-3]


def dt_to_key(dt: str) -> str:
    """Lake partition value ``2026-11-22-14`` -> Dagster hourly key ``2026-11-22-14:00``."""
    return dt + ":00"


def is_local(uri: str) -> bool:
    """Whether a lake path or URI is on the local file system: a path with no scheme, or ``file:``."""
    return urlsplit(uri).scheme in ("", "file")


class LakeFiles:
    """File operations on the lake through ``pyarrow.fs``, for local folders and object stores alike.

    A path without a scheme is a local path; ``s3a://`` (Hadoop's name, which Spark needs) is read as
    ``s3://``; ``gs://``, ``hdfs://``, ``abfs://`` and ``file://`` are pyarrow's own. Nothing here goes
    through Spark's driver, so it works the same with a local session, a cluster or Spark Connect
    (the process calling it must see the lake under the same URI as Spark does).
    """

    def __init__(self) -> None:
        self._local = pafs.LocalFileSystem()
        self._filesystems: dict[str, pafs.FileSystem] = {}

    def _resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """The filesystem of ``uri`` and the path in it."""
        scheme, sep, rest = uri.partition("://")
        if not sep:
            return self._local, os.path.abspath(uri)
        if scheme == "file":
            return self._local, rest
        scheme = "s3" if scheme == "s3a" else scheme
        authority, _, path = rest.partition("/")
        # One client per store (bucket or name node): credentials and endpoints are per store.
        key = f"{scheme}://{authority}"
        fs = self._filesystems.get(key)
        if fs is None:
            fs, _ = pafs.FileSystem.from_uri(f"{key}/{path}")
            self._filesystems[key] = fs
        # HDFS paths start after the name node; object-store paths start with the bucket.
        return fs, ("/" + path if scheme in ("hdfs", "viewfs") else rest)

    def _info(self, uri: str) -> pafs.FileInfo:
        fs, path = self._resolve(uri)
        return fs.get_file_info(path)

    def exists(self, uri: str) -> bool:
        return self._info(uri).type != pafs.FileType.NotFound

    def delete(self, uri: str) -> None:
        """Remove a file, or a folder with everything in it; nothing when it is not there.

        Another process may be removing the same folder (two runs finishing one dead write): a file
        that vanishes under the recursive delete is gone, as wanted, so the delete looks again rather
        than failing.
        """
        fs, path = self._resolve(uri)
        for attempt in range(_DELETE_ATTEMPTS):
            info = fs.get_file_info(path)
            try:
                if info.type == pafs.FileType.Directory:
                    fs.delete_dir(path)
                elif info.type != pafs.FileType.NotFound:
                    fs.delete_file(path)
                return
            except FileNotFoundError:
                if attempt == _DELETE_ATTEMPTS - 1:
                    raise

    def _mkdirs(self, fs: pafs.FileSystem, path: str) -> None:
        parent = path.rstrip("/").rsplit("/", 1)[0]
        if parent:
            fs.create_dir(parent, recursive=True)

    def rename(self, src: str, dst: str) -> None:
        fs, src_path = self._resolve(src)
        _, dst_path = self._resolve(dst)
        if fs.get_file_info(dst_path).type != pafs.FileType.NotFound:
            raise OSError(f"could not rename {src} to {dst}: the target exists")
        self._mkdirs(fs, dst_path)
        fs.move(src_path, dst_path)

    def write_text(self, uri: str, text: str) -> None:
        """Write a small file whole: written beside it first, then moved over it.

        On a local lake the move is a POSIX rename that replaces the old file in one step, so a reader
        or a crash sees the old text or the new, never no file. HDFS renames refuse an existing target
        and object stores have no rename, so there the old file is deleted first and a crash between
        the two leaves no file: the history rebuilds a missing ``_state.json`` from its commits, but a
        space's tags file would be lost (commit records are never overwritten).
        """
        fs, path = self._resolve(uri)
        self._mkdirs(fs, path)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(tmp) as out:
            out.write(text.encode("utf-8"))
        if not isinstance(fs, pafs.LocalFileSystem) and fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_file(path)
        fs.move(tmp, path)

    def read_text(self, uri: str) -> str | None:
        """A small file's text, or None when it does not exist."""
        fs, path = self._resolve(uri)
        try:
            with fs.open_input_stream(path) as stream:
                return stream.read().decode("utf-8")
        except FileNotFoundError:
            return None

    def _children(self, uri: str, recursive: bool = False) -> list[pafs.FileInfo]:
        fs, path = self._resolve(uri)
        return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))

    def list_names(self, uri: str) -> list[str]:
        """The names directly under a folder (empty when it does not exist)."""
        return sorted(info.base_name for info in self._children(uri))

    def file_signatures(self, uri: str, column: str) -> dict[str, str]:
        """Per ``column=value`` folder under ``uri``: a digest of its files' names, sizes and times.

        A folder rewritten by ``replace_folders`` gets new file names, so its digest changes.
        """
        out: dict[str, str] = {}
        prefix = column + "="
        for folder in self._children(uri):
            if folder.type != pafs.FileType.Directory or not folder.base_name.startswith(prefix):
                continue
            parts = [
                f"{f.base_name}:{f.size}:{f.mtime_ns // 1_000_000}"
                for f in self._children(f"{uri.rstrip('/')}/{folder.base_name}", recursive=True)
                if f.type == pafs.FileType.File
            ]
            out[folder.base_name[len(prefix) :]] = hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()
        return out

    def tree_bytes(self, uri: str) -> int:
        """The size of every file under ``uri`` (0 when it does not exist)."""
        return sum(f.size or 0 for f in self._children(uri, recursive=True) if f.type == pafs.FileType.File)

    def list_folders(self, uri: str) -> list[str]:
        """The names of the folders directly under ``uri`` that hold data (not ``_``- or ``.``-named)."""
        return sorted(
            info.base_name
            for info in self._children(uri)
            if info.type == pafs.FileType.Directory and not info.base_name.startswith(("_", "."))
        )

    def list_partition_values(self, uri: str, column: str = PARTITION_COLUMN) -> list[str]:
        prefix = column + "="
        return [
            info.base_name[len(prefix) :]
            for info in self._children(uri)
            if info.type == pafs.FileType.Directory and info.base_name.startswith(prefix)
        ]


# One per process: it only caches filesystem clients, which are safe to share.
_FILES = LakeFiles()

# Journals this process is applying right now (not to be finished by another thread of it).
_OPEN_COMMITS: set[str] = set()
_OPEN_LOCK = threading.Lock()
# Per dataset: the thread of this process finishing what dead writers left (journals, staging).
_CLEANUP_LOCKS: dict[str, threading.Lock] = {}


def _cleanup_lock(dataset_uri: str) -> threading.Lock:
    """Threads of one run write a dataset side by side (one ``replace_folders`` per entity); only one
    of them at a time finishes a dead writer's journal or removes its staging, so that two threads
    never apply the same steps or delete the same folder at once."""
    with _OPEN_LOCK:
        return _CLEANUP_LOCKS.setdefault(dataset_uri, threading.Lock())


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux), to tell it from a later one with
    the same pid; None where ``/proc`` is not there or the process does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _this_writer() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def writer_gone(writer: Mapping[str, object], written_at: float, now: float | None = None) -> bool:
    """Whether the process that wrote a journal is no longer running (so its journal is to be finished).

    On this machine: its pid is gone, or belongs to a process started later. On another: the journal is
    older than ``STALE_COMMIT_S``.
    """
    if writer.get("host") != socket.gethostname():
        return (time.time() if now is None else now) - written_at > STALE_COMMIT_S
    pid = int(str(writer.get("pid")))
    if pid == os.getpid():
        return True  # this process: a journal of one of its writes that failed (the open ones are skipped)
    if os.path.exists("/proc"):
        start = _process_start(pid)
        return start is None or start != writer.get("start")
    try:
        os.kill(pid, 0)  # no /proc: the pid alone (a reused pid reads as alive)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def staging_name() -> str:
    """A fresh staging folder's name: ``w<pid>-<process start>-<host tag>-<uuid>``, so that a later
    write can tell that the process staging it is gone (``staging_abandoned``)."""
    start = _process_start(os.getpid()) or "x"
    return f"w{os.getpid()}-{start}-{_host_tag()}-{uuid.uuid4().hex}"


def staging_abandoned(name: str, mtime_s: float, now: float | None = None) -> bool:
    """Whether a staging folder (or an old folder moved beside it) was left by a write that died.

    Its writer is on this machine and no longer runs (a write of this process is never abandoned: it
    may be running in another thread); otherwise the folder is older than ``STALE_STAGING_S``.
    """
    parts = name.split("-")
    old_enough = (time.time() if now is None else now) - mtime_s > STALE_STAGING_S
    if len(parts) < 4 or not parts[0].startswith("w") or not parts[0][1:].isdigit() or parts[2] != _host_tag():
        return old_enough
    pid = int(parts[0][1:])
    if pid == os.getpid():
        return False
    writer = {"host": socket.gethostname(), "pid": pid, "start": None if parts[1] == "x" else parts[1]}
    return writer_gone(writer, mtime_s, now)


def apply_steps(fs: LakeFiles, steps: Sequence[Mapping[str, str]]) -> None:
    """Apply a journal's operations; each may be applied again after a crash part way through it.

    - ``swap``: the staged folder ``new`` replaces ``final`` (the old one is moved aside to ``old``,
      then deleted); once ``new`` is gone it was moved in, and only ``old`` may be left to delete;
    - ``empty``: ``final`` is removed (a value that now has no rows);
    - ``move``: the staged file ``src`` becomes ``dst``;
    - ``delete``: ``uri`` is removed (a replaced increment file, the staging folder).
    """
    for step in steps:
        op = step["op"]
        if op == "swap":
            if fs.exists(step["new"]):
                if fs.exists(step["final"]):
                    fs.rename(step["final"], step["old"])
                fs.rename(step["new"], step["final"])
            fs.delete(step["old"])
        elif op == "empty":
            if fs.exists(step["final"]):
                fs.rename(step["final"], step["old"])
            fs.delete(step["old"])
        elif op == "move":
            if fs.exists(step["src"]):
                fs.rename(step["src"], step["dst"])
        elif op == "delete":
            fs.delete(step["uri"])
        else:
            raise ValueError(f"unknown lake journal operation {op!r}")


class LakeResource(ConfigurableResource):
    """Parquet datasets under ``root``, one folder per asset, hourly ``dt=`` partitions."""

    root: str = Field(description="Folder or Hadoop URI under which every dataset lives.")

    def files(self) -> LakeFiles:
        """File operations on the lake (local folders and object-store URIs alike)."""
        return _FILES

    @property
    def root_uri(self) -> str:
        """The root as Spark and every process must name it: a local folder made absolute (a Spark
        Connect server or a cluster's executors resolve relative paths against their own folder)."""
        return self.root.rstrip("/") if "://" in self.root else os.path.abspath(self.root)

    def dataset_uri(self, dataset: str) -> str:
        if not dataset or "/" in dataset or dataset.startswith((".", "_")):
            raise ValueError(f"bad dataset name {dataset!r}")
        return f"{self.root_uri}/{dataset}"

    def partition_uri(self, dataset: str, partition_key: str) -> str:
        return f"{self.dataset_uri(dataset)}/{PARTITION_COLUMN}={key_to_dt(partition_key)}"

    # ---- the commit journal -----------------------------------------------------------------------

    def _commits_uri(self, dataset: str) -> str:
        self.dataset_uri(dataset)  # validates the name
        return f"{self.root_uri}/{STAGING}/{COMMITS}/{dataset}"

    def _commit(self, dataset: str, steps: list[dict[str, str]]) -> None:
        """Record ``steps`` in a journal, apply them, remove the journal (see the module's docstring)."""
        fs = self.files()
        uri = f"{self._commits_uri(dataset)}/{uuid.uuid4().hex}.json"
        with _OPEN_LOCK:
            _OPEN_COMMITS.add(uri)
        try:
            fs.write_text(uri, json.dumps({"writer": _this_writer(), "at": time.time(), "steps": steps}))
            apply_steps(fs, steps)
            fs.delete(uri)
        finally:
            with _OPEN_LOCK:
                _OPEN_COMMITS.discard(uri)

    def recover(self, dataset: str) -> int:
        """Finish the writes of ``dataset`` that a killed process left part way; how many were finished.

        Every read and write of the dataset calls this first; a journal whose process still runs (a
        write in progress in another run) is left to it.
        """
        fs = self.files()
        folder = self._commits_uri(dataset)
        with _cleanup_lock(self.dataset_uri(dataset)):
            return self._finish_journals(fs, folder)

    @staticmethod
    def _finish_journals(fs: LakeFiles, folder: str) -> int:
        """``recover`` for one dataset's journal folder, under its cleanup lock."""
        finished = 0
        for name in fs.list_names(folder):
            uri = f"{folder}/{name}"
            if not name.endswith(".json") or uri in _OPEN_COMMITS:
                continue
            text = fs.read_text(uri)
            if text is None:  # finished meanwhile by its own process
                continue
            journal = json.loads(text)
            if not writer_gone(journal["writer"], float(journal["at"])):
                continue
            apply_steps(fs, journal["steps"])
            fs.delete(uri)
            finished += 1
        return finished

    def read(
        self,
        spark: SparkSession,
        dataset: str,
        schema: StructType,
        partition_keys: Sequence[str] | None = None,
    ) -> DataFrame:
        """Rows of ``dataset`` (all hours, or just ``partition_keys``), with a ``dt`` column.

        A dataset or hour that was never written reads as empty, with ``schema``.
        """
        full_schema = _with_partition_column(schema)
        fs = self.files()
        uri = self.dataset_uri(dataset)
        self.recover(dataset)
        # Name the hour folders wanted rather than filter the dataset: Spark lists every file under
        # the paths it is given, and a run of one hour should not list the whole history.
        if partition_keys is None:
            paths = [uri] if fs.exists(uri) else []
        else:
            paths = [p for p in (self.partition_uri(dataset, k) for k in partition_keys) if fs.exists(p)]
        if not paths:
            return empty_frame(spark, full_schema)
        return spark.read.schema(full_schema).option("basePath", uri).parquet(*paths)

    def replace_partitions(
        self,
        df: DataFrame,
        dataset: str,
        partition_keys: Sequence[str],
        *,
        no_dictionary: Sequence[str] = (),
        hour_files: Mapping[str, Mapping[str, str]] | None = None,
        clustered: bool = False,
    ) -> None:
        """Write ``df`` (which has a ``dt`` column) as exactly the hours ``partition_keys``.

        ``no_dictionary`` names columns whose values are nearly all distinct (message bodies):
        Parquet's dictionary encoding only costs time there.

        Rows are staged first; each hour's folder is then swapped in, so a reader sees the old or
        the new hour, and an hour that now has no rows is emptied rather than left stale. Rows whose
        ``dt`` is not among ``partition_keys`` are a bug in the caller and raise.

        ``hour_files`` ({partition key: {name: text}}) are small files written into the staged hour
        folders, so they are swapped in with the rows (names start with ``_``: Spark skips them).
        ``clustered``: each task's rows fall in one hour (see ``_stage``).
        """
        files = {key_to_dt(k): v for k, v in (hour_files or {}).items()}
        hours = FolderWrite.hours(df, dataset, partition_keys)
        self.replace_folders(
            df,
            dataset,
            PARTITION_COLUMN,
            hours.values,
            no_dictionary=no_dictionary,
            folder_files=files,
            clustered=clustered,
        )

    # ---- increments: rows appended to an hour by a continuous run, replaceable as a unit ----------

    @staticmethod
    def _increment_prefix(increment_id: str) -> str:
        if not increment_id or not all(c in "0123456789abcdef" for c in increment_id):
            raise ValueError(f"bad increment id {increment_id!r}")
        return f"inc-{increment_id}-"

    def _increment_files(self, dataset: str, partition_key: str, increment_id: str) -> list[str]:
        prefix = self._increment_prefix(increment_id)
        folder = self.partition_uri(dataset, partition_key)
        return [f"{folder}/{n}" for n in self.files().list_names(folder) if n.startswith(prefix)]

    @staticmethod
    def increment_of(name: str) -> str | None:
        """The increment id in an increment file's name (``inc-<id>-<write>-<n>.parquet``), else None."""
        parts = name.split("-")
        if parts[0] != "inc" or len(parts) != 4 or not name.endswith(".parquet"):
            return None
        return parts[1]

    def mark_increment_done(self, dataset: str, partition_key: str, increment_id: str) -> None:
        """Record in the hour's folder that the increment's rows are all in (it may have added none).

        A whole-hour write of the hour swaps the folder, and the marks with it."""
        self._increment_prefix(increment_id)  # a bad id raises
        self.write_hour_file(dataset, partition_key, f"{INCREMENT_DONE}{increment_id}", "")

    def mark_increments_covered(self, dataset: str, partition_key: str, increment_ids: Iterable[str]) -> None:
        """Record in the hour's folder, in one file, that a whole-hour write of it covers the rows of
        these increments (of the dataset it was computed from); nothing for none."""
        ids = sorted(increment_ids)
        for i in ids:
            self._increment_prefix(i)  # a bad id raises
        if ids:
            self.write_hour_file(dataset, partition_key, INCREMENTS_COVERED, json.dumps(ids))

    def increment_ids(self, dataset: str, partition_key: str, *, marked_done: bool = False) -> set[str]:
        """The increments with files in the hour (their files move in with one journal, so an increment
        with files has all of them); or (``marked_done``) those marked done (``mark_increment_done``,
        ``mark_increments_covered``)."""
        self.recover(dataset)
        folder = self.partition_uri(dataset, partition_key)
        names = self.files().list_names(folder)
        if not marked_done:
            return {i for i in map(self.increment_of, names) if i is not None}
        done = {n[len(INCREMENT_DONE) :] for n in names if n.startswith(INCREMENT_DONE)}
        if INCREMENTS_COVERED in names:
            done |= {str(i) for i in json.loads(self.files().read_text(f"{folder}/{INCREMENTS_COVERED}") or "[]")}
        return done

    def read_hour_parts(
        self,
        spark: SparkSession,
        dataset: str,
        schema: StructType,
        parts: Mapping[str, Iterable[str]],
        *,
        whole: bool = True,
    ) -> DataFrame:
        """Rows of some files of some hours, with a ``dt`` column: per hour (partition key) of ``parts``,
        the files of the increments it names and (``whole``) the whole-hour files; an increment not
        named (still being written, or not wanted) is left out. One read."""
        full_schema = _with_partition_column(schema)
        self.recover(dataset)
        paths = []
        for key, increment_ids in sorted(parts.items()):
            wanted = set(increment_ids)
            folder = self.partition_uri(dataset, key)
            for name in self.files().list_names(folder):
                if self.increment_of(name) in wanted or (whole and _whole_hour_file(name)):
                    paths.append(f"{folder}/{name}")
        if not paths:
            return empty_frame(spark, full_schema)
        return spark.read.schema(full_schema).option("basePath", self.dataset_uri(dataset)).parquet(*paths)

    def hours_hold_rows(self, dataset: str, partition_keys: Sequence[str]) -> bool:
        """Whether any of the hours holds a Parquet file (a whole-hour write's or an increment's): a
        listing of their folders, nothing read."""
        self.recover(dataset)
        fs = self.files()
        return any(_data_file(n) for k in partition_keys for n in fs.list_names(self.partition_uri(dataset, k)))

    def whole_hour_files(self, dataset: str, partition_key: str) -> list[str]:
        """The Parquet files of an hour that no increment wrote (a whole-hour write's)."""
        self.recover(dataset)
        return [n for n in self.files().list_names(self.partition_uri(dataset, partition_key)) if _whole_hour_file(n)]

    def delete_increment(self, dataset: str, partition_key: str, increment_id: str) -> None:
        """Remove an increment's files from an hour (before it is written again)."""
        self.recover(dataset)
        for uri in self._increment_files(dataset, partition_key, increment_id):
            self.files().delete(uri)

    def append_increment(
        self,
        df: DataFrame,
        dataset: str,
        partition_key: str,
        increment_id: str,
        *,
        no_dictionary: Sequence[str] = (),
        empty: bool = False,
    ) -> None:
        """Add ``df`` (rows of one hour, with a ``dt`` column) to that hour as the increment's files.

        ``empty``: the caller knows ``df`` has no rows (outputs usually empty, such as rejects): no
        empty file is written, only the increment's earlier files are removed.

        Files the increment wrote before are removed first, so writing an increment again replaces
        exactly its rows and leaves the hour's other rows alone. The rows are staged, then (one journal)
        the old files are removed and each new one is moved in as ``inc-<id>-<write>-<n>.parquet``; a
        whole-hour write (``replace_partitions``) replaces
        the hour's increments along with the rest.
        """
        if empty:
            self.delete_increment(dataset, partition_key, increment_id)
            return
        fs = self.files()
        dt = key_to_dt(partition_key)
        self.recover(dataset)
        staging = self._stage(df, dataset, PARTITION_COLUMN, [dt], no_dictionary)
        staged = f"{staging}/{PARTITION_COLUMN}={dt}"
        final = self.partition_uri(dataset, partition_key)
        steps = [{"op": "delete", "uri": uri} for uri in self._increment_files(dataset, partition_key, increment_id)]
        steps += _move_in(fs, staged, final, self._increment_prefix(increment_id), uuid.uuid4().hex[:8])
        steps.append({"op": "delete", "uri": staging})
        self._commit(dataset, steps)

    def sweep_staging(self, dataset: str) -> int:
        """Remove what killed writes of ``dataset`` left in staging (``staging_abandoned``); how many.

        Journals are finished first (``recover``): a journal still to apply may need its staged folders.
        """
        self.recover(dataset)  # also validates the name
        return self._sweep(dataset)

    def _sweep(self, dataset: str) -> int:
        """``sweep_staging`` for a caller that has just finished the dataset's journals."""
        fs = self.files()
        folder = f"{self.root_uri}/{STAGING}/{dataset}"
        removed = 0
        with _cleanup_lock(self.dataset_uri(dataset)):
            for info in fs._children(folder):
                if staging_abandoned(info.base_name, (info.mtime_ns or 0) / 1e9):
                    fs.delete(f"{folder}/{info.base_name}")
                    removed += 1
        return removed

    def _stage(
        self,
        df: DataFrame,
        dataset: str,
        column: str,
        wanted: Sequence[str],
        no_dictionary: Sequence[str],
        split: FileSplit | None = None,
        one_file: bool = False,
        outer: tuple[str, Mapping[str, Sequence[str]]] | None = None,
        sort_by: Sequence[str] = (),
        clustered: bool = False,
        row_group_bytes: int | None = None,
    ) -> str:
        """Write ``df`` partitioned by ``column`` to a fresh staging folder; rows for values not in
        ``wanted`` are a bug in the caller and raise (the staging folder is removed).

        ``split``: the rows for which its boolean column is true go to files of their own in each folder,
        named with its prefix (the column is not stored). ``one_file``: one file per folder even for one
        folder (small adds, which would otherwise get a file per task). ``outer`` (a column and, per
        value of it, the wanted values of ``column``): folders ``outer=o/column=v`` (see
        ``replace_in_subfolders``); ``wanted`` is then unused. ``sort_by``: each file's rows in the order
        of these columns (a reader filtering on them then skips the Parquet pages of other values).
        ``row_group_bytes``: Parquet row groups of about this size rather than the writer's 128 MB, for
        rows that carry large nested values: the vectorized reader decodes up to a whole row group's
        rows at once (4,096), and holds every string of a map column in that batch in one array, so a
        row group of large maps asks the reader for one contiguous block of its decoded size. The
        writer counts the size as written, compressed: decoded, a row group is several times larger.
        ``clustered``: the caller's rows come from inputs that each hold one folder's rows (the landing
        segments of one hour, the message store files of one hour), so each task writes one file into
        one folder as it is: gathering each folder's rows in one task would shuffle every row.

        Callers finish the dataset's journals first (``recover``); then what killed writes of the
        dataset left in staging is removed (``sweep_staging``).
        """
        fs = self.files()
        self._sweep(dataset)
        staging = f"{self.root_uri}/{STAGING}/{dataset}/{staging_name()}"
        folders = [outer[0]] if outer else []
        if (len(wanted) > 1 and not clustered) or one_file or outer:
            # Each folder's rows in one task, so each folder gets one file rather than one per task: a
            # run touching 64 buckets from 4 tasks wrote 256 small files (2.1 s against 0.8 s), and
            # every later read opened them all.
            df = df.repartition(*folders, column)
        if sort_by:
            if split is not None:
                # The writer would sort each folder again by the split column, in no stable order.
                raise ValueError(f"{dataset}: a write split into files of its own cannot be sorted")
            # Led by the folders, so the writer's own sort by them is already satisfied, not redone.
            df = df.sortWithinPartitions(*folders, column, *sort_by)
        writer = df.write.mode("overwrite").partitionBy(*folders, column, *([split.column] if split else []))
        for name in no_dictionary:
            writer = writer.option(f"parquet.enable.dictionary#{name}", "false")
        if row_group_bytes is not None:
            writer = writer.option("parquet.block.size", str(row_group_bytes))
        writer.parquet(staging)
        staged = (
            {o: f"{staging}/{outer[0]}={o}" for o in fs.list_partition_values(staging, outer[0])}
            if outer
            else {"": staging}
        )
        for o, folder in staged.items():
            allowed = outer[1].get(o, ()) if outer else wanted
            stray = sorted(set(fs.list_partition_values(folder, column)) - set(allowed))
            if stray:
                fs.delete(staging)
                where = f"{outer[0]}={o} " if outer else ""
                raise ValueError(
                    f"rows for {where}{column} {stray} were given to write {dataset} {column} {list(allowed)}"
                )
        if split is not None:
            # Staging is this write's own: its files are renamed in place, no journal needed.
            for value in fs.list_partition_values(staging, column):
                folder = f"{staging}/{column}={value}"
                for flag in fs.list_partition_values(folder, split.column):
                    sub = f"{folder}/{split.column}={flag}"
                    prefix = split.prefix if flag == "true" else ""
                    for name in fs.list_names(sub):
                        if _data_file(name):
                            fs.rename(f"{sub}/{name}", f"{folder}/{prefix}{name}")
                    fs.delete(sub)
        return staging

    def read_increment(
        self, spark: SparkSession, dataset: str, schema: StructType, partition_key: str, increment_id: str
    ) -> DataFrame:
        """The rows an increment added to an hour (empty when it added none), with a ``dt`` column."""
        return self.read_hour_parts(spark, dataset, schema, {partition_key: [increment_id]}, whole=False)

    def read_hour_file(self, dataset: str, partition_key: str, name: str) -> str | None:
        """A small ``_``-file kept in an hour's folder (see ``replace_partitions``), or None."""
        self.recover(dataset)
        return self.files().read_text(f"{self.partition_uri(dataset, partition_key)}/{name}")

    def write_hour_file(self, dataset: str, partition_key: str, name: str, text: str) -> None:
        _check_side_file_name(name)
        self.files().write_text(f"{self.partition_uri(dataset, partition_key)}/{name}", text)

    @contextlib.contextmanager
    def exclusive(self, dataset: str, subfolder: str = "") -> Iterator[None]:
        """One writer of ``dataset`` (or of one subfolder of it) at a time, across processes: an
        exclusive ``flock`` on ``<dataset>[/<subfolder>]/.lock`` on a local lake. Object stores have no
        lock: there, the asset's Dagster pool (named in the docs of each feature) must be given a limit of 1."""
        uri = self.folder_uri(dataset, subfolder)
        if not is_local(uri):
            yield
            return
        parts = urlsplit(uri)
        folder = parts.path if parts.scheme else uri
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, ".lock"), "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read_dataset_file(self, dataset: str, name: str, *, subfolder: str = "") -> str | None:
        """A small ``_``-file kept at the top of a dataset's folder, or of one of its subfolders (a marker,
        a format note), or None."""
        _check_side_file_name(name)
        self.recover(dataset)
        return self.files().read_text(f"{self.folder_uri(dataset, subfolder)}/{name}")

    def write_dataset_file(self, dataset: str, name: str, text: str, *, subfolder: str = "") -> None:
        _check_side_file_name(name)
        self.files().write_text(f"{self.folder_uri(dataset, subfolder)}/{name}", text)

    def folder_uri(self, dataset: str, subfolder: str = "") -> str:
        """The dataset's folder, or a subfolder of it (one table of a multi-table dataset)."""
        if subfolder and ("/" in subfolder or subfolder.startswith((".", "_")) or "=" in subfolder):
            raise ValueError(f"bad subfolder name {subfolder!r}")
        return self.dataset_uri(dataset) + (f"/{subfolder}" if subfolder else "")

    def subfolders(self, dataset: str) -> list[str]:
        """The subfolders of a multi-table dataset (one per table), sorted."""
        self.recover(dataset)
        return self.files().list_folders(self.dataset_uri(dataset))

    def folder_values(self, dataset: str, column: str, subfolder: str = "") -> list[str]:
        """The values of the ``column=value`` folders of a dataset or subfolder, sorted."""
        self.recover(dataset)
        return sorted(self.files().list_partition_values(self.folder_uri(dataset, subfolder), column))

    def remove_folders(self, dataset: str, column: str, values: Sequence[object], *, subfolder: str = "") -> None:
        """Remove the ``column=value`` folders ``values`` (those present), in one journal."""
        target = self.folder_uri(dataset, subfolder)
        wanted = sorted({str(v) for v in values})
        if not wanted:
            return
        self.recover(dataset)
        old = f"{self.root_uri}/{STAGING}/{dataset}/{staging_name()}"
        self._commit(
            dataset,
            [{"op": "empty", "final": f"{target}/{column}={v}", "old": f"{old}-old-{v}"} for v in wanted],
        )

    def read_folders(
        self,
        spark: SparkSession,
        dataset: str,
        column: str,
        values: Sequence[object] | None,
        *,
        subfolder: str = "",
        schema: StructType | None = None,
    ) -> DataFrame | None:
        """Rows of the ``column=value`` folders (all of them for None) of a dataset or subfolder.

        With ``schema`` (which must include ``column``) the rows are read with it, else the Parquet
        schemas are merged (tables whose columns grow). None when no such folder exists.
        """
        fs = self.files()
        base = self.folder_uri(dataset, subfolder)
        self.recover(dataset)
        if values is None:
            paths = [base] if fs.exists(base) else []
        else:
            paths = [p for p in (f"{base}/{column}={v}" for v in values) if fs.exists(p)]
        if not paths:
            return None
        reader = spark.read.option("basePath", base)
        reader = reader.schema(schema) if schema is not None else reader.option("mergeSchema", "true")
        return reader.parquet(*paths)

    def replace_folders(
        self,
        df: DataFrame,
        dataset: str,
        column: str,
        values: Sequence[object],
        *,
        subfolder: str = "",
        no_dictionary: Sequence[str] = (),
        folder_files: Mapping[str, Mapping[str, str]] | None = None,
        sort_by: Sequence[str] = (),
        clustered: bool = False,
        row_group_bytes: int | None = None,
    ) -> None:
        """Write ``df`` as exactly the ``column=value`` folders ``values`` (emptying those without rows).

        Staged, then swapped folder by folder (see ``replace_partitions``). Rows for other values raise.
        ``folder_files`` ({value: {name: text}}) are written into the staged folders before the swap;
        ``sort_by``: each file's rows in the order of these columns; ``clustered`` and
        ``row_group_bytes``: see ``_stage``.
        """
        fs = self.files()
        wanted = sorted({str(v) for v in values})
        if not wanted:
            return
        self.recover(dataset)
        staging = self._stage(
            df,
            dataset,
            column,
            wanted,
            no_dictionary,
            sort_by=sort_by,
            clustered=clustered,
            row_group_bytes=row_group_bytes,
        )
        for value, named in (folder_files or {}).items():
            if str(value) not in wanted:
                fs.delete(staging)
                raise ValueError(f"files for {column}={value} were given to write {dataset} {column} {wanted}")
            for name, text in named.items():
                _check_side_file_name(name)
                fs.write_text(f"{staging}/{column}={value}/{name}", text)
        self._swap_in(FolderWrite(df, dataset, column, values, subfolder), wanted, staging)

    def replace_in_subfolders(
        self, df: DataFrame, dataset: str, column: str, folders: Sequence[tuple[str, Sequence[object]]], *, by: str
    ) -> None:
        """``replace_folders`` of several subfolders of a dataset from one Spark write.

        ``folders``: (subfolder, values) pairs; a row goes to the subfolder ``folders[n]`` where n is its
        int column ``by`` (not stored), and each subfolder is written as exactly its ``column=value``
        folders ``values``. Staged once, then swapped in one journal: a process killed at any point
        leaves every subfolder as before or every one as after. Rows for other values raise.
        """
        plan = self._subfolder_plan(dataset, folders)
        if not plan:
            return
        self.recover(dataset)
        staging = self._stage(df, dataset, column, [], (), outer=(by, {str(n): wanted for n, _, wanted in plan}))
        self._swap_in_subfolders(dataset, column, plan, staging, by)

    def _subfolder_plan(
        self, dataset: str, folders: Sequence[tuple[str, Sequence[object]]]
    ) -> list[tuple[int, str, list[str]]]:
        """(n, subfolder, wanted values) of each of ``folders`` with values; refuses a bad subfolder name
        before anything is written."""
        plan = [(n, sub, sorted({str(v) for v in values})) for n, (sub, values) in enumerate(folders)]
        plan = [(n, sub, wanted) for n, sub, wanted in plan if wanted]
        for _, sub, _ in plan:
            self.folder_uri(dataset, sub)
        return plan

    def _swap_in_subfolders(
        self, dataset: str, column: str, plan: Sequence[tuple[int, str, Sequence[str]]], staging: str, by: str
    ) -> None:
        """Swap the staged ``by=n`` folders of a ``replace_in_subfolders`` in, in one journal."""
        fs = self.files()
        steps = [
            step
            for n, sub, wanted in plan
            for step in _swap_steps(
                fs, f"{staging}/{by}={n}", self.folder_uri(dataset, sub), column, wanted, f"{staging}-old-{n}"
            )
        ]
        self._commit(dataset, [*steps, {"op": "delete", "uri": staging}])

    def replace_together(self, writes: Sequence[FolderWrite | FolderAdd | SubfoldersWrite]) -> None:
        """Several ``replace_folders``, ``add_to_folders`` and ``replace_in_subfolders`` (a
        ``SubfoldersWrite``) at once: every write is staged side by side (Spark runs their jobs
        concurrently), then each is committed (one journal each), in order.

        Nothing is committed before every write is staged, so a write may read what another one
        replaces (the records a fold reads and the records written beside it). A staging that fails
        removes the others' and raises; a process killed part way leaves some writes done and others
        not, which a rerun of the same writes completes, as it would for the same writes in sequence.
        """
        todo: list[tuple[FolderWrite | FolderAdd | SubfoldersWrite, list]] = []
        for w in writes:
            wanted: list = (
                self._subfolder_plan(w.dataset, [(m.subfolder, m.values) for m in w.writes])
                if isinstance(w, SubfoldersWrite)
                else sorted({str(v) for v in w.values})
            )
            if wanted:
                todo.append((w, wanted))
                self.recover(w.dataset)
        stages = []
        for w, wanted in todo:
            if isinstance(w, SubfoldersWrite):
                outer = (SubfoldersWrite.BY, {str(n): values for n, _, values in wanted})
                stages.append(functools.partial(self._stage, w.df(), w.dataset, w.column, [], (), outer=outer))
                continue
            stages += [
                functools.partial(
                    self._stage,
                    df,
                    w.dataset,
                    w.column,
                    wanted,
                    no_dictionary,
                    split,
                    one_file,
                    sort_by=w.sort_by,
                    clustered=clustered,
                    row_group_bytes=w.row_group_bytes,
                )
                for df, no_dictionary, split, one_file, clustered in (
                    [(w.df, w.no_dictionary, w.split, False, w.clustered)]
                    if isinstance(w, FolderWrite)
                    else [(df, (), None, True, False) for df, _ in w.adds]
                )
            ]
        futures = side_by_side(stages, name="lake-stage", workers=max(1, len(stages)))
        if any(f.exception() is not None for f in futures):
            for f in futures:
                if f.exception() is None:
                    self.files().delete(f.result())
        stagings = iter(results(futures))
        for w, wanted in todo:
            if isinstance(w, SubfoldersWrite):
                self._swap_in_subfolders(w.dataset, w.column, wanted, next(stagings), SubfoldersWrite.BY)
            elif isinstance(w, FolderWrite):
                self._swap_in(w, wanted, next(stagings))
            else:
                self._add_in(w, wanted, [next(stagings) for _ in w.adds])

    def folder_file_names(
        self, dataset: str, column: str, values: Sequence[object], *, subfolder: str = ""
    ) -> dict[str, list[str]]:
        """The Parquet files of each ``column=value`` folder of ``values`` (an empty list for a folder
        that does not exist), by value."""
        self.recover(dataset)
        base = self.folder_uri(dataset, subfolder)
        return {str(v): [n for n in self.files().list_names(f"{base}/{column}={v}") if _data_file(n)] for v in values}

    def read_folder_files(
        self,
        spark: SparkSession,
        dataset: str,
        column: str,
        files: Mapping[str, Sequence[str]],
        schema: StructType | None,
        *,
        subfolder: str = "",
    ) -> DataFrame | None:
        """Rows of some files of some ``column=value`` folders ({value: file names}, as
        ``folder_file_names`` gives them), read with ``schema`` (which includes ``column``) or, for None,
        with the files' schemas merged; None for no file."""
        base = self.folder_uri(dataset, subfolder)
        paths = [f"{base}/{column}={v}/{n}" for v, names in sorted(files.items()) for n in names]
        if not paths:
            return None
        reader = spark.read.option("basePath", base)
        reader = reader.schema(schema) if schema is not None else reader.option("mergeSchema", "true")
        return reader.parquet(*paths)

    def add_to_folders(self, add: FolderAdd) -> None:
        """Change some files of the ``column=value`` folders ``add.values`` and leave their other files
        alone (see ``FolderAdd``): staged, then one journal removes and moves in, so a process killed at
        any point leaves the folders as before or as after."""
        self.replace_together([add])

    def _add_in(self, add: FolderAdd, wanted: Sequence[str], stagings: Sequence[str]) -> None:
        """Commit an ``add_to_folders`` whose adds are staged (one staging folder per add, in order)."""
        fs = self.files()
        target = self.folder_uri(add.dataset, add.subfolder)
        steps: list[dict[str, str]] = []
        for value in wanted:
            final = f"{target}/{add.column}={value}"
            steps += [
                {"op": "delete", "uri": f"{final}/{n}"}
                for n in fs.list_names(final)
                if any(n.startswith(p) for p in add.remove_prefixes)
            ]
        write = uuid.uuid4().hex[:8]
        for (_, prefix), staging in zip(add.adds, stagings, strict=True):
            for value in fs.list_partition_values(staging, add.column):
                staged, final = f"{staging}/{add.column}={value}", f"{target}/{add.column}={value}"
                steps += _move_in(fs, staged, final, prefix, write)
        steps += [{"op": "delete", "uri": staging} for staging in stagings]
        self._commit(add.dataset, steps)

    def _swap_in(self, write: FolderWrite, wanted: Sequence[str], staging: str) -> None:
        """Swap the staged folders of ``write`` in (one journal), emptying the wanted ones with no rows."""
        target = self.folder_uri(write.dataset, write.subfolder)
        steps = _swap_steps(self.files(), staging, target, write.column, wanted, f"{staging}-old")
        self._commit(write.dataset, [*steps, {"op": "delete", "uri": staging}])


@dataclass(frozen=True)
class FileSplit:
    """Rows kept in files of their own within each folder: those for which the boolean ``column`` is
    true, in files named ``<prefix>...`` (``column`` itself is not stored)."""

    column: str
    prefix: str

    def __post_init__(self) -> None:
        _check_file_prefix(self.prefix)


@dataclass(frozen=True)
class FolderAdd:
    """The arguments of one ``LakeResource.add_to_folders``: in each ``column=value`` folder of
    ``values``, remove the files whose names start with one of ``remove_prefixes`` and add each
    ``(df, prefix)`` of ``adds`` (rows for those folders) as files named ``<prefix><write>-<n>.parquet``;
    the folder's other files stay. Adding under a prefix that is also removed replaces those files.
    ``sort_by``: each added file's rows in the order of these columns."""

    adds: Sequence[tuple[DataFrame, str]]
    dataset: str
    column: str
    values: Sequence[object]
    subfolder: str = ""
    remove_prefixes: Sequence[str] = ()
    sort_by: Sequence[str] = ()
    # Parquet row groups of about this many bytes (see ``LakeResource._stage``).
    row_group_bytes: int | None = None

    def __post_init__(self) -> None:
        for prefix in [*(p for _, p in self.adds), *self.remove_prefixes]:
            _check_file_prefix(prefix)


@dataclass(frozen=True)
class FolderWrite:
    """The arguments of one ``LakeResource.replace_folders``, for ``replace_together``."""

    df: DataFrame
    dataset: str
    column: str
    values: Sequence[object]
    subfolder: str = ""
    no_dictionary: Sequence[str] = ()
    split: FileSplit | None = None
    sort_by: Sequence[str] = ()
    # Each task's rows already fall in one folder (see ``LakeResource._stage``).
    clustered: bool = False
    # Parquet row groups of about this many bytes (see ``LakeResource._stage``).
    row_group_bytes: int | None = None

    @staticmethod
    def hours(
        df: DataFrame,
        dataset: str,
        partition_keys: Sequence[str],
        no_dictionary: Sequence[str] = (),
        *,
        clustered: bool = False,
    ) -> FolderWrite:
        """A ``replace_partitions`` of ``partition_keys`` (rows with a ``dt`` column)."""
        dts = sorted({key_to_dt(k) for k in partition_keys})
        return FolderWrite(df, dataset, PARTITION_COLUMN, dts, no_dictionary=no_dictionary, clustered=clustered)


@dataclass(frozen=True)
class SubfoldersWrite:
    """``FolderWrite``s of one dataset and column, each into a subfolder of its own, for
    ``replace_together``: staged from one Spark write and committed in one journal, as
    ``replace_in_subfolders`` does (a process killed at any point leaves every subfolder as before or
    every one as after). The writes' frames have the same columns; none splits its files or sorts."""

    writes: Sequence[FolderWrite]
    BY: ClassVar[str] = "_subfolder"

    def __post_init__(self) -> None:
        if not self.writes:
            raise ValueError("a SubfoldersWrite needs at least one write")
        first = self.writes[0]
        subfolders = [w.subfolder for w in self.writes]
        if len(set(subfolders)) != len(subfolders):
            raise ValueError(f"{first.dataset}: one write per subfolder, got {sorted(subfolders)}")
        for w in self.writes:
            if (w.dataset, w.column) != (first.dataset, first.column):
                raise ValueError(
                    f"writes of {first.dataset}/{first.column} and {w.dataset}/{w.column} cannot share a Spark write"
                )
            if w.split is not None or w.sort_by or w.no_dictionary or w.row_group_bytes is not None:
                raise ValueError(f"{w.dataset} {w.subfolder}: a write into subfolders is not split, sorted or tuned")

    @property
    def dataset(self) -> str:
        return self.writes[0].dataset

    @property
    def column(self) -> str:
        return self.writes[0].column

    def df(self) -> DataFrame:
        """Every write's rows, tagged with the position of its write (``BY``)."""
        return functools.reduce(
            DataFrame.unionByName, [w.df.withColumn(self.BY, F.lit(n)) for n, w in enumerate(self.writes)]
        )
