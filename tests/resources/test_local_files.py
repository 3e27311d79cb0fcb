"""Local lakes are written without Hadoop's ``.crc`` side files, a damaged Parquet page still fails
the read (``resources.spark.LOCAL_FILES``), drivers whose tasks run in their own JVM create files
without a ``chmod`` process (``resources.local_fs``), and a read of many folders lists them in the
driver rather than in a Spark job (``resources.spark.LOCAL_LISTING``), and a scan packs many small files
into a task (``resources.spark.LOCAL_OPEN_COST``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from ngsi_assets.spark_servers import connect_server_command
from resources import local_fs
from resources.lake import LakeResource
from resources.spark import LOCAL_FILES, LOCAL_LISTING, LOCAL_OPEN_COST, default_spark_config, lake_is_local
from tests.support.spark import session_settings

REPO = Path(__file__).resolve().parents[2]
THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
OPEN_COST = "spark.sql.files.openCostInBytes"

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


def _server_confs(cmd: list[str]) -> dict[str, str]:
    return {c.split("=", 1)[0]: c.split("=", 1)[1] for c in (cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf")}


def test_every_driver_the_platform_starts_gets_the_settings() -> None:
    jar = local_fs.process_free_jar()
    assert jar is not None and jar.is_file(), "the test command installs a JDK: the jar must build"
    in_driver = {"spark.hadoop.fs.file.impl": local_fs.CLASS_NAME, "spark.driver.extraClassPath": str(jar)}
    for conf in (default_spark_config("local[1]"), _server_confs(connect_server_command(15002))):
        assert {k: conf[k] for k in LOCAL_FILES} == LOCAL_FILES
        assert {k: conf.get(k) for k in in_driver} == in_driver
    # Executors in JVMs of their own would not have the jar: Hadoop's raw file system there.
    for conf in (
        default_spark_config("spark://127.0.0.1:7077"),
        default_spark_config("local-cluster[2,1,1024]"),
        _server_confs(connect_server_command(15002, master="spark://127.0.0.1:7077")),
    ):
        assert {k: conf[k] for k in LOCAL_FILES} == LOCAL_FILES
        assert conf["spark.hadoop.fs.file.impl"] == local_fs.HADOOP_RAW
        assert "spark.driver.extraClassPath" not in conf


def test_without_a_jdk_or_when_turned_off_hadoops_raw_file_system_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    raw = {"spark.hadoop.fs.file.impl": local_fs.HADOOP_RAW}
    monkeypatch.setenv(local_fs.SETTING, "0")
    assert local_fs.local_file_settings("local[*]") == raw
    monkeypatch.delenv(local_fs.SETTING)
    # No javac anywhere: nothing is built, and nothing fails.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jre"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    local_fs.process_free_jar.cache_clear()
    try:
        assert local_fs.local_file_settings("local[*]") == raw
        assert not (tmp_path / "cache").exists()
    finally:
        local_fs.process_free_jar.cache_clear()


def test_a_source_that_does_not_compile_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "Broken.java"
    broken.write_text("package ngsiassets.fs; public class Broken { int x = ; }\n")
    monkeypatch.setattr(local_fs, "SOURCE", broken)
    compiler, api = local_fs.javac(), local_fs.hadoop_api_jar()
    assert compiler is not None and api is not None
    with pytest.raises(RuntimeError, match=r"javac failed on Broken\.java"):
        local_fs.build_jar(compiler, api, tmp_path / "out" / "fs.jar")
    assert not (tmp_path / "out" / "fs.jar").exists()


# A child process with a ``chmod`` first on its PATH that notes each call: Hadoop's raw file system
# runs ``chmod`` by name (``Shell.getSetPermissionCommand``) for each file and folder it creates.
_WRITE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pyspark.sql import SparkSession, functions as F
    from resources.spark import default_spark_config
    builder = SparkSession.builder
    for k, v in default_spark_config("local[1]", ui=False, driver_memory="1g").items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    out = Path(sys.argv[1])
    rows = spark.range(64).select((F.col("id") % 8).alias("bucket"), F.col("id").alias("v"))
    rows.repartition(1).write.partitionBy("bucket").parquet(str(out))
    total = spark.read.parquet(str(out)).agg(F.sum("v")).first()[0]
    modes = sorted({oct(p.stat().st_mode & 0o7777) + ("d" if p.is_dir() else "f") for p in out.rglob("*")})
    print(json.dumps({"impl": spark.conf.get("spark.hadoop.fs.file.impl"), "total": total, "modes": modes}))
    spark.stop()
    """
)


@pytest.mark.parametrize("process_free", ["1", "0"])
def test_files_are_created_without_a_chmod_process(tmp_path: Path, process_free: str) -> None:
    bin_dir, calls = tmp_path / "bin", tmp_path / "chmod-calls"
    bin_dir.mkdir()
    chmod = bin_dir / "chmod"
    chmod.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec /bin/chmod "$@"\n')
    chmod.chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NGSI_")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        local_fs.SETTING: process_free,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _WRITE, str(tmp_path / "out")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["total"] == sum(range(64))
    # The same permissions either way: files rw-r--r--, folders rwxr-xr-x (umask 022).
    assert result["modes"] == ["0o644f", "0o755d"]
    # Of the lake's files: the session's start chmods its own copies of the JDBC jars (``a+x``).
    out = str(tmp_path / "out")
    noted = [c for c in (calls.read_text().splitlines() if calls.exists() else []) if out in c]
    if process_free == "1":
        assert result["impl"] == local_fs.CLASS_NAME
        assert noted == []
    else:
        assert result["impl"] == local_fs.HADOOP_RAW
        # 8 bucket folders and their 8 files at least, each with a chmod of its own.
        assert len(noted) >= 16, noted


_THINGS = StructType([StructField("v", LongType()), StructField("bucket", IntegerType())])


def _listing_jobs(spark: SparkSession, lake: LakeResource, folders: int, group: str) -> list[int]:
    """The Spark jobs that a read of ``folders`` bucket folders starts before any action: listing."""
    spark.sparkContext.setJobGroup(group, "listing")
    try:
        # With the schema given: no job reads the files' footers to merge theirs.
        lake.read_folders(spark, "things", "bucket", list(range(folders)), schema=_THINGS).schema  # noqa: B018
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_local_lake_lists_many_folders_in_the_driver(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    rows = spark.range(400).select((F.col("id") % 40).cast("int").alias("bucket"), F.col("id").alias("v"))
    lake.replace_folders(rows, "things", "bucket", list(range(40)))
    # The platform's session (local lake): 40 folders, more than Spark's threshold, and no job.
    assert spark.conf.get(THRESHOLD) == LOCAL_LISTING[THRESHOLD]
    assert _listing_jobs(spark, lake, 40, "platform") == []
    # Spark's default lists them in a job of its own (what an object store keeps).
    with session_settings(spark, {THRESHOLD: "32"}):
        assert len(_listing_jobs(spark, lake, 40, "spark-default")) == 1


def _scan_tasks(spark: SparkSession, lake: LakeResource, group: str) -> int:
    """The tasks of a count of every ``things`` folder (the scan's stage and the count's)."""
    spark.sparkContext.setJobGroup(group, "scan")
    try:
        lake.read_folders(spark, "things", "bucket", None, schema=_THINGS).count()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    return sum(info.numTasks for info in map(tracker.getStageInfo, stages) if info is not None)


def test_a_local_lake_scans_many_small_files_in_few_tasks(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    rows = spark.range(640).select((F.col("id") % 64).cast("int").alias("bucket"), F.col("id").alias("v"))
    lake.replace_folders(rows.repartition(1), "things", "bucket", list(range(64)))
    assert len(list((tmp_path / "lake").rglob("*.parquet"))) == 64
    assert spark.conf.get(OPEN_COST) == LOCAL_OPEN_COST[OPEN_COST]
    # The platform's session (local lake): 64 files of a few hundred bytes in a task or two per core.
    platform = _scan_tasks(spark, lake, "open-platform")
    assert platform <= 1 + 2 * spark.sparkContext.defaultParallelism, platform
    # Spark's default: four files a task, 16 tasks for the scan alone.
    with session_settings(spark, {OPEN_COST: str(4 * 2**20)}):
        assert _scan_tasks(spark, lake, "open-spark-default") >= 16


def test_only_a_local_lake_changes_how_folders_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    for root, local in (("/data/lake", True), ("file:///data/lake", True), ("s3a://bucket/lake", False)):
        monkeypatch.setenv("NGSI_LAKE_ROOT", root)
        assert lake_is_local() is local
        for setting in (THRESHOLD, OPEN_COST):
            assert (setting in default_spark_config("local[1]")) is local
            assert (setting in default_spark_config(remote="sc://127.0.0.1:15002")) is local
    monkeypatch.delenv("NGSI_LAKE_ROOT")  # the default lake is a local folder
    assert default_spark_config("local[1]")[THRESHOLD] == LOCAL_LISTING[THRESHOLD]
