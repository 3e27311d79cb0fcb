"""The resource configuring where the transaction history is published.

The store itself (its lake layout and commit protocol) is ``ngsi_assets.history_store``; its Spark
logic is in ``ngsi_assets.transforms.transaction_history``.
"""

from __future__ import annotations

import os

from dagster import ConfigurableResource
from pydantic import Field

DEFAULT_SCHEMA = "ngsi_history"


class TransactionHistoryResource(ConfigurableResource):
    """Where the transaction history is published (PostgreSQL; off when no URL) and under which schema."""

    postgres_url: str | None = Field(
        default=None, description="postgresql://user:password@host:port/db to publish to; None: lake only."
    )
    schema_name: str = Field(default=DEFAULT_SCHEMA, description="PostgreSQL schema of the space tables.")

    @classmethod
    def from_env(cls) -> TransactionHistoryResource:
        """NGSI_HISTORY_POSTGRES_URL (else NGSI_POSTGRES_URL) and NGSI_HISTORY_SCHEMA."""
        url = os.environ.get("NGSI_HISTORY_POSTGRES_URL") or os.environ.get("NGSI_POSTGRES_URL") or None
        return cls(postgres_url=url, schema_name=os.environ.get("NGSI_HISTORY_SCHEMA", DEFAULT_SCHEMA))
