"""The Spark resource: one configured SparkSession per process, built on dagster-pyspark.

Locally this is ``local[*]`` in the run's process; at scale set ``spark.master`` (standalone, YARN,
Kubernetes) through ``NGSI_SPARK_MASTER``, or connect to a Spark Connect server with
``NGSI_SPARK_REMOTE=sc://host:port`` (a warm Spark shared by every run): the transforms do not change.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource
from dagster_pyspark.resources import spark_session_from_config
from pydantic import PrivateAttr

from resources.lake import is_local
from resources.local_fs import local_file_settings
from resources.parallel import inherit_in_threads

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, Row

log = logging.getLogger(__name__)

# JDBC drivers from Debian's libpostgresql-jdbc-java and libmariadb-java, put on the classpath
# when present so SQL sinks can use Spark JDBC as well as the Python drivers.
JDBC_JARS = ("/usr/share/java/postgresql.jar", "/usr/share/java/mariadb-java-client.jar")


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# The drivers' logging: warnings on stderr, less those every start prints (the file says which).
LOG4J2 = Path(__file__).with_name("log4j2.properties")
# A read of more folders than spark.sql.sources.parallelPartitionDiscovery.threshold (Spark's default
# 32) lists them in a Spark job, one task per folder: a read of an entity's 64 buckets was a job of 60
# tasks, three of them in each run of the main job (BENCHMARKS.md, "Findings behind the defaults").
# On a local lake the driver lists them in milliseconds. An object store keeps Spark's way, where the driver would
# list the prefixes one after the other.
LOCAL_LISTING = {"spark.sql.sources.parallelPartitionDiscovery.threshold": str(2**31 - 1)}
# Spark weighs each file a scan reads as its size plus spark.sql.files.openCostInBytes (4 MB by default,
# the cost of opening a file on HDFS or an object store), so a scan of small files packs at most four
# into a split of spark.sql.files.maxPartitionBytes (16 MB here): one task per four bucket files, 70
# tasks in each of two stages of the main job's history compare. A local file opens in microseconds;
# at 64 KB such a scan packs its small files into a task or two per core (BENCHMARKS.md, "Findings
# behind the defaults").
LOCAL_OPEN_COST = {"spark.sql.files.openCostInBytes": str(64 * 2**10)}


def lake_is_local() -> bool:
    """Whether the lake (``NGSI_LAKE_ROOT``, whose default is a local folder) is on the local file
    system: a path with no scheme, or a ``file:`` URI."""
    return is_local(os.environ.get("NGSI_LAKE_ROOT", ""))


def sql_config(shuffle_partitions: int | None = None) -> dict[str, str]:
    """The session (runtime SQL) settings every session of the platform uses, local or remote."""
    cores = os.cpu_count() or 2
    return {
        # All timestamps are UTC: NGSI times without a zone are UTC, and Cygnus writes UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "true",
        # Small shuffles by default: hourly partitions are modest, and local[*] has few cores.
        "spark.sql.shuffle.partitions": str(
            shuffle_partitions or int(os.environ.get("NGSI_SPARK_SHUFFLE_PARTITIONS", max(4, cores * 2)))
        ),
        "spark.sql.adaptive.enabled": "true",
        # Landing segments are large single files; smaller splits keep every core busy.
        "spark.sql.files.maxPartitionBytes": os.environ.get("NGSI_SPARK_MAX_PARTITION_BYTES", str(16 * 2**20)),
        # Off: with it on, Spark splits one from_json into one parse per field it selects, so a
        # payload is parsed once per column derived from it (measured: 10x slower message_store).
        "spark.sql.optimizer.enableJsonExpressionOptimization": "false",
        "spark.sql.parquet.compression.codec": "zstd",
        # A filter on a list of up to this many literals is pushed to Parquet value by value, so a page
        # is read only if it may hold one of them (above the threshold only their min and max are
        # pushed). The STH documents a batch touched are read that way from their rollup buckets
        # (``narrowing_filter``, which names at most as many values).
        "spark.sql.parquet.pushdown.inFilterThreshold": "1000",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        **({**LOCAL_LISTING, **LOCAL_OPEN_COST} if lake_is_local() else {}),
    }


# HotSpot's just-in-time compilers (``NGSI_SPARK_JIT``). Spark makes and loads new classes for every
# query shape, so the C2 compiler of a young driver keeps compiling: 30-35 s of CPU during a 40-47 s
# derived run on two cores, beside 7-10 s of tasks (per-thread CPU from /proc). "quick" stops at C1,
# whose code is slower but cheap to make: it pays in a driver that lives for one run (the embedded
# default: a demo run 219 -> 188 s) and costs in one that lives for many (a test module's session:
# 295-317 -> 430-436 s), where C2's code is paid for once. C1 alone needs the full code cache, or its
# 48 MB default fills and the sweeper churns (12 s of CPU in one run).
JIT_OPTIONS: dict[str, tuple[str, ...]] = {
    "quick": ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"),
    "full": (),
}
# Where a driver's mode goes for its executors on a cluster (Spark's config package.scala:
# EXECUTOR_JAVA_OPTIONS is spark.executor.extraJavaOptions with this one prepended).
EXECUTOR_JIT = "spark.executor.defaultJavaOptions"
# A driver started in a run's own process lives for that run; a Connect server for many runs.
RUN_DRIVER_JIT = "quick"
SERVER_JIT = "full"


def jit_options(default: str = RUN_DRIVER_JIT) -> tuple[str, ...]:
    """A driver's JVM options for the JIT mode ``NGSI_SPARK_JIT`` names, else ``default``."""
    return _mode_options("NGSI_SPARK_JIT", JIT_OPTIONS, default)


def _mode_options(variable: str, modes: Mapping[str, tuple[str, ...]], default: str) -> tuple[str, ...]:
    mode = os.environ.get(variable) or default
    if mode not in modes:
        raise ValueError(f"{variable} must be one of {', '.join(modes)}, not {mode!r}")
    return modes[mode]


# HotSpot's garbage collector for a driver (``NGSI_SPARK_GC``). G1, the JVM's default, runs refinement
# and marking threads beside the application and puts barriers in its code, for short pauses; the
# parallel collector does its work in stop-the-world pauses, for throughput. A Connect server on 2
# cores is throughput-bound (the runs keep both cores busy): with "parallel" its JVM used 19.5 s of
# CPU for the main job over 1,000 notifications against 24.5 s with G1, and the run took 16.9 s
# against 19.3 s (medians of six alternated pairs on two warm servers; BENCHMARKS.md, "The main
# job"). A run's own driver keeps the JVM's default: not measured there.
GC_OPTIONS: dict[str, tuple[str, ...]] = {
    "parallel": ("-XX:+UseParallelGC",),
    "g1": (),
}
RUN_DRIVER_GC = "g1"
SERVER_GC = "parallel"


def gc_options(default: str = RUN_DRIVER_GC) -> tuple[str, ...]:
    """A driver's JVM options for the collector ``NGSI_SPARK_GC`` names, else ``default``."""
    return _mode_options("NGSI_SPARK_GC", GC_OPTIONS, default)


# Local lakes (file: paths). Hadoop's default file system for them writes a ``.crc`` side file beside
# every file and, with no native Hadoop library (pyspark ships none), forks a ``chmod`` process for
# every file and folder it creates: three forks per file of a partitioned write, the side file's
# included (BENCHMARKS.md, "Findings behind the defaults"). A raw one writes no side file and reads none
# (``local_fs``: Hadoop's, or one that sets permissions without a process where it can).
# Parquet's own page checksums, which Spark writes by default, are verified on read instead, so a
# damaged page still fails the read rather than giving other values.
LOCAL_FILES = {
    "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
}


# With it on (Spark's default), every pyspark function a transform calls records its Python call site
# for error messages: a walk of the stack and, with no IPython installed, a failed ``import IPython``
# that searches every folder of sys.path again, each call. A run builds thousands of columns: 0.2-0.4
# s of its driver's time (py-spy, an increment of 100 notifications through a Connect server; BENCHMARKS.md,
# "Growth"). A static setting, read by the clients of a Connect server from it.
# ``NGSI_SPARK_DATAFRAME_DEBUGGING=1`` turns it back on, for errors that name the transform's line.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


def driver_config(
    driver_memory: str | None = None,
    *,
    ui: bool | None = None,
    jit_default: str = RUN_DRIVER_JIT,
    gc_default: str = RUN_DRIVER_GC,
    master: str = "local[*]",
) -> dict[str, str]:
    """The settings of a Spark driver the platform starts itself (in process, or a Connect server);
    ``jit_default`` and ``gc_default``: its JIT mode and collector when ``NGSI_SPARK_JIT`` and
    ``NGSI_SPARK_GC`` are unset; ``master``: where its tasks run."""
    jit = jit_options(jit_default)
    conf = {
        "spark.driver.memory": driver_memory or os.environ.get("NGSI_SPARK_DRIVER_MEMORY", "4g"),
        "spark.ui.enabled": "true" if (ui if ui is not None else os.environ.get("NGSI_SPARK_UI") == "1") else "false",
        "spark.ui.showConsoleProgress": "false",
        # Every query shape of the platform compiled once: the default 100 entries were evicted by
        # the next run (measured: an increment 11.3 -> 9.3 s through a warm Connect server).
        "spark.sql.codegen.cache.maxEntries": "4000",
        "spark.driver.extraJavaOptions": " ".join(
            (f"-Dlog4j2.configurationFile={LOG4J2}", *jit, *gc_options(gc_default))
        ),
        DATAFRAME_DEBUGGING: "true" if os.environ.get("NGSI_SPARK_DATAFRAME_DEBUGGING") == "1" else "false",
        **LOCAL_FILES,
        **local_file_settings(master),
    }
    if jit:
        # On a cluster the driver's executors live as long as it does: the same mode. As the defaults
        # Spark puts before a cluster's own spark.executor.extraJavaOptions, which keep their say.
        # (``local[*]`` runs its tasks in the driver's JVM and ignores this.)
        conf[EXECUTOR_JIT] = " ".join(jit)
    jars = [j for j in JDBC_JARS if Path(j).exists()]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


# Spark's FAIR scheduler on a server that runs several Dagster runs' jobs at once (a Connect server):
# each run's jobs go to a pool named by its tags, and the pools file gives the increments (freshness)
# the first free core. Classic FIFO would run a derived run's earlier job whole before them.
SCHEDULER_POOL = "spark.scheduler.pool"
POOLS_FILE = Path(__file__).with_name("spark_pools.xml")
FRESH_POOL = "ngsi-fresh"
BACKGROUND_POOL = "ngsi-background"


def scheduler_config() -> dict[str, str]:
    """The settings of a driver shared by several runs: FAIR scheduling over the platform's pools."""
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": POOLS_FILE.as_uri()}


def default_spark_config(
    master: str | None = None,
    *,
    remote: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    ui: bool | None = None,
) -> dict[str, Any]:
    """The settings of the platform's Spark session; arguments override the environment.

    ``remote`` (else ``NGSI_SPARK_REMOTE``), a Spark Connect URL ``sc://host:port``, makes the session a
    client of that server: only the session's SQL settings are sent, the server owns the rest. Otherwise
    the session is a driver in this process on ``master`` (else ``NGSI_SPARK_MASTER``, default
    ``local[*]``): ``spark://...`` for a standalone cluster, ``yarn``, ``k8s://...``.
    """
    # An explicit master (tests, benchmarks) wins over the environment's remote.
    remote = remote or (None if master else os.environ.get("NGSI_SPARK_REMOTE") or None)
    if remote:
        if not remote.startswith("sc://"):
            raise ValueError(f"NGSI_SPARK_REMOTE must be a Spark Connect URL sc://host:port, not {remote!r}")
        return {"spark.remote": remote, **sql_config(shuffle_partitions)}
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("NGSI_SPARK_MASTER", "local[*]")
    if master.startswith("local"):
        # Tasks run in the driver's JVM: it serves nobody but itself, so it binds the loopback address
        # (and Spark does not warn that the host name resolves to one).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return {
        "spark.master": master,
        "spark.app.name": "ngsi-assets",
        **sql_config(shuffle_partitions),
        **driver_config(driver_memory, ui=ui, master=master),
    }


PLAN_CACHE = "spark.connect.session.planCache.enabled"
# How long runs share one Spark Connect session before the next one starts; below the server's idle
# timeout (spark.connect.session.manager.defaultSessionTimeout, 60 min by default).
SHARED_SESSION_S = 3600
_SESSION_NAMESPACE = uuid.UUID("5c1d9f0e-8a8e-4d0b-9a59-6f1e4c2b7d31")


def shared_session_url(remote: str, session_conf: dict[str, str], now: float | None = None) -> str:
    """``remote`` with the session id the platform's runs share during this period.

    Spark Connect keeps Python workers, the registered data sources and the JIT-warm plans per
    session; a new session per run paid for them again (measured: the first read of a Python data
    source 2.2 s in a new session, 0.2 s in a known one; the first UDF 0.5 s, 0.15 s). The id is
    derived from the URL, the session settings (runs with other settings get another session) and
    the period, so every run of the period finds the same session and an idle one expires on the
    server. A URL that names its own ``session_id`` is left as it is.
    """
    if "session_id=" in remote:
        return remote
    period = int((time.time() if now is None else now) // SHARED_SESSION_S)
    key = json.dumps({"remote": remote, "conf": session_conf, "period": period}, sort_keys=True)
    session_id = uuid.uuid5(_SESSION_NAMESPACE, hashlib.sha256(key.encode()).hexdigest())
    return f"{remote}{';' if '/;' in remote else '/;'}session_id={session_id}"


def unique_plan_ids() -> bool:
    """Start this process's Spark Connect plan ids at a random point; False if pyspark has no counter.

    The server's plan cache (``spark.connect.session.planCache.*``, on by default) keys a resolved
    plan, a read's file listing included, by the request it came in, plan ids included. pyspark
    numbers plans from 0 in every process, so two runs of the same code on a shared session send
    identical requests, and the second would be answered with the file listing of the first: it
    would miss what the first one wrote. Random 60-bit starts make two runs' ids meet with a
    probability of about 1e-12; the cache stays on (measured: turning it off made a full run 25%
    slower, versioned_entities 10.6 -> 17 s, transaction_history 3.2 -> 6.7 s).
    """
    from pyspark.sql.connect.plan import LogicalPlan

    if not isinstance(getattr(LogicalPlan, "_nextPlanId", None), int):
        return False
    with LogicalPlan._lock:
        if LogicalPlan._nextPlanId < 2**40:  # not yet moved in this process
            LogicalPlan._nextPlanId = secrets.randbits(60) + 2**40
    return True


def _closed_session(exc: Exception) -> bool:
    """Whether connecting failed because the server already closed (or never reopens) that session."""
    text = str(exc)
    return "SESSION_CLOSED" in text or "SESSION_CHANGED" in text or "INVALID_HANDLE" in text


# Steps of a run side by side (ngsi_assets.executor) may ask for the session at once: one creates it.
_SESSION_LOCK = threading.Lock()


class PlatformSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session; through Spark Connect, on the session the period's runs share.

    ``NGSI_SPARK_SHARED_SESSION=0`` gives every run a session of its own. A shared session the server
    has closed (released by a client, or expired early by a shorter server timeout) is replaced by a
    session of the run's own, so a run never fails for it.

    ``pools_by_tag``: run tag -> the server's scheduler pool for the run's jobs (the first tag the run
    carries wins; none: the server's default pool). Runs of different pools get different shared
    sessions, since the pool is a setting of the session.
    """

    pools_by_tag: dict[str, str] = {}
    _pool: str | None = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:  # noqa: ANN401 (a classic or a Spark Connect session)
        """The session, with this thread's jobs tagged by the asset whose step asks for it (see
        ``tag_jobs_with_asset``)."""
        session = super().spark_session
        tag_jobs_with_asset(session)
        return session

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run = context.dagster_run
        self._pool = pool_for_tags(self.pools_by_tag, run.tags if run is not None else {})

    def _init_session(self) -> None:
        with _SESSION_LOCK:
            self._init_session_once()

    def _init_session_once(self) -> None:
        if self._spark_session is not None:
            return
        remote = self.spark_config.get("spark.remote")
        if not remote:  # a driver of the run's own: its jobs are the only ones, no pool to pick
            super()._init_session()
            return
        conf = {k: str(v) for k, v in self.spark_config.items() if k != "spark.remote"}
        if self._pool:
            conf[SCHEDULER_POOL] = self._pool
        if os.environ.get("NGSI_SPARK_SHARED_SESSION", "1") == "0":
            self._spark_session = spark_session_from_config({"spark.remote": remote, **conf})
            return
        shared = shared_session_url(str(remote), conf)
        if not unique_plan_ids():  # a pyspark without the counter: sharing is safe with the cache off
            conf[PLAN_CACHE] = "false"
        try:
            self._spark_session = spark_session_from_config({"spark.remote": shared, **conf})
        except Exception as exc:
            if not _closed_session(exc):
                raise
            log.warning("the shared Spark Connect session is closed (%s); this run uses a session of its own", exc)
            from pyspark.sql import SparkSession

            # The client of the closed session is the process's active one: close it now (left to
            # its finalizer, closing its channel at interpreter exit hangs) and forget it.
            failed = SparkSession.getActiveSession()
            if failed is not None:
                with contextlib.suppress(Exception):
                    failed.stop()
            self._spark_session = spark_session_from_config({"spark.remote": remote, **conf})


# Every Spark job of an asset's step carries the tag ``ngsi-asset-<asset>``: the Spark UI's job list and
# an event log tell which asset a job belongs to (benchmarks/bench_rebuild.py counts them per asset).
ASSET_TAG_PREFIX = "ngsi-asset-"


def asset_job_tag(asset: str) -> str:
    """The job tag of an asset's Spark jobs (a tag holds no comma; asset names are identifiers)."""
    return ASSET_TAG_PREFIX + asset.replace(",", "_")


def tag_jobs_with_asset(session: Any) -> None:  # noqa: ANN401 (a classic or a Spark Connect session)
    """Tag the Spark jobs this thread starts with the asset of the Dagster step running in it, if any.

    Spark keeps tags per thread (and Spark Connect's client per thread too), so a step's threads
    started by ``side_by_side`` add it again (``inherit_in_threads``). Outside a step, nothing.
    """
    from dagster import OpExecutionContext

    try:
        context = OpExecutionContext.get()
    except Exception:  # no step running in this thread
        return
    if context is None:
        return
    try:
        name = context.asset_key.path[-1]
    except Exception:  # an op that is not an asset, or a step of several assets
        name = context.op.name
    tag = asset_job_tag(name)
    _set_asset_tag(session, tag)
    inherit_in_threads(ASSET_TAG_PREFIX, functools.partial(_set_asset_tag, session, tag))


def _set_asset_tag(session: Any, tag: str) -> None:  # noqa: ANN401 (a classic or a Spark Connect session)
    """``tag`` as this thread's only asset tag (steps run one after another in one thread drop the
    previous step's)."""
    # A copy: a Spark Connect client returns its live set of the thread's tags.
    tags = set(session.getTags())
    if tag in tags and not any(t.startswith(ASSET_TAG_PREFIX) and t != tag for t in tags):
        return
    for old in tags:
        if old.startswith(ASSET_TAG_PREFIX) and old != tag:
            session.removeTag(old)
    if tag not in tags:
        session.addTag(tag)


def pool_for_tags(pools_by_tag: Mapping[str, str], tags: Mapping[str, str]) -> str | None:
    """The pool of the first tag in ``pools_by_tag`` that ``tags`` carry, else None (the default pool)."""
    return next((pool for tag, pool in pools_by_tag.items() if tag in tags), None)


def spark_resource(pools_by_tag: Mapping[str, str] | None = None, **overrides: Any) -> LazyPySparkResource:
    """The platform's Spark resource: the session starts (or connects) on first use, then is reused."""
    return PlatformSparkResource(spark_config=default_spark_config(**overrides), pools_by_tag=dict(pools_by_tag or {}))


def _tagged_union(frames: Sequence[DataFrame]) -> DataFrame:
    """One frame of ``frames``'s rows: ``_frame`` (the frame's index) and ``_f<index>`` (the row as a struct)."""
    from functools import reduce

    from pyspark.sql import functions as F

    tagged = [f.select(F.lit(i).alias("_frame"), F.struct(F.col("*")).alias(f"_f{i}")) for i, f in enumerate(frames)]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)


def computed_once(*frames: DataFrame) -> tuple[DataFrame, ...]:
    """``frames`` computed now, together in one Spark job, and kept where they ran (``localCheckpoint``).

    For a run's small frames read by several later jobs (a count, a write, a check). ``persist`` keeps
    the rows but not the plan: each later job sends the whole plan again, and through Spark Connect
    the server analyses and optimises it every time (with the SQL sinks' naming UDFs, about a second
    a job on two cores, whatever the rows). Plans over the kept rows are a reference to them, and
    all frames cost one job and one planning (the records and the rejects of a sink, say).

    The rows live on the executors that computed them, in memory spilling to disk, until the
    returned frames are garbage collected: an executor lost in between fails the run, which the
    next run repeats (``persist`` would recompute them). Keep it for frames that follow a run's new
    data, never a whole history.
    """
    from pyspark.sql import functions as F

    if not frames:
        return ()
    kept = _tagged_union(frames).localCheckpoint()
    return tuple(kept.where(F.col("_frame") == i).select(f"_f{i}.*") for i in range(len(frames)))


def row_count(df: DataFrame) -> DataFrame:
    """``df``'s row count as a one-row frame (column ``n``): a count for ``collect_small``."""
    from pyspark.sql import functions as F

    return df.agg(F.count("*").alias("n"))


def collect_small(**frames: DataFrame) -> dict[str, list[Row]]:
    """The rows of several small frames, fetched in one Spark job: ``{name: rows}``.

    For an asset's metadata and checks (counts per value, a preview, a check's examples): each is a
    few rows, and through Spark Connect each ``collect`` of its own is a round trip and a planning
    of its own (0.1-0.3 s on two cores, whatever the rows). Every frame must be small by
    construction (an aggregation over few groups, or a ``limit``): the rows come to the driver.
    """
    if not frames:
        return {}
    names = list(frames)
    out: dict[str, list[Row]] = {n: [] for n in names}
    for row in _tagged_union([frames[n] for n in names]).collect():
        i = row["_frame"]
        out[names[i]].append(row[f"_f{i}"])
    return out
