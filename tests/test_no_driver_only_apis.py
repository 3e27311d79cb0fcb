"""Product code uses no driver-only Spark API, so it runs through Spark Connect and on any cluster.

``sparkContext``, the py4j gateway (``_jvm``, ``_jsc``, ``_gateway``, ``_jdf``...), RDDs and ``SparkContext``
exist only in a classic session whose driver is the calling process; through Spark Connect they raise.
The check reads the syntax tree of every module of the product packages, so comments and strings that
name these APIs do not count, and any use, however spelled in the code, does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT_PACKAGES = ("ngsi_assets", "resources")
FORBIDDEN_ATTRIBUTES = {"sparkContext", "rdd", "_jvm", "_jsc", "_jdf", "_jsparkSession", "_gateway", "_sc", "_jconf"}
FORBIDDEN_NAMES = {"SparkContext", "SparkConf", "py4j"}


def driver_only_uses(source: str, filename: str = "<source>") -> list[str]:
    """``line: what`` for every driver-only API the module's code uses."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            names = [a.name for a in node.names]
            if any(m and m.split(".")[0] == "py4j" for m in modules) or set(names) & FORBIDDEN_NAMES:
                found.append(f"{node.lineno}: import {', '.join(filter(None, modules))}")
    return found


def product_modules() -> list[Path]:
    return sorted(p for package in PRODUCT_PACKAGES for p in (REPO / package).rglob("*.py"))


def test_the_product_modules_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in product_modules()}
    assert {"resources/lake.py", "resources/spark.py", "ngsi_assets/sinks/sql_writer.py"} <= names


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_driver_only_spark_api(path: Path) -> None:
    assert driver_only_uses(path.read_text(), str(path)) == []


@pytest.mark.parametrize(
    "code",
    [
        "spark.sparkContext.setLogLevel('ERROR')",
        "df.rdd.mapPartitions(f).collect()",
        "spark._jvm.org.apache.hadoop.fs.Path(uri)",
        "conf = spark._jsc.hadoopConfiguration()",
        "from pyspark import SparkContext",
        "from py4j.java_gateway import JavaObject",
        "import py4j",
        "sc = SparkContext.getOrCreate()",
    ],
)
def test_the_check_catches_each_driver_only_api(code: str) -> None:
    assert driver_only_uses(code) != []


def test_the_check_ignores_comments_strings_and_dataframe_apis() -> None:
    code = (
        "# spark.sparkContext is not used here\n"
        "doc = 'no .rdd, no _jvm'\n"
        "df.mapInArrow(f, schema).collect()\n"
        "spark.conf.get('spark.sql.shuffle.partitions')\n"
    )
    assert driver_only_uses(code) == []
