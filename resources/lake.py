"""The lake: Parquet datasets under one root, partitioned by hour, replaced partition by partition.

Layout: ``<root>/<dataset>/dt=YYYY-MM-DD-HH/part-*.parquet``. The root is a local folder by default
and any Hadoop-supported URI at scale (``s3a://bucket/lake``); all file operations go through
Spark's Hadoop FileSystem so both behave the same.

Writing replaces exactly the hours a run was asked for, including hours that now have no rows, so
rerunning a partition leaves the dataset exactly as running it once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

PARTITION_COLUMN = "dt"
STAGING = "_staging"


def key_to_dt(partition_key: str) -> str:
    """Dagster hourly key ``2026-11-22-14:00`` -> lake partition value ``2026-11-22-14``."""
    if len(partition_key) != 16 or not partition_key.endswith(":00"):
        raise ValueError(f"not an hourly partition key: {partition_key!r}")
    return partition_key[:-3]


def dt_to_key(dt: str) -> str:
    """Lake partition value ``2026-11-22-14`` -> Dagster hourly key ``2026-11-22-14:00``."""
    return dt + ":00"


@dataclass(frozen=True)
class _Fs:
    spark: SparkSession

    def _path(self, uri: str):  # py4j objects have no Python type
        return self.spark._jvm.org.apache.hadoop.fs.Path(uri)

    def _fs(self, uri: str):
        return self._path(uri).getFileSystem(self.spark._jsc.hadoopConfiguration())

    def exists(self, uri: str) -> bool:
        return bool(self._fs(uri).exists(self._path(uri)))

    def delete(self, uri: str) -> None:
        fs = self._fs(uri)
        if fs.exists(self._path(uri)):
            fs.delete(self._path(uri), True)

    def rename(self, src: str, dst: str) -> None:
        fs = self._fs(src)
        fs.mkdirs(self._path(dst).getParent())
        if not fs.rename(self._path(src), self._path(dst)):
            raise OSError(f"could not rename {src} to {dst}")

    def write_text(self, uri: str, text: str) -> None:
        """Write a small file whole: written beside it first, then renamed over it."""
        fs = self._fs(uri)
        tmp = f"{uri}.{uuid.uuid4().hex}.tmp"
        out = fs.create(self._path(tmp), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        # FileContext can rename over an existing file in one step (a POSIX rename on a local lake), so a
        # reader or a crash sees the old text or the new, never no file.
        jvm = self.spark._jvm
        context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
            self._path(uri).toUri(), self.spark._jsc.hadoopConfiguration()
        )
        rename = jvm.org.apache.hadoop.fs.Options.Rename
        options = self.spark.sparkContext._gateway.new_array(rename, 1)
        options[0] = rename.OVERWRITE
        fs.mkdirs(self._path(uri).getParent())
        context.rename(self._path(tmp), self._path(uri), options)

    def read_text(self, uri: str) -> str | None:
        """A small file's text, or None when it does not exist."""
        fs = self._fs(uri)
        if not fs.exists(self._path(uri)):
            return None
        stream = fs.open(self._path(uri))
        try:
            jvm = self.spark._jvm
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def list_names(self, uri: str) -> list[str]:
        """The names directly under a folder (empty when it does not exist)."""
        fs = self._fs(uri)
        if not fs.exists(self._path(uri)):
            return []
        return sorted(str(st.getPath().getName()) for st in fs.listStatus(self._path(uri)))

    def file_signatures(self, uri: str, column: str) -> dict[str, str]:
        """Per ``column=value`` folder under ``uri``: a digest of its files' names, sizes and times.

        A folder rewritten by ``replace_folders`` gets new file names, so its digest changes.
        """
        import hashlib

        fs = self._fs(uri)
        out: dict[str, str] = {}
        prefix = column + "="
        if not fs.exists(self._path(uri)):
            return out
        for st in fs.listStatus(self._path(uri)):
            name = str(st.getPath().getName())
            if not (st.isDirectory() and name.startswith(prefix)):
                continue
            files = fs.listFiles(st.getPath(), True)
            parts = []
            while files.hasNext():
                f = files.next()
                parts.append(f"{f.getPath().getName()}:{f.getLen()}:{f.getModificationTime()}")
            out[name[len(prefix) :]] = hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()
        return out

    def list_partition_values(self, uri: str, column: str = PARTITION_COLUMN) -> list[str]:
        fs = self._fs(uri)
        path = self._path(uri)
        if not fs.exists(path):
            return []
        prefix = column + "="
        return [
            st.getPath().getName()[len(prefix) :]
            for st in fs.listStatus(path)
            if st.isDirectory() and st.getPath().getName().startswith(prefix)
        ]


class LakeResource(ConfigurableResource):
    """Parquet datasets under ``root``, one folder per asset, hourly ``dt=`` partitions."""

    root: str = Field(description="Folder or Hadoop URI under which every dataset lives.")

    def files(self, spark: SparkSession) -> _Fs:
        """File operations on the lake (through Hadoop's FileSystem, so local folders and URIs alike)."""
        return _Fs(spark)

    def dataset_uri(self, dataset: str) -> str:
        if not dataset or "/" in dataset or dataset.startswith((".", "_")):
            raise ValueError(f"bad dataset name {dataset!r}")
        return f"{self.root.rstrip('/')}/{dataset}"

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
        full_schema = (
            schema
            if PARTITION_COLUMN in schema.fieldNames()
            else StructType([*schema.fields, StructField(PARTITION_COLUMN, StringType())])
        )
        fs = _Fs(spark)
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
        self, df: DataFrame, dataset: str, partition_keys: Sequence[str], *, no_dictionary: Sequence[str] = ()
    ) -> None:
        """Write ``df`` (which has a ``dt`` column) as exactly the hours ``partition_keys``.

        ``no_dictionary`` names columns whose values are nearly all distinct (message bodies):
        Parquet's dictionary encoding only costs time there.

        Rows are staged first; each hour's folder is then swapped in, so a reader sees the old or
        the new hour, and an hour that now has no rows is emptied rather than left stale. Rows whose
        ``dt`` is not among ``partition_keys`` are a bug in the caller and raise.
        """
        dts = sorted({key_to_dt(k) for k in partition_keys})
        self.replace_folders(df, dataset, PARTITION_COLUMN, dts, no_dictionary=no_dictionary)

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
        fs = _Fs(spark)
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
    ) -> None:
        """Write ``df`` as exactly the ``column=value`` folders ``values`` (emptying those without rows).

        Staged, then swapped folder by folder (see ``replace_partitions``). Rows for other values raise.
        """
        spark = df.sparkSession
        fs = _Fs(spark)
        wanted = sorted({str(v) for v in values})
        if not wanted:
            return
        staging = f"{self.root.rstrip('/')}/{STAGING}/{dataset}/{uuid.uuid4().hex}"
        writer = df.write.mode("overwrite").partitionBy(column)
        for name in no_dictionary:
            writer = writer.option(f"parquet.enable.dictionary#{name}", "false")
        writer.parquet(staging)
        stray = sorted(set(fs.list_partition_values(staging, column)) - set(wanted))
        if stray:
            fs.delete(staging)
            raise ValueError(f"rows for {column} {stray} were given to write {dataset} {column} {wanted}")
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
