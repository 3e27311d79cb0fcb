"""MongoResource against the MongoDB-wire server the test session starts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError
from pymongo.errors import DuplicateKeyError

from resources.mongo import MongoConnectionError, MongoResource
from tests.support.servers import free_port, fresh_mongo_database, with_database

integration = pytest.mark.integration


@pytest.fixture
def mongo(mongo_url: str) -> Iterator[MongoResource]:
    """A resource on a database of this test's own."""
    with fresh_mongo_database(mongo_url) as url:
        yield MongoResource(url=url)


def docs(resource: MongoResource, collection: str = "readings") -> list[dict[str, object]]:
    with resource.client() as client:
        return list(resource.get_database(client)[collection].find({}, {"_id": 0}).sort("n", 1))


@integration
def test_a_client_writes_and_reads_back(mongo: MongoResource) -> None:
    with mongo.client() as client:
        readings = mongo.get_database(client)["readings"]
        readings.insert_many([{"n": 1, "entityId": "Room1"}, {"n": 2, "entityId": "Room2"}])
        assert readings.count_documents({}) == 2
    assert docs(mongo) == [{"n": 1, "entityId": "Room1"}, {"n": 2, "entityId": "Room2"}]


@integration
def test_a_committed_transaction_lands_whole(mongo: MongoResource) -> None:
    with mongo.client() as client:
        readings = mongo.get_database(client)["readings"]
        readings.insert_one({"n": 0})  # the collection exists before the transaction
        with client.start_session() as session, session.start_transaction():
            readings.insert_many([{"n": 1}, {"n": 2}], session=session)
            assert readings.count_documents({}, session=session) == 3
    assert docs(mongo) == [{"n": 0}, {"n": 1}, {"n": 2}]


@integration
def test_an_aborted_transaction_leaves_nothing(mongo: MongoResource) -> None:
    with mongo.client() as client:
        readings = mongo.get_database(client)["readings"]
        readings.insert_one({"_id": "keep", "n": 0})
        with client.start_session() as session:
            session.start_transaction()
            readings.insert_one({"n": 1}, session=session)
            assert readings.count_documents({}, session=session) == 2
            assert readings.count_documents({}) == 1  # not visible outside the transaction
            session.abort_transaction()
    assert docs(mongo) == [{"n": 0}]


@integration
def test_an_error_inside_a_transaction_rolls_all_of_it_back(mongo: MongoResource) -> None:
    with mongo.client() as client:
        readings = mongo.get_database(client)["readings"]
        readings.insert_one({"_id": "a", "n": 0})
        with pytest.raises(DuplicateKeyError), client.start_session() as session, session.start_transaction():
            readings.insert_one({"_id": "b", "n": 1}, session=session)
            readings.insert_one({"_id": "a", "n": 2}, session=session)
    assert docs(mongo) == [{"n": 0}]


@integration
def test_datetimes_come_back_timezone_aware_in_utc(mongo: MongoResource) -> None:
    when = dt.datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=dt.UTC)
    with mongo.client() as client:
        collection = mongo.get_database(client)["times"]
        collection.insert_one({"_id": 1, "recvTime": when})
        assert collection.find_one({"_id": 1})["recvTime"] == when


@integration
def test_wrong_credentials_give_a_clear_error(mongo_url: str) -> None:
    parts = urlsplit(mongo_url)
    bad = parts._replace(netloc=f"intruder:Wr0ng-Secret@{parts.netloc.rpartition('@')[2]}").geturl()
    with pytest.raises(MongoConnectionError, match="authentication failed") as raised, MongoResource(url=bad).client():
        pass
    message = str(raised.value)
    assert f"intruder@{parts.hostname}:{parts.port}" in message
    assert "Wr0ng-Secret" not in message


def test_an_unreachable_server_fails_within_the_timeout() -> None:
    port = free_port()
    resource = MongoResource(url=f"mongodb://127.0.0.1:{port}/", server_selection_timeout_ms=300)
    expected = f"cannot reach MongoDB at 127.0.0.1:{port} within 300 ms"
    with pytest.raises(MongoConnectionError, match=expected), resource.client():
        pass


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mysql://u:s3cret@h/db", "must start with mongodb://"),
        ("mongodb://u:s3cret@h:notaport/db", "invalid MongoDB URL"),
        ("mongodb://u:s3cret@h/db?noSuchOption=1&w=banana", "invalid MongoDB URL"),
        ("mongodb+srv://u:s3cret@/db", "names no host"),
    ],
)
def test_a_bad_url_is_refused_with_a_clear_message_and_no_password(url: str, expected: str) -> None:
    with pytest.raises(ValidationError, match=expected) as raised:
        MongoResource(url=url)
    assert "s3cret" not in str(raised.value)


def test_the_database_comes_from_config_or_the_url_path() -> None:
    assert MongoResource(url="mongodb://h/sth_default").database_name == "sth_default"
    assert MongoResource(url="mongodb://h/sth_default", database="other").database_name == "other"
    assert MongoResource(url="mongodb://h/").database_name is None
    assert "s3cret" not in repr(MongoResource(url="mongodb://u:s3cret@h/"))


@integration
def test_get_database_without_a_name_is_an_error(mongo_url: str) -> None:
    resource = MongoResource(url=with_database(mongo_url, ""))
    with resource.client() as client, pytest.raises(ValueError, match="no database configured"):
        resource.get_database(client)
