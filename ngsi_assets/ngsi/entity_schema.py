"""The versioned-entities schema (seed 004): target entities, their fields, and source-system mappings.

A YAML file validated with pydantic; a bad file fails before any run with errors naming the offending
path (``entities.order.fields.order_customer.linkEntity: no target entity 'customr'``).

```yaml
entities:
  product:
    fields:
      product_number: {type: integer, key: true}
      product_description: {type: text, length: 100}
  order:
    fields:
      order_number: {type: integer, key: true}
      order_customer: {type: link, linkEntity: customer, linkKey: [customer_number]}
      order_lines: {type: children, childEntity: order_line, parentIdentifier: order, childSequence: line_number}
sourceSystems:
  shop:
    mappings:
      order:                       # a source entity ...
        - reference: customer      # ... written to one or more target entities, in this order
          priority: 5
          fields: [{reference: customer_number}, {reference: customer_name, priority: 7}]
        - reference: order
```

Without a schema (or for a source entity it does not name) the **default mapping** applies: a
data-hub message goes to the target entity of the same name with fields matched by name, and an NGSI
entity of type T goes to the target entity T keyed by ``fiware_service``, ``fiware_service_path`` and
``entity_id``, with one text field per attribute (``entity_type`` too).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# The standard columns of every target table; no business field may take these names.
GUID = "guid"
VALID_FROM = "valid_from_timestamp"
VALID_TO = "valid_to_timestamp"
DELETED = "deleted_indicator"
SOURCE_MESSAGE = "source_message"
FIELD_PROVENANCE = "field_provenance"
STANDARD_FIELDS = (GUID, VALID_FROM, VALID_TO, DELETED, SOURCE_MESSAGE, FIELD_PROVENANCE)

# The fields of an NGSI source record (besides one per attribute), and the default NGSI keys.
NGSI_SERVICE = "fiware_service"
NGSI_SERVICE_PATH = "fiware_service_path"
NGSI_ENTITY_ID = "entity_id"
NGSI_ENTITY_TYPE = "entity_type"
NGSI_KEYS = (NGSI_SERVICE, NGSI_SERVICE_PATH, NGSI_ENTITY_ID)
NGSI_SOURCE_SYSTEM = "ngsi"  # the source-system name under which a schema may map NGSI entity types

# Schema-defined names become Parquet and SQL column names: keep them plain (PostgreSQL's 63 limit).
MAX_NAME = 63
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

FieldKind = Literal["text", "integer", "decimal", "boolean", "timestamp", "link", "children"]


def _check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{what} {name!r}: use letters, digits and '_' only, not starting with a digit")
    if len(name) > MAX_NAME:
        raise ValueError(f"{what} {name!r} is {len(name)} characters long; the limit is {MAX_NAME}")
    return name


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldDef(_Model):
    """A target field: its type, whether it is part of the key, and link/children settings."""

    type: FieldKind = "text"
    length: Annotated[int, Field(gt=0)] | None = None
    precision: Annotated[int, Field(ge=1, le=38)] | None = None
    scale: Annotated[int, Field(ge=0, le=38)] | None = None
    key: bool = False
    linkEntity: str | None = None
    linkKey: list[str] | None = None
    childEntity: str | None = None
    parentIdentifier: str | None = None
    childSequence: str | None = None

    @model_validator(mode="after")
    def _by_type(self) -> FieldDef:
        if self.length is not None and self.type != "text":
            raise ValueError(f"length applies to text fields, not {self.type}")
        if (self.precision is not None or self.scale is not None) and self.type != "decimal":
            raise ValueError(f"precision and scale apply to decimal fields, not {self.type}")
        if self.type == "decimal" and self.scale is not None and self.scale > (self.precision or 38):
            raise ValueError(f"scale {self.scale} is larger than precision {self.precision or 38}")
        if self.type == "link":
            if not self.linkEntity:
                raise ValueError("a link field needs linkEntity")
        elif self.linkEntity or self.linkKey:
            raise ValueError("linkEntity and linkKey apply to link fields only")
        if self.type == "children":
            if not self.childEntity or not self.parentIdentifier:
                raise ValueError("a children field needs childEntity and parentIdentifier")
            if self.key:
                raise ValueError("a children field cannot be a key")
        elif self.childEntity or self.parentIdentifier or self.childSequence:
            raise ValueError("childEntity, parentIdentifier and childSequence apply to children fields only")
        return self

    @property
    def stored(self) -> bool:
        """Whether the field is a column of its table (children fields are not)."""
        return self.type != "children"


class TargetEntity(_Model):
    """A target table: its fields, and the unique-facts and export settings."""

    fields: dict[str, FieldDef]
    unique: bool = False
    uniqueIdentifier: str | None = None
    uniqueSequence: str | None = None
    export: bool = False
    exportIdentifier: str | None = None
    exportStandardFields: bool = False

    @field_validator("fields")
    @classmethod
    def _field_names(cls, fields: dict[str, FieldDef]) -> dict[str, FieldDef]:
        for name in fields:
            _check_name(name, "field")
            if name in STANDARD_FIELDS:
                raise ValueError(f"field {name!r} clashes with a standard column ({', '.join(STANDARD_FIELDS)})")
        if not fields:
            raise ValueError("an entity needs at least one field")
        return fields

    @model_validator(mode="after")
    def _keys(self) -> TargetEntity:
        for setting in ("uniqueIdentifier", "uniqueSequence"):
            name = getattr(self, setting)
            if name is None:
                continue
            if not self.unique:
                raise ValueError(f"{setting} applies to unique entities (unique: true)")
            if name not in self.fields or not self.fields[name].key:
                raise ValueError(f"{setting} {name!r} must be one of the entity's key fields")
        if self.unique and not self.uniqueIdentifier:
            raise ValueError("a unique entity needs uniqueIdentifier")
        if not self.key_fields:
            raise ValueError("an entity needs at least one key field (key: true)")
        if self.exportIdentifier is not None and self.exportIdentifier not in self.fields:
            raise ValueError(f"exportIdentifier {self.exportIdentifier!r} is not a field of the entity")
        if (self.exportIdentifier is not None or self.exportStandardFields) and not self.export:
            raise ValueError("exportIdentifier and exportStandardFields apply to export entities (export: true)")
        return self

    @property
    def key_fields(self) -> tuple[str, ...]:
        return tuple(name for name, f in self.fields.items() if f.key)

    @property
    def stored_fields(self) -> dict[str, FieldDef]:
        return {name: f for name, f in self.fields.items() if f.stored}


class FieldMapping(_Model):
    """Where a target field's value comes from in the source record, and its priority."""

    reference: str
    source: str | None = None
    priority: int | None = None
    sourceLinkKey: list[str] | None = None

    @property
    def source_name(self) -> str:
        return self.source or self.reference


class EntityMapping(_Model):
    """A source entity written to one target entity; ``fields`` omitted means every field by name."""

    reference: str
    priority: int = 0
    fields: list[FieldMapping] | None = None


class SourceSystem(_Model):
    """A collection of processing rules: source entity -> the target entities it is written to.

    ``reader`` is the message reader: ``json`` (the default: ``data`` is an array of objects) or
    ``csv`` (``data`` may also be CSV text: a header line naming the fields, then one record per line).
    """

    reader: Literal["json", "csv"] = "json"
    mappings: dict[str, list[EntityMapping]]

    @field_validator("mappings")
    @classmethod
    def _not_empty(cls, mappings: dict[str, list[EntityMapping]]) -> dict[str, list[EntityMapping]]:
        for source, targets in mappings.items():
            if not targets:
                raise ValueError(f"source entity {source!r} maps to no target entity")
        return mappings


class EntitySchema(_Model):
    """The whole schema; cross references (links, children, mappings) are checked here."""

    def csv_systems(self) -> list[str]:
        """The source systems whose messages may carry CSV text."""
        return sorted(name for name, system in self.sourceSystems.items() if system.reader == "csv")

    entities: dict[str, TargetEntity] = {}
    sourceSystems: dict[str, SourceSystem] = {}

    @field_validator("entities")
    @classmethod
    def _entity_names(cls, entities: dict[str, TargetEntity]) -> dict[str, TargetEntity]:
        for name in entities:
            _check_name(name, "entity")
        return entities

    @model_validator(mode="after")
    def _references(self) -> EntitySchema:
        for name, entity in self.entities.items():
            for fname, f in entity.fields.items():
                where = f"entities.{name}.fields.{fname}"
                if f.type == "link":
                    target = self.entities.get(f.linkEntity or "")
                    if target is None:
                        raise ValueError(f"{where}.linkEntity: no target entity {f.linkEntity!r}")
                    for k in f.linkKey or target.key_fields:
                        if k not in target.stored_fields:
                            raise ValueError(f"{where}.linkKey: {k!r} is not a field of {f.linkEntity!r}")
                if f.type == "children":
                    child = self.entities.get(f.childEntity or "")
                    if child is None:
                        raise ValueError(f"{where}.childEntity: no target entity {f.childEntity!r}")
                    parent = child.fields.get(f.parentIdentifier or "")
                    if parent is None or parent.type != "link" or parent.linkEntity != name or not parent.key:
                        raise ValueError(
                            f"{where}.parentIdentifier: {f.parentIdentifier!r} must be a key link field of "
                            f"{f.childEntity!r} with linkEntity {name!r}"
                        )
                    if f.childSequence is not None:
                        seq = child.fields.get(f.childSequence)
                        if seq is None or not seq.key or seq.type != "integer":
                            raise ValueError(
                                f"{where}.childSequence: {f.childSequence!r} must be an integer key field of "
                                f"{f.childEntity!r}"
                            )
                    if any(cf.type == "children" for cf in child.fields.values()):
                        raise ValueError(f"{where}.childEntity: children of children are not supported")
        for sname, system in self.sourceSystems.items():
            for source, targets in system.mappings.items():
                for i, m in enumerate(targets):
                    where = f"sourceSystems.{sname}.mappings.{source}[{i}]"
                    target = self.entities.get(m.reference)
                    if target is None:
                        raise ValueError(f"{where}.reference: no target entity {m.reference!r}")
                    for j, fm in enumerate(m.fields or []):
                        if fm.reference not in target.fields:
                            raise ValueError(
                                f"{where}.fields[{j}].reference: {fm.reference!r} is not a field of {m.reference!r}"
                            )
        return self

    def mappings_for(self, source_system: str | None, source_entity: str) -> list[EntityMapping] | None:
        """The target mappings of a source entity: the source system's, else the default (same name).

        None when neither exists (a data-hub message for an unknown entity).
        """
        system = self.sourceSystems.get(source_system or "")
        if system is not None and source_entity in system.mappings:
            return list(system.mappings[source_entity])
        if source_entity in self.entities:
            return [EntityMapping(reference=source_entity)]
        return None

    def mapped_source_entities(self, source_system: str) -> list[str]:
        """The source entities of ``source_system`` that ``mappings_for`` maps (sorted): its own
        mappings' and the target entities' names. Any other NGSI entity type is a default entity."""
        system = self.sourceSystems.get(source_system)
        return sorted({*(system.mappings if system is not None else ()), *self.entities})

    def processing_order(self) -> list[str]:
        """Target entities with every link target before the entities linking to it."""
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in order or name in visiting:
                return  # a cycle is resolved by reprocessing (status 1) rather than refused
            visiting.add(name)
            for f in self.entities[name].fields.values():
                if f.type == "link" and f.linkEntity != name:
                    visit(f.linkEntity or "")
            visiting.discard(name)
            order.append(name)

        for name in sorted(self.entities):
            visit(name)
        return order


class SchemaError(ValueError):
    """The schema file is missing, not YAML, or invalid; the message names every problem's path."""


def parse_schema(data: object, origin: str = "schema") -> EntitySchema:
    """Validate a parsed YAML/JSON document; errors name the path of each problem."""
    if data is None:
        return EntitySchema()
    try:
        return EntitySchema.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path}: {msg}" if path else msg)
        raise SchemaError(f"{origin}: " + "; ".join(problems)) from None


def load_schema(path: str | Path | None) -> EntitySchema:
    """The schema in the YAML file at ``path``; the empty schema (default mappings only) for None."""
    if path is None or str(path) == "":
        return EntitySchema()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"{p}: cannot read the schema file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchemaError(f"{p}: not valid YAML: {exc}") from None
    return parse_schema(data, str(p))


def entity_folder(name: str) -> str:
    """A lake folder name for a target entity: its plain characters and a hash of the whole name.

    Entity names from NGSI types can hold any character (NGSI-LD types are URIs); the hash keeps
    ``a/b`` and ``a_b`` apart.
    """
    import hashlib

    plain = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:60] or "entity"
    return f"{plain}-{hashlib.sha1(name.encode('utf-8')).hexdigest()[:10]}"
