"""STH configuration: Cygnus parameter names, defaults, and errors naming the offending field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ngsi_assets.ngsi.sth_config import ALL_RESOLUTIONS, DataModel, Resolution, STHConfig
from resources.sth_mongo import STHSinkResource


def test_defaults_are_cygnus_defaults() -> None:
    cfg = STHConfig()
    assert cfg.resolutions == ALL_RESOLUTIONS
    assert (cfg.db_prefix, cfg.collection_prefix, cfg.data_model) == ("sth_", "sth_", DataModel.BY_ENTITY)
    assert (cfg.enable_encoding, cfg.data_expiration, cfg.ignore_white_spaces) == (False, 0, True)
    assert (cfg.batch_ttl, cfg.batch_retry_intervals) == (10, (5000,))


def test_resolutions_from_cygnus_text_in_canonical_order() -> None:
    assert STHConfig(resolutions="second, day,month").resolutions == (
        Resolution.MONTH,
        Resolution.DAY,
        Resolution.SECOND,
    )


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"resolutions": "day,week"}, "resolutions", "unknown resolution(s) ['week']"),
        ({"resolutions": ""}, "resolutions", "at least one resolution"),
        ({"data_model": "dm-by-service"}, "data_model", "dm-by-service-path"),
        ({"collection_prefix": "system.x"}, "collection_prefix", "'system.' is reserved"),
        ({"data_expiration": -1}, "data_expiration", "greater than or equal to 0"),
        ({"batch_size": 0}, "batch_size", "greater than or equal to 1"),
        ({"batch_retry_intervals": "100,-5"}, "batch_retry_intervals", ">= 0"),
        ({"ignore_white_spaces": "maybe"}, "ignore_white_spaces", "valid boolean"),
        ({"mongo_hosts": "x"}, "mongo_hosts", "Extra inputs are not permitted"),
    ],
)
def test_errors_name_the_field(kwargs: dict, field: str, text: str) -> None:
    with pytest.raises(ValidationError) as info:
        STHConfig(**kwargs)
    assert info.value.errors()[0]["loc"][0] == field
    assert text in str(info.value)


def test_retry_intervals_repeat_the_last() -> None:
    cfg = STHConfig(batch_retry_intervals="100,200")
    assert [cfg.retry_interval_ms(a) for a in (1, 2, 3, 4)] == [100, 200, 200, 200]


def test_from_env() -> None:
    cfg = STHConfig.from_env(
        {"NGSI_STH_RESOLUTIONS": "hour", "NGSI_STH_ENABLE_ENCODING": "true", "NGSI_STH_DATA_EXPIRATION": "3600"}
    )
    assert (cfg.resolutions, cfg.enable_encoding, cfg.data_expiration) == ((Resolution.HOUR,), True, 3600)


def test_sink_resource_from_env_and_validation() -> None:
    res = STHSinkResource.from_env({"NGSI_STH_DATA_MODEL": "dm-by-attribute"})
    assert res.mongo_url is None
    assert res.sth_config().data_model is DataModel.BY_ATTRIBUTE
    with pytest.raises(ValidationError, match="data_model"):
        STHSinkResource(data_model="dm-by-nothing")
    with pytest.raises(ValueError, match="must start with mongodb://"):
        STHSinkResource(mongo_url="http://x")
