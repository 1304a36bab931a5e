"""How a kind's spec is written: one frozen dataclass whose fields carry their bounds,
choices and help text (``param``), the single schema both sides read.

The platform derives its spec serializer and form from the dataclass
(``marketplace.specs.serializer_for``); the trainers, the node and the verifiers read the
defaults from it (``defaults``). Nothing here imports Django.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

_NO_DEFAULT: Any = dataclasses.MISSING


def param(
    default: Any = _NO_DEFAULT,
    help: str = "",
    *,
    lo: float | None = None,
    hi: float | None = None,
    choices: Sequence[Any] | None = None,
    uuid: bool = False,
    form: bool = True,
    common: bool = False,
) -> Any:
    """A spec field: its default (none: required), help text with its unit, inclusive bounds
    ``lo``/``hi`` or ``choices``; ``uuid`` for a task id; ``form=False`` keeps it off the page
    form (the default applies there); ``common`` for the few fields a requester most often
    changes, which the post page shows first (the rest go under "Advanced")."""
    meta = {"help": help, "lo": lo, "hi": hi, "choices": tuple(choices) if choices else None, "uuid": uuid}
    meta["form"] = form
    meta["common"] = common or uuid  # a source task is never optional
    return dataclasses.field(default=default, metadata=meta)


def fields(spec: type) -> tuple[dataclasses.Field[Any], ...]:
    """A spec dataclass's fields, in the order a requester reads them."""
    return dataclasses.fields(spec)


def defaults(spec: type) -> dict[str, Any]:
    """Every field's default (a required field has none and is left out)."""
    return {f.name: f.default for f in fields(spec) if f.default is not dataclasses.MISSING}


def default(spec: type, name: str) -> Any:
    """One field's default: what a spec without the field means."""
    return defaults(spec)[name]


def out_of_bounds(spec: type, values: Mapping[str, Any], skip: Sequence[str] = ()) -> list[str]:
    """The fields of ``values`` outside their bounds or choices (in field order)."""
    bad = []
    for f in fields(spec):
        if f.name in skip or f.name not in values:
            continue
        value, meta = values[f.name], f.metadata
        if (
            (meta.get("choices") is not None and value not in meta["choices"])
            or (meta.get("lo") is not None and value < meta["lo"])
            or (meta.get("hi") is not None and value > meta["hi"])
        ):
            bad.append(f.name)
    return bad
