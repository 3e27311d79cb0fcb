"""Local lakes are written without Hadoop's ``.crc`` side files, and a damaged Parquet page still fails
the read (``resources.spark.LOCAL_FILES``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ngsi_assets.spark_servers import connect_server_command
from resources.lake import LakeResource
from resources.spark import LOCAL_FILES, default_spark_config

pytestmark = pytest.mark.spark


def _write(spark: SparkSession, root: Path) -> LakeResource:
    lake = LakeResource(root=str(root))
    rows = spark.range(4000).select(
        (F.col("id") % 4).cast("int").alias("bucket"),
        (F.col("id") * 7).alias("v"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("s"),
    )
    lake.replace_folders(rows, "things", "bucket", [0, 1, 2, 3])
    return lake


def test_a_lake_write_leaves_no_checksum_side_files(spark: SparkSession, tmp_path: Path) -> None:
    lake = _write(spark, tmp_path / "lake")
    files = [p.name for p in (tmp_path / "lake").rglob("*") if p.is_file()]
    assert any(n.endswith(".parquet") for n in files), files
    assert [n for n in files if n.endswith(".crc")] == []
    total = lake.read_folders(spark, "things", "bucket", None).agg(F.sum("v")).first()[0]
    assert total == 7 * sum(range(4000))


def test_a_damaged_page_fails_the_read(spark: SparkSession, tmp_path: Path) -> None:
    lake = _write(spark, tmp_path / "lake")
    [damaged] = sorted((tmp_path / "lake").rglob("bucket=2/*.parquet"))
    data = bytearray(damaged.read_bytes())
    # Inside the first column chunk's data, after the magic bytes and the first page's header.
    for i in (60, 61, 62):
        data[i] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(Exception, match=r"CRC checksum verification failed"):
        lake.read_folders(spark, "things", "bucket", [2]).agg(F.sum("v")).collect()


def test_every_driver_the_platform_starts_gets_the_settings() -> None:
    conf = default_spark_config("local[1]")
    assert {k: conf[k] for k in LOCAL_FILES} == LOCAL_FILES
    cmd = connect_server_command(15002)
    confs = {c.split("=", 1)[0]: c.split("=", 1)[1] for c in (cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf")}
    assert {k: confs[k] for k in LOCAL_FILES} == LOCAL_FILES
