"""The lake: Parquet datasets under one root, partitioned by hour, replaced partition by partition.

Layout: ``<root>/<dataset>/dt=YYYY-MM-DD-HH/part-*.parquet``. The root is a local folder by default
and an object-store or HDFS URI at scale (``s3a://bucket/lake``). Spark reads and writes the
Parquet; the few file operations around it (listing hours, swapping folders, small JSON records) go
through ``pyarrow.fs``, never through the Spark driver, so they work through Spark Connect too.

Writing replaces exactly the hours a run was asked for, including hours that now have no rows, so
rerunning a partition leaves the dataset exactly as running it once.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping, Sequence

import pyarrow.fs as pafs
from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

PARTITION_COLUMN = "dt"
STAGING = "_staging"


def _with_partition_column(schema: StructType) -> StructType:
    """``schema`` with the ``dt`` column Spark adds when it reads hour folders."""
    if PARTITION_COLUMN in schema.fieldNames():
        return schema
    return StructType([*schema.fields, StructField(PARTITION_COLUMN, StringType())])


def _check_side_file_name(name: str) -> None:
    """Small files kept in a dataset's folders start with ``_`` (Spark skips them) and name no path."""
    if not name.startswith("_") or "/" in name:
        raise ValueError(f"bad side file name {name!r}")


def key_to_dt(partition_key: str) -> str:
    """Dagster hourly key ``2026-11-22-14:00`` -> lake partition value ``2026-11-22-14``."""
    if len(partition_key) != 16 or not partition_key.endswith(":00"):
        raise ValueError(f"not an hourly partition key: {partition_key!r}")
    return partition_key[:-3]


def dt_to_key(dt: str) -> str:
    """Lake partition value ``2026-11-22-14`` -> Dagster hourly key ``2026-11-22-14:00``."""
    return dt + ":00"


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
        fs, path = self._resolve(uri)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif info.type != pafs.FileType.NotFound:
            fs.delete_file(path)

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

    def list_partition_values(self, uri: str, column: str = PARTITION_COLUMN) -> list[str]:
        prefix = column + "="
        return [
            info.base_name[len(prefix) :]
            for info in self._children(uri)
            if info.type == pafs.FileType.Directory and info.base_name.startswith(prefix)
        ]


# One per process: it only caches filesystem clients, which are safe to share.
_FILES = LakeFiles()


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
        # Name the hour folders wanted rather than filter the dataset: Spark lists every file under
        # the paths it is given, and a run of one hour should not list the whole history.
        if partition_keys is None:
            paths = [uri] if fs.exists(uri) else []
        else:
            paths = [p for p in (self.partition_uri(dataset, k) for k in partition_keys) if fs.exists(p)]
        if not paths:
            return spark.createDataFrame([], full_schema)
        return spark.read.schema(full_schema).option("basePath", uri).parquet(*paths)

    def replace_partitions(
        self,
        df: DataFrame,
        dataset: str,
        partition_keys: Sequence[str],
        *,
        no_dictionary: Sequence[str] = (),
        hour_files: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Write ``df`` (which has a ``dt`` column) as exactly the hours ``partition_keys``.

        ``no_dictionary`` names columns whose values are nearly all distinct (message bodies):
        Parquet's dictionary encoding only costs time there.

        Rows are staged first; each hour's folder is then swapped in, so a reader sees the old or
        the new hour, and an hour that now has no rows is emptied rather than left stale. Rows whose
        ``dt`` is not among ``partition_keys`` are a bug in the caller and raise.

        ``hour_files`` ({partition key: {name: text}}) are small files written into the staged hour
        folders, so they are swapped in with the rows (names start with ``_``: Spark skips them).
        """
        dts = sorted({key_to_dt(k) for k in partition_keys})
        files = {key_to_dt(k): v for k, v in (hour_files or {}).items()}
        self.replace_folders(df, dataset, PARTITION_COLUMN, dts, no_dictionary=no_dictionary, folder_files=files)

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

    def whole_hour_files(self, dataset: str, partition_key: str) -> list[str]:
        """The Parquet files of an hour that no increment wrote (a whole-hour write's)."""
        names = self.files().list_names(self.partition_uri(dataset, partition_key))
        return [n for n in names if n.endswith(".parquet") and not n.startswith(("inc-", "_", "."))]

    def delete_increment(self, dataset: str, partition_key: str, increment_id: str) -> None:
        """Remove an increment's files from an hour (before it is written again)."""
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
    ) -> None:
        """Add ``df`` (rows of one hour, with a ``dt`` column) to that hour as the increment's files.

        Files the increment wrote before are removed first, so writing an increment again replaces
        exactly its rows and leaves the hour's other rows alone. The rows are staged, then each file
        is moved in as ``inc-<id>-<n>.parquet``; a whole-hour write (``replace_partitions``) replaces
        the hour's increments along with the rest.
        """
        fs = self.files()
        dt = key_to_dt(partition_key)
        self.delete_increment(dataset, partition_key, increment_id)
        staging = self._stage(df, dataset, PARTITION_COLUMN, [dt], no_dictionary)
        staged = f"{staging}/{PARTITION_COLUMN}={dt}"
        prefix = self._increment_prefix(increment_id)
        final = self.partition_uri(dataset, partition_key)
        names = [n for n in fs.list_names(staged) if n.endswith(".parquet") and not n.startswith(("_", "."))]
        for i, name in enumerate(names):
            fs.rename(f"{staged}/{name}", f"{final}/{prefix}{i:05d}.parquet")
        fs.delete(staging)

    def _stage(
        self, df: DataFrame, dataset: str, column: str, wanted: Sequence[str], no_dictionary: Sequence[str]
    ) -> str:
        """Write ``df`` partitioned by ``column`` to a fresh staging folder; rows for values not in
        ``wanted`` are a bug in the caller and raise (the staging folder is removed)."""
        fs = self.files()
        staging = f"{self.root_uri}/{STAGING}/{dataset}/{uuid.uuid4().hex}"
        writer = df.write.mode("overwrite").partitionBy(column)
        for name in no_dictionary:
            writer = writer.option(f"parquet.enable.dictionary#{name}", "false")
        writer.parquet(staging)
        stray = sorted(set(fs.list_partition_values(staging, column)) - set(wanted))
        if stray:
            fs.delete(staging)
            raise ValueError(f"rows for {column} {stray} were given to write {dataset} {column} {list(wanted)}")
        return staging

    def read_increment(
        self, spark: SparkSession, dataset: str, schema: StructType, partition_key: str, increment_id: str
    ) -> DataFrame:
        """The rows an increment added to an hour (empty when it added none), with a ``dt`` column."""
        full_schema = _with_partition_column(schema)
        paths = self._increment_files(dataset, partition_key, increment_id)
        if not paths:
            return spark.createDataFrame([], full_schema)
        return spark.read.schema(full_schema).option("basePath", self.dataset_uri(dataset)).parquet(*paths)

    def read_hour_file(self, dataset: str, partition_key: str, name: str) -> str | None:
        """A small ``_``-file kept in an hour's folder (see ``replace_partitions``), or None."""
        return self.files().read_text(f"{self.partition_uri(dataset, partition_key)}/{name}")

    def write_hour_file(self, dataset: str, partition_key: str, name: str, text: str) -> None:
        _check_side_file_name(name)
        self.files().write_text(f"{self.partition_uri(dataset, partition_key)}/{name}", text)

    def folder_uri(self, dataset: str, subfolder: str = "") -> str:
        """The dataset's folder, or a subfolder of it (one table of a multi-table dataset)."""
        if subfolder and ("/" in subfolder or subfolder.startswith((".", "_")) or "=" in subfolder):
            raise ValueError(f"bad subfolder name {subfolder!r}")
        return self.dataset_uri(dataset) + (f"/{subfolder}" if subfolder else "")

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
    ) -> None:
        """Write ``df`` as exactly the ``column=value`` folders ``values`` (emptying those without rows).

        Staged, then swapped folder by folder (see ``replace_partitions``). Rows for other values raise.
        ``folder_files`` ({value: {name: text}}) are written into the staged folders before the swap.
        """
        fs = self.files()
        wanted = sorted({str(v) for v in values})
        if not wanted:
            return
        staging = self._stage(df, dataset, column, wanted, no_dictionary)
        for value, named in (folder_files or {}).items():
            if str(value) not in wanted:
                raise ValueError(f"files for {column}={value} were given to write {dataset} {column} {wanted}")
            for name, text in named.items():
                _check_side_file_name(name)
                fs.write_text(f"{staging}/{column}={value}/{name}", text)
        target = self.folder_uri(dataset, subfolder)
        for value in wanted:
            new = f"{staging}/{column}={value}"
            final = f"{target}/{column}={value}"
            old = f"{staging}-old-{value}"
            if fs.exists(final):
                fs.rename(final, old)
            if fs.exists(new):
                fs.rename(new, final)
            fs.delete(old)
        fs.delete(staging)
