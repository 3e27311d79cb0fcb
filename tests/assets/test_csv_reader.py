"""The CSV message reader (seed 004's alternative message readers) end to end, with its errors."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from pyspark.sql import SparkSession

from resources.lake import LakeResource
from tests.assets.versioning_support import Msg, log_rows, process, schema_of, store_messages, table_rows

ENTITIES = {
    "product": {
        "fields": {
            "product_number": {"type": "integer", "key": True},
            "product_description": {"type": "text"},
            "unit_price": {"type": "decimal", "precision": 10, "scale": 2},
        }
    }
}
SCHEMA = schema_of(
    {
        "entities": ENTITIES,
        "sourceSystems": {
            "shop-csv": {"reader": "csv", "mappings": {"product": [{"reference": "product"}]}},
            "plain": {"mappings": {"product": [{"reference": "product"}]}},
        },
    }
)


def csv(mid: str, text: str, source: str = "shop-csv") -> Msg:
    return Msg(mid, "product", "2019-06-05T09:31:17", text, source=source)


def test_csv_messages_are_read_by_their_source_systems_reader(spark: SparkSession, tmp_path: Path) -> None:
    lake = LakeResource(root=str(tmp_path / "lake"))
    messages = [
        # Quoted cells keep their commas; an empty cell is an explicit null; blank lines are skipped.
        csv("c1", 'product_number,product_description,unit_price\r\n1,"Toaster, ""Breville""",19.5\n\n2,Kettle,\n'),
        csv("c2", "product_number,product_number\n7,8\n"),
        csv("c3", "product_number\n3\n", source="plain"),
        csv("c4", "product_number,product_description\n4,Fridge\n5,Oven,extra\n"),
        csv("c5", "product_number,,unit_price\n9,x,1\n"),
        Msg("c6", "product", "2019-06-05T09:31:17", [{"product_number": 6, "unit_price": "2.499"}], source="shop-csv"),
    ]
    hours = store_messages(spark, lake, messages)
    process(spark, lake, SCHEMA, hours)

    assert table_rows(
        spark, lake, "product", ["product_number", "product_description", "unit_price", "source_message"]
    ) == sorted(
        [
            (1, 'Toaster, "Breville"', Decimal("19.50"), "c1"),
            (2, "Kettle", None, "c1"),
            (4, "Fridge", None, "c4"),
            (6, None, Decimal("2.50"), "c6"),
        ],
        key=repr,
    )
    assert log_rows(spark, lake) == {
        "c1": (3, None),
        "c2": (4, "csv: the header repeats a field name"),
        "c3": (4, "data is text, and source system 'plain' has no csv reader"),
        "c4": (4, "csv record 2: more cells than the header has"),
        "c5": (4, "csv: the header has an empty field name"),
        "c6": (3, None),
    }


def test_text_is_an_error_when_no_source_system_reads_csv(spark: SparkSession, tmp_path: Path) -> None:
    """With no CSV reader in the schema the records skip the CSV parse: text is still refused, by
    message, and the records of other messages are folded as before."""
    schema = schema_of(
        {
            "entities": ENTITIES,
            "sourceSystems": {"plain": {"mappings": {"product": [{"reference": "product"}]}}},
        }
    )
    assert not schema.csv_systems()
    lake = LakeResource(root=str(tmp_path / "lake"))
    messages = [
        csv("t1", "product_number\n3\n", source="plain"),
        csv("t2", "product_number\n4\n", source="unknown"),
        Msg("j1", "product", "2019-06-05T09:31:17", [{"product_number": 6, "unit_price": "2.5"}], source="plain"),
    ]
    hours = store_messages(spark, lake, messages)
    process(spark, lake, schema, hours)

    assert table_rows(spark, lake, "product", ["product_number", "unit_price", "source_message"]) == [
        (6, Decimal("2.50"), "j1")
    ]
    assert log_rows(spark, lake) == {
        "t1": (4, "data is text, and source system 'plain' has no csv reader"),
        "t2": (4, "data is text, and source system 'unknown' has no csv reader"),
        "j1": (3, None),
    }
