"""Lake history rows -> rows for the PostgreSQL history tables: one row per history row, keyed by ``i`` (and ``uuid``).

``jsondata`` is the feature as XYZ Hub keeps it, a GeoJSON-like Feature whose properties are the
state's fields plus the XYZ namespace::

    {"type":"Feature","id":<id>,"properties":{...state...,
      "@ns:com:here:xyz":{"uuid":..,"puuid":..,"action":"UPDATE","tnx":..,"createdAt":<ms>,"updatedAt":<ms>}}}

``createdAt`` is ``created_at`` and ``updatedAt`` is ``ts``, both in ms since the epoch. ``puuid`` is
null on a CREATE (a chain's first row has no predecessor), in the column and the JSON, and a null
``puuid`` is left out of the JSON. Built with Spark's JSON functions only (no UDF): the state's text is
kept as it is (key order, number spelling) and the namespace object appended as its last key, so a
state key ``@ns:com:here:xyz`` (which NGSI names cannot spell) would be shadowed by ours in ``jsonb``.
A state that is not a JSON object, or an action outside 0..3, fails the job naming the row's ``i``:
the lake's history never holds one.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ngsi_assets.ngsi.transactions import Action

XYZ_NAMESPACE = "@ns:com:here:xyz"
OUTPUT_COLUMNS = ("i", "action", "tnx", "ts", "id", "uuid", "puuid", "last_updated_by", "jsondata")
_ACTION_NAMES = [a.name for a in sorted(Action)]


def _fail(message: str, i: Column) -> Column:
    return F.raise_error(F.concat(F.lit(f"feature_rows: {message} in history row i="), i.cast("string")))


def feature_rows(history: DataFrame) -> DataFrame:
    """One publishable row per lake history row: ``i, action, tnx, ts, id, uuid, puuid, last_updated_by, jsondata``."""
    i = F.col("i")
    action = F.col("action")
    action_name = F.when(
        action.between(0, len(_ACTION_NAMES) - 1),
        F.element_at(F.array(*[F.lit(n) for n in _ACTION_NAMES]), (action + 1).cast("int")),
    ).otherwise(_fail("action outside 0..3", i))
    puuid = F.when(action == int(Action.CREATE), F.lit(None).cast("string")).otherwise(F.col("puuid"))
    namespace = F.to_json(
        F.struct(
            F.col("uuid").alias("uuid"),
            puuid.alias("puuid"),
            action_name.alias("action"),
            F.col("tnx").alias("tnx"),
            F.unix_millis(F.col("created_at")).alias("createdAt"),
            F.unix_millis(F.col("ts")).alias("updatedAt"),
        )
    )
    member = F.concat(F.lit(f'"{XYZ_NAMESPACE}":'), namespace)
    state = F.col("state")
    keys = F.json_object_keys(state)
    properties = (
        F.when(keys.isNull(), _fail("state is not a JSON object", i))
        .when(F.size(keys) == 0, F.concat(F.lit("{"), member, F.lit("}")))
        # The object's closing brace gives way to the namespace, appended as the last member.
        .otherwise(F.concat(F.regexp_replace(state, r"\}\s*$", ""), F.lit(","), member, F.lit("}")))
    )
    head = F.to_json(F.struct(F.lit("Feature").alias("type"), F.col("id").alias("id")))
    jsondata = F.concat(F.regexp_replace(head, r"\}$", ""), F.lit(',"properties":'), properties, F.lit("}"))
    return history.select(
        i.alias("i"),
        action.alias("action"),
        F.col("tnx").alias("tnx"),
        F.col("ts").alias("ts"),
        F.col("id").alias("id"),
        F.col("uuid").alias("uuid"),
        puuid.alias("puuid"),
        F.col("last_updated_by").alias("last_updated_by"),
        jsondata.alias("jsondata"),
    )
