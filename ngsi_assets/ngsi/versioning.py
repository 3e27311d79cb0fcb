"""The versioning rules of seed 004 as one pure fold: a key's records in effective order -> its versions.

The history of a key is a function of the *set* of records that ever touched it: records are applied in
(effective timestamp, message identifier, record sequence) order, whatever order they arrived or were
processed in. A late message therefore "splits the right version and re-derives the later ones" by
construction, and any permutation or partitioning of the messages gives the same rows. The Spark
asset re-folds the keys a run touches (see ``ngsi_assets.transforms.versioned_entities``).

Rules (the seed's, with the choices its text leaves open written down):

- **Insert** (no row yet): every field present in the record is set; provenance ``{m, p}`` for each
  of them (an explicit null is a statement, so it gets provenance too) and for ``guid`` (entity priority).
- **Update** of a live row: a present field is updated when its value differs and the incoming field
  priority is >= the priority in its provenance; its provenance becomes the message and that
  priority. A missing field keeps its value. Keys never change (the key identifies the row).
  The guid's provenance moves to the incoming message only if the entity priority is *higher* than the
  guid's, even when no field changed (that alone makes a new version); otherwise it stays.
  A record that changes nothing creates no version.
- **Delete** of a live row: applied when the entity priority is >= the guid's. The row gets
  ``deleted_indicator`` true; every non-key field that has provenance is set to null with provenance
  (message, entity priority); keys keep theirs; the guid gets (message, entity priority).
- **Delete of a deleted row**: applied only with an entity priority *higher* than the guid's; it only
  raises the guid's provenance (so a low-priority insert cannot undo it).
- **Recreate** (an update of a deleted row): applied when the entity priority is >= the guid's; every
  present field is set, the guid rule is the update rule.
- **Refresh deletes** (generated for rows a refresh message did not contain): deletes that apply only
  to a live row.
- A delete for a key that has no row yet creates nothing.
- **Same effective timestamp**: a record whose effective timestamp equals the valid-from of the key's
  newest row is ignored (the seed's reprocessing rule; for two messages with the same timestamp the
  first in message-identifier order wins).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

UPSERT = "upsert"
DELETE = "delete"
REFRESH_DELETE = "refresh_delete"
OPS = (UPSERT, DELETE, REFRESH_DELETE)
_OP_ORDER = {UPSERT: 0, DELETE: 1, REFRESH_DELETE: 2}
GUID_FIELD = "guid"


@dataclass(frozen=True)
class Record:
    """One incoming record for one key of one target entity (values already converted to canonical text)."""

    guid: str
    effective: datetime
    message: str
    seq: int
    op: str
    priority: int
    fields: Mapping[str, str | None]  # present fields only; None is an explicit null
    field_priority: Mapping[str, int] = field(default_factory=dict)
    key_fields: Sequence[str] = ()

    def order(self) -> tuple[datetime, str, int, int]:
        return (self.effective, self.message, self.seq, _OP_ORDER[self.op])


@dataclass(frozen=True)
class Version:
    """One row of a target table: a state of the key valid from ``valid_from`` until ``valid_to``."""

    guid: str
    valid_from: datetime
    valid_to: datetime | None
    deleted: bool
    fields: dict[str, str | None]
    provenance: dict[str, tuple[str, int]]  # field (and "guid") -> (message, priority)
    source_message: str


@dataclass
class _State:
    fields: dict[str, str | None]
    provenance: dict[str, tuple[str, int]]
    deleted: bool


def _apply(state: _State | None, r: Record) -> _State | None:
    """The state after ``r``, or None when ``r`` changes nothing."""
    keys = set(r.key_fields)
    if state is None:
        if r.op != UPSERT:
            return None
        prov = {GUID_FIELD: (r.message, r.priority)}
        for name in r.fields:
            prov[name] = (r.message, r.field_priority.get(name, r.priority))
        return _State(dict(r.fields), prov, False)

    guid_p = state.provenance[GUID_FIELD][1]
    if r.op in (DELETE, REFRESH_DELETE):
        if state.deleted:
            if r.op == REFRESH_DELETE or r.priority <= guid_p:
                return None
            prov = dict(state.provenance)
            prov[GUID_FIELD] = (r.message, r.priority)
            return _State(dict(state.fields), prov, True)
        if r.priority < guid_p:
            return None
        fields = dict(state.fields)
        prov = dict(state.provenance)
        for name in state.provenance:
            if name != GUID_FIELD and name not in keys:
                fields[name] = None
                prov[name] = (r.message, r.priority)
        prov[GUID_FIELD] = (r.message, r.priority)
        return _State(fields, prov, True)

    # An update, or a recreate when the row is deleted.
    if state.deleted and r.priority < guid_p:
        return None
    fields = dict(state.fields)
    prov = dict(state.provenance)
    changed = state.deleted
    for name, value in r.fields.items():
        if name in keys and name in prov:
            continue
        p = r.field_priority.get(name, r.priority)
        current = prov.get(name)
        if not state.deleted and current is not None and p < current[1]:
            continue
        if name in fields and fields[name] == value and current is not None:
            continue
        fields[name] = value
        prov[name] = (r.message, p)
        changed = True
    if r.priority > guid_p:
        prov[GUID_FIELD] = (r.message, r.priority)
        changed = True
    if not changed:
        return None
    return _State(fields, prov, False)


def fold_key(records: Iterable[Record], start: Version | None = None) -> list[Version]:
    """The versions of one key (all records share a guid), from its records in any order.

    ``start``: the key's latest (open) version, when ``records`` all come after every record it was
    folded from. The fold then goes on from it, as a fold of all the key's records would: the result
    starts with ``start`` again (closed if a record changes it). Fields of a version are the ones its
    provenance names, so the state is whole in it.
    """
    ordered = sorted(records, key=Record.order)
    versions: list[Version] = []
    state: _State | None = None
    if start is not None:
        if ordered and ordered[0].effective <= start.valid_from:
            raise ValueError(f"key {start.guid}: a record at {ordered[0].effective} does not come after {start}")
        versions.append(start)
        state = _State(dict(start.fields), dict(start.provenance), start.deleted)
    for r in ordered:
        if versions and versions[-1].valid_from == r.effective:
            continue
        new = _apply(state, r)
        if new is None:
            continue
        if versions:
            last = versions[-1]
            versions[-1] = Version(
                last.guid, last.valid_from, r.effective, last.deleted, last.fields, last.provenance, last.source_message
            )
        versions.append(Version(r.guid, r.effective, None, new.deleted, new.fields, new.provenance, r.message))
        state = new
    return versions


def fold_sorted(records: Iterable[Record]) -> Iterator[Version]:
    """Versions of many keys from records grouped by guid (each key's records contiguous, any order within)."""
    group: list[Record] = []
    for r in records:
        if group and r.guid != group[0].guid:
            yield from fold_key(group)
            group = []
        group.append(r)
    if group:
        yield from fold_key(group)


def provenance_from_json(text: str) -> dict[str, tuple[str, int]]:
    """The provenance ``provenance_json`` wrote (its JSON text), back."""
    return {name: (str(entry["m"]), int(entry["p"])) for name, entry in json.loads(text).items()}


def provenance_names(provenance: Mapping[str, tuple[str, int]]) -> list[str]:
    """The order of the seed's field_provenance object: guid first, then the fields by name."""
    return [*([GUID_FIELD] if GUID_FIELD in provenance else []), *sorted(k for k in provenance if k != GUID_FIELD)]


def provenance_json(provenance: Mapping[str, tuple[str, int]]) -> dict[str, Any]:
    """The seed's field_provenance object: guid first, then fields by name, each ``{"m": ..., "p": ...}``."""
    return {name: {"m": provenance[name][0], "p": provenance[name][1]} for name in provenance_names(provenance)}
