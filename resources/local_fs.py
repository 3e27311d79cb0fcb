"""The Hadoop file system of local lakes: Hadoop's raw one, without a process per file when possible.

Hadoop's ``RawLocalFileSystem`` sets the permissions of every file and folder it creates by running
``chmod`` in a new process when no native Hadoop library is loaded, and pyspark ships none. A Spark
write of a few hundred small files (a run's buckets) then starts twice as many processes.
``jvm/ProcessFreeLocalFileSystem.java`` is that file system with ``setPermission`` done through
``java.nio`` (the same mode bits, no process). It is compiled here once per machine, with the JDK's
``javac`` against the Hadoop API jar pyspark ships, into a jar in the user's cache folder.

It is used only by drivers the platform starts itself whose tasks run in the driver's own JVM
(``local[...]``, in process or a Spark Connect server's): the jar is on that JVM's class path. On a
cluster the executors would need it too, so there the settings keep Hadoop's own raw file system.
With no ``javac`` (a JRE without the JDK) or ``NGSI_SPARK_PROCESS_FREE_FS=0``, Hadoop's is used as
well; only the speed of writes differs.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("jvm") / "ProcessFreeLocalFileSystem.java"
CLASS_NAME = "ngsiassets.fs.ProcessFreeLocalFileSystem"
HADOOP_RAW = "org.apache.hadoop.fs.RawLocalFileSystem"
SETTING = "NGSI_SPARK_PROCESS_FREE_FS"
# A master whose tasks run inside the driver's JVM (not ``local-cluster[...]``, which starts executors).
_IN_DRIVER = re.compile(r"local(\[[^\]]*\])?")


def cache_dir() -> Path:
    """Where the built jar is kept: ``$XDG_CACHE_HOME/ngsi-assets`` (else ``~/.cache/ngsi-assets``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ngsi-assets"


def hadoop_api_jar() -> Path | None:
    """pyspark's Hadoop client API jar, the one the class is compiled against (None if not found)."""
    from resources.spark import spark_home  # (resources.spark imports this module)

    jars = sorted((spark_home() / "jars").glob("hadoop-client-api-*.jar"))
    return jars[-1] if jars else None


def javac() -> Path | None:
    """The JDK's compiler: ``$JAVA_HOME/bin/javac``, else the first ``javac`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return Path(home) / "bin" / "javac"
    found = shutil.which("javac")
    return Path(found) if found else None


def build_jar(compiler: Path, api_jar: Path, target: Path) -> None:
    """Compile ``SOURCE`` against ``api_jar`` and write the jar to ``target`` (atomically: a reader
    never sees half a jar, and two processes building at once both leave a whole one)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ngsi-fs-", dir=target.parent) as tmp:
        classes = Path(tmp) / "classes"
        proc = subprocess.run(
            [str(compiler), "--release", "17", "-nowarn", "-cp", str(api_jar), "-d", str(classes), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"javac failed on {SOURCE.name}: {(proc.stderr or proc.stdout).strip()[-2000:]}")
        staged = Path(tmp) / "fs.jar"
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: ngsi-assets\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, target)


@functools.lru_cache(maxsize=1)
def process_free_jar() -> Path | None:
    """The jar holding ``CLASS_NAME``, built on first use; None when it cannot be (logged once)."""
    api_jar, compiler = hadoop_api_jar(), javac()
    if api_jar is None or compiler is None:
        log.info(
            "no %s: writes to a local lake start a chmod process per file (Hadoop's raw file system)",
            "javac (a JDK)" if compiler is None else "Hadoop API jar in pyspark",
        )
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + api_jar.name.encode()).hexdigest()[:16]
    target = cache_dir() / f"process-free-fs-{key}.jar"
    if not target.is_file():
        try:
            build_jar(compiler, api_jar, target)
        except (OSError, RuntimeError) as exc:
            log.warning("could not build %s (%s); using Hadoop's raw local file system", target, exc)
            return None
    return target


def local_file_settings(master: str) -> dict[str, str]:
    """The driver settings that choose the local lake's file system for ``master``.

    The process-free file system when its tasks run in the driver (``local[...]``), the jar can be
    built and ``NGSI_SPARK_PROCESS_FREE_FS`` is not ``0``; else Hadoop's raw local file system.
    """
    jar = None
    if _IN_DRIVER.fullmatch(master.strip()) and os.environ.get(SETTING, "1") != "0":
        jar = process_free_jar()
    if jar is None:
        return {"spark.hadoop.fs.file.impl": HADOOP_RAW}
    return {"spark.hadoop.fs.file.impl": CLASS_NAME, "spark.driver.extraClassPath": str(jar)}
