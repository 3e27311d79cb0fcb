"""Every Spark job of an asset's step carries the tag ``ngsi-asset-<asset>`` (the Spark UI and event
logs tell which asset a job belongs to; ``benchmarks/bench_rebuild.py`` counts jobs per asset by it),
in the step's own thread and in the threads it starts with ``side_by_side``."""

from dagster import AssetExecutionContext, asset, materialize
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from resources.parallel import results, side_by_side
from resources.spark import ASSET_TAG_PREFIX, asset_job_tag, spark_resource

SEEN: dict[str, list[set[str]]] = {}


def _asset_tags(session: SparkSession) -> set[str]:
    return {t for t in session.getTags() if t.startswith(ASSET_TAG_PREFIX)}


@asset
def first_tagged(context: AssetExecutionContext, spark: LazyPySparkResource) -> None:
    session = spark.spark_session
    session.range(3).count()
    in_threads = results(side_by_side([lambda: _asset_tags(session)] * 2, name="tagged"))
    SEEN[context.asset_key.path[-1]] = [_asset_tags(session), *in_threads]


@asset(deps=[first_tagged])
def second_tagged(context: AssetExecutionContext, spark: LazyPySparkResource) -> None:
    session = spark.spark_session
    SEEN[context.asset_key.path[-1]] = [_asset_tags(session)]


def test_each_step_tags_its_jobs_with_its_asset_only(spark: SparkSession) -> None:
    SEEN.clear()
    result = materialize([first_tagged, second_tagged], resources={"spark": spark_resource(master="local[2]")})
    assert result.success
    assert SEEN["first_tagged"] == [{asset_job_tag("first_tagged")}] * 3
    # Steps one after another in one thread: the second drops the first's tag.
    assert SEEN["second_tagged"] == [{asset_job_tag("second_tagged")}]
    for tag in _asset_tags(spark):
        spark.removeTag(tag)


def test_no_tag_outside_a_step(spark: SparkSession) -> None:
    from resources.spark import tag_jobs_with_asset

    tag_jobs_with_asset(spark)
    assert _asset_tags(spark) == set()


class _LiveTagsSession:
    """The tag calls of a Spark Connect session: ``getTags`` returns the client's live set."""

    def __init__(self, tags: set[str]) -> None:
        self.tags = tags

    def getTags(self) -> set[str]:  # noqa: N802 (Spark's name)
        return self.tags

    def addTag(self, tag: str) -> None:  # noqa: N802
        self.tags.add(tag)

    def removeTag(self, tag: str) -> None:  # noqa: N802
        self.tags.discard(tag)


def test_a_live_tag_set_is_replaced_without_iterating_it_while_it_changes() -> None:
    from resources.spark import _set_asset_tag

    session = _LiveTagsSession({"run-tag", asset_job_tag("a"), asset_job_tag("b")})
    _set_asset_tag(session, asset_job_tag("c"))
    assert session.tags == {"run-tag", asset_job_tag("c")}
