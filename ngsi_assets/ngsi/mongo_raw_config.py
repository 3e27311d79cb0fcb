"""Configuration of the raw MongoDB history (Cygnus NGSIMongoSink parameter names), validated with pydantic.

A Cygnus user carries ``db_prefix``, ``collection_prefix``, ``data_model``, ``enable_encoding``,
``attr_persistence``, ``attr_metadata_store``, ``collections_size``, ``max_documents``,
``data_expiration`` and the batch settings over unchanged (``NGSIMongoSink.configure`` and
``NGSIMongoBaseSink.configure`` in telefonicaid/fiware-cygnus). Errors name the offending field.

Where Cygnus silently does something other than what was asked, this refuses the configuration:

- a capped collection needs both ``collections_size`` and ``max_documents`` (Cygnus creates an
  uncapped, ever-growing collection when only one is set);
- ``data_expiration`` cannot be combined with capped collections (MongoDB refuses TTL indexes on
  them);
- ``attr_persistence=column`` with ``dm-by-attribute`` ("has no sense, so it is avoided", Cygnus's
  documentation).
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import Field, model_validator

from ngsi_assets.ngsi.sth_config import DataModel, MongoSinkParameters, STHConfig

# Environment variables read by ``MongoRawConfig.from_env`` (one per parameter, upper-cased).
ENV_PREFIX = "NGSI_MONGO_RAW_"
# Cygnus's lower bound for collections_size (bytes): MongoDB's smallest capped collection.
MIN_COLLECTIONS_SIZE = 4096


class AttrPersistence(StrEnum):
    ROW = "row"
    COLUMN = "column"


class MongoRawConfig(MongoSinkParameters):
    """The NGSIMongoSink parameters this platform honours (defaults are Cygnus's, but ``batch_size``)."""

    env_prefix: ClassVar[str] = ENV_PREFIX

    db_prefix: str = Field(default="sth_", description="Prepended to the service to name the database.")
    collection_prefix: str = Field(default="sth_", description="Prepended to every collection name.")
    data_model: DataModel = Field(
        default=DataModel.BY_ENTITY,
        description="dm-by-service-path, dm-by-entity or dm-by-attribute: one collection per service path, per "
        "entity or per attribute.",
    )
    enable_encoding: bool = Field(default=False, description="true: the new (x-hex) encoding; false: the old one.")
    attr_persistence: AttrPersistence = Field(
        default=AttrPersistence.ROW, description="row: a document per attribute update; column: per notified entity."
    )
    attr_metadata_store: bool = Field(default=False, description="Store the attribute metadata (attrMetadata).")
    collections_size: int = Field(
        default=0, ge=0, description="Bytes of a capped collection (with max_documents); 0: not capped."
    )
    max_documents: int = Field(
        default=0, ge=0, description="Documents of a capped collection (with collections_size); 0: not capped."
    )
    data_expiration: int = Field(
        default=0, ge=0, description="Seconds; documents whose recvTime is older are removed by a TTL index. 0: never."
    )
    batch_size: int = Field(default=1000, ge=1, le=100_000, description="Documents per MongoDB bulk insert.")
    batch_timeout: int = Field(
        default=30, ge=0, description="Accepted for compatibility; runs are batch jobs, nothing waits."
    )
    batch_ttl: int = Field(default=10, ge=-1, description="Retries of a failed bulk insert; -1: retry forever.")
    batch_retry_intervals: tuple[int, ...] = Field(
        default=(5000,), description="Milliseconds between retries; the last one repeats."
    )

    @model_validator(mode="after")
    def _consistent(self) -> MongoRawConfig:
        if 0 < self.collections_size < MIN_COLLECTIONS_SIZE:
            raise ValueError(f"collections_size must be 0 or at least {MIN_COLLECTIONS_SIZE} bytes")
        if bool(self.collections_size) != bool(self.max_documents):
            raise ValueError(
                "collections_size and max_documents must be set together for capped collections "
                "(Cygnus ignores one without the other and lets the collection grow)"
            )
        if self.capped and self.data_expiration:
            raise ValueError(
                "data_expiration cannot be combined with collections_size/max_documents: "
                "MongoDB does not allow TTL indexes on capped collections"
            )
        if self.attr_persistence is AttrPersistence.COLUMN and self.data_model is DataModel.BY_ATTRIBUTE:
            raise ValueError("attr_persistence=column cannot be combined with data_model=dm-by-attribute")
        return self

    @property
    def capped(self) -> bool:
        return self.collections_size > 0 and self.max_documents > 0

    def naming(self) -> STHConfig:
        """The naming parameters as an STH configuration (both sinks name collections the same way)."""
        return STHConfig(
            db_prefix=self.db_prefix,
            collection_prefix=self.collection_prefix,
            data_model=self.data_model,
            enable_encoding=self.enable_encoding,
            max_namespace_bytes=self.max_namespace_bytes,
        )
