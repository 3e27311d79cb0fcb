"""The time index of an attribute update, chosen as QuantumLeap chooses it.

In order of preference, the first that is present and parses as an ISO 8601 time:

1. the entity's ``TimeInstant`` attribute;
2. the attribute's own ``TimeInstant`` metadata (NGSI v2);
3. the attribute's ``observedAt`` (NGSI-LD);
4. the entity's ``dateModified`` (NGSI v2 built-in) or ``modifiedAt`` (NGSI-LD);
5. the receive time.

QuantumLeap takes the newest TimeInstant metadata over all of an entity's attributes because it
stores one row per entity; this platform keeps one row per attribute, so each attribute's own
metadata is the more exact time for it (as the STH seed specifies for TimeInstant).
"""

from __future__ import annotations

from enum import StrEnum


class TimeIndexSource(StrEnum):
    ENTITY_TIME_INSTANT = "TimeInstant"
    METADATA_TIME_INSTANT = "TimeInstant metadata"
    OBSERVED_AT = "observedAt"
    DATE_MODIFIED = "dateModified"
    RECV_TIME = "recvTime"


PREFERENCE = (
    TimeIndexSource.ENTITY_TIME_INSTANT,
    TimeIndexSource.METADATA_TIME_INSTANT,
    TimeIndexSource.OBSERVED_AT,
    TimeIndexSource.DATE_MODIFIED,
    TimeIndexSource.RECV_TIME,
)
