"""NGSI vocabulary and the platform's fixed codes, as named constants."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Kind(StrEnum):
    """What protocol a landed message speaks."""

    NGSI_V2 = "ngsi-v2"
    NGSI_LD = "ngsi-ld"
    MESSAGE = "message"  # the generic data-hub message of seed 004


class Format(StrEnum):
    """Payload format of a landed message (the `format` column of the message store)."""

    NORMALIZED = "normalized"
    KEY_VALUES = "keyValues"
    SIMPLIFIED_NORMALIZED = "simplifiedNormalized"
    SIMPLIFIED_KEY_VALUES = "simplifiedKeyValues"
    LD_NORMALIZED = "ld-normalized"
    DATAHUB = "datahub"


class MessageStatus(IntEnum):
    """Seed 004 message status codes.

    The seed fixes 0 (stored, not yet processed), 1 (requires reprocessing) and 5 (previously
    received, a duplicate guid); the other values are this platform's.
    """

    RECEIVED = 0
    REQUIRES_REPROCESSING = 1
    PROCESSING = 2
    PROCESSED = 3
    ERROR = 4
    PREVIOUSLY_RECEIVED = 5


# HTTP headers, lower-cased (HTTP header names are case-insensitive).
HEADER_SERVICE = "fiware-service"
HEADER_SERVICE_PATH = "fiware-servicepath"
HEADER_CORRELATOR = "fiware-correlator"
HEADER_ATTRS_FORMAT = "ngsiv2-attrsformat"
HEADER_MESSAGE_GUID = "x-message-guid"

# Built-in NGSI v2 attributes and metadata.
ATTR_ALTERATION_TYPE = "alterationType"
ATTR_DATE_CREATED = "dateCreated"
ATTR_DATE_MODIFIED = "dateModified"
ATTR_TIME_INSTANT = "TimeInstant"
MD_TIME_INSTANT = "TimeInstant"
ALTERATION_TYPES = ("entityCreate", "entityUpdate", "entityDelete", "entityChange")

# NGSI-LD vocabulary.
LD_NOTIFICATION = "Notification"
LD_PROPERTY = "Property"
LD_RELATIONSHIP = "Relationship"
LD_GEOPROPERTY = "GeoProperty"
LD_LANGUAGE_PROPERTY = "LanguageProperty"
LD_OBSERVED_AT = "observedAt"
LD_DATASET_ID = "datasetId"
LD_CONTEXT = "@context"

DEFAULT_SERVICE = "default"
DEFAULT_SERVICE_PATH = "/"
