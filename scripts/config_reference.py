"""Write docs/configuration.md from the configuration's pydantic models.

    python -m scripts.config_reference           # (re)write docs/configuration.md
    python -m scripts.config_reference --check   # exit 1 if the file is not what the models give

Every key of `proxy.config.ProxyConfig` is walked, nested models and lists of models included,
with its type (and bounds), default and description (the field's `description`, else the nested
model's docstring). A section the top-level model keeps as an untyped mapping (today `quotas:`,
parsed by the models in `SECTION_PARSERS`) is listed as a mapping and then walked through the
models that parse it, so the reference covers it too; once the section has a typed model of its
own, the walk finds that instead and `SECTION_PARSERS` is not used for it.

`key_paths()` gives every documented key as a dotted path (``store.kafka_config``,
``quotas.entries[].user``); the docs tests check the docs against it.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "configuration.md"

#: Untyped sections of the top-level model: the models (``"module:Class"``) that parse them, in
#: order; a key two of them hold is listed from the first. Missing models are skipped (a section
#: that gained a typed model of its own no longer needs them).
SECTION_PARSERS: dict[str, tuple[str, ...]] = {
    "quotas": ("quotas.config:_QuotasModel", "quotas.section:QuotasModel",
               "proxy.stages.callbacks:_PluginsModel"),
}

#: Keys of an untyped section that no parser model holds, as (key, type, default, description).
SECTION_EXTRAS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "quotas": (
        ("entries[].ip", "string", "—",
         "KIP-612: an entry with `ip` (an address, or `<default>` for every address without its own "
         "entry) limits the rate of new connections from that address; its only other key is "
         "`connection_creation_rate`. Read from this file only (AlterClientQuotas refuses ip entities)"),
        ("entries[].connection_creation_rate", "number ≥ 1", "—",
         "with `ip`: new connections per second from the address (Kafka's windowed rate over "
         "`quotas.window`)"),
    ),
}

#: Keys whose values are free-form (any key below them is the user's, not Sluice's).
OPEN_MAPPING = "open mapping"


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    description: str
    open: bool = False  # the value is a free-form mapping (librdkafka settings, class config, ...)


def _load(spec: str) -> type[BaseModel] | None:
    module, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, BaseModel) else None


def _strip_none(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            inner = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
            return inner, True
    return annotation, False


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


#: Models that are written as one scalar value (``HOST:PORT``), not as a section.
SCALAR_MODELS = frozenset({"HostPort"})


def _model_of(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(_strip_none(_unwrap(annotation))[0])
    if (isinstance(annotation, type) and issubclass(annotation, BaseModel)
            and annotation.__name__ not in SCALAR_MODELS):
        return annotation
    return None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(_strip_none(_unwrap(annotation))[0])
    if typing.get_origin(annotation) in (list, tuple):
        args = typing.get_args(annotation)
        return _model_of(args[0]) if args else None
    return None


# in order: bool is an int, so it is looked at first
_SCALARS: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "number"),
                                          (str, "string"), (Path, "path"),
                                          (SecretStr, "secret string (never logged)"))

def type_name(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    inner, optional = _strip_none(annotation)
    if optional:
        return f"{type_name(inner)} or null"
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        args = typing.get_args(annotation)
        return f"mapping of {type_name(args[1])}" if args and args[1] is not Any else "mapping"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        for base, name in _SCALARS:
            if issubclass(annotation, base):
                return name
        if issubclass(annotation, enum.Enum):
            return " \\| ".join(f"`{m.value}`" for m in annotation)
        if annotation.__name__ == "HostPort":
            return "HOST:PORT"
        if issubclass(annotation, BaseModel):
            return "section"
        return annotation.__name__
    if typing.get_origin(annotation) is not None:
        return str(typing.get_origin(annotation).__name__)
    return str(annotation)


_BOUNDS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"), (annotated_types.Lt, "lt", "<"),
    (annotated_types.MinLen, "min_length", "length ≥"), (annotated_types.MaxLen, "max_length", "length ≤"),
)


def _constraints(info: FieldInfo) -> list[str]:
    metadata = list(info.metadata)
    annotation = info.annotation
    while typing.get_origin(annotation) is typing.Annotated:
        metadata.extend(typing.get_args(annotation)[1:])
        annotation = typing.get_args(annotation)[0]
    out = []
    for item in metadata:
        for cls, attr, sign in _BOUNDS:
            if isinstance(item, cls):
                out.append(f"{sign} {getattr(item, attr)}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matching `{pattern}`")
    return out


def _format_value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"`{value}`"
    if isinstance(value, str | int | float | Path):
        return f"`{value}`"
    if isinstance(value, dict | list | tuple) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    if isinstance(value, BaseModel):
        return "—"
    return f"`{value}`"


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        factory: Callable[[], Any] = info.default_factory  # type: ignore[assignment]
        if isinstance(factory, type) or factory in (dict, list):
            return _format_value(factory())
        return "computed at start (see the description)"
    if info.default is None:
        return "null"
    if info.default is PydanticUndefined:
        return "**required**"
    return _format_value(info.default)


def _doc(model: type[BaseModel]) -> str:
    doc = inspect.getdoc(model) or ""
    if model.__doc__ is None or doc == inspect.getdoc(BaseModel):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _field_name(name: str, info: FieldInfo) -> str:
    return info.alias if info.alias else name


def walk(model: type[BaseModel], prefix: str = "") -> Iterator[Row]:
    for name, info in model.model_fields.items():
        key = prefix + _field_name(name, info)
        annotation = info.annotation
        nested = _model_of(annotation)
        item = _list_item_model(annotation)
        description = " ".join((info.description or "").split())
        kind = type_name(annotation)
        bounds = _constraints(info)
        if bounds:
            kind += " (" + ", ".join(bounds) + ")"
        if nested is not None:
            if info.is_required():
                default = "**required**"
            elif info.default is None and info.default_factory is None:
                default = "null (off)"
            else:
                default = "—"
            yield Row(key, kind, default, description or _doc(nested))
            yield from walk(nested, key + ".")
            continue
        if item is not None:
            yield Row(key, f"list of sections{' (' + ', '.join(bounds) + ')' if bounds else ''}",
                      _default(info), description or _doc(item))
            yield from walk(item, key + "[].")
            continue
        plain = _unwrap(_strip_none(_unwrap(annotation))[0])
        is_mapping = typing.get_origin(plain) is dict
        parsers = [m for m in (_load(s) for s in SECTION_PARSERS.get(key, ())) if m is not None]
        if is_mapping and prefix == "" and key in SECTION_PARSERS:
            yield Row(key, kind, _default(info), description or "parsed at start by the keys below")
            parsed = [row for parser in parsers for row in walk(parser, key + ".")]
            for sub, sub_type, sub_default, sub_description in SECTION_EXTRAS.get(key, ()):
                extra = Row(f"{key}.{sub}", sub_type, sub_default, sub_description)
                parent = extra.key.rsplit(".", 1)[0] + "."
                siblings = [i for i, row in enumerate(parsed) if row.key.startswith(parent)]
                parsed.insert(siblings[-1] + 1 if siblings else len(parsed), extra)
            yield from parsed
            continue
        yield Row(key, kind, _default(info), description, open=is_mapping)


def rows() -> list[Row]:
    from proxy.config import ProxyConfig

    seen: set[str] = set()
    out = []
    for row in walk(ProxyConfig):
        if row.key not in seen:  # two parsers of one section may both hold a key
            seen.add(row.key)
            out.append(row)
    return out


def key_paths() -> dict[str, Row]:
    return {row.key: row for row in rows()}


_HEADER = """\
# Configuration reference

<!-- Generated by `python -m scripts.config_reference` from the configuration's pydantic models
(proxy/config.py and the models it uses). Do not edit by hand: change the model's Field
description or docstring and run the command again; `tests/unit/test_docs.py` fails when this
file is stale. -->

`sluice proxy --config sluice.yaml` reads one YAML file. Environment variables override the file
and command-line flags override both:

* a variable is `SLUICE_` and the key's path in capitals, `__` between levels
  (`SLUICE_METRICS__PORT=9404`, `SLUICE_UPSTREAM__BOOTSTRAP=broker1:9092,broker2:9092`,
  `SLUICE_WORKERS=auto`); lists of sections (`quotas.entries`) are set in the file;
* flags: `--upstream` (`upstream.bootstrap`), `--listen`, `--advertised-host`,
  `--broker-port-base`, `--metrics-port` (`metrics.port`), `--log-level`, `--workers`,
  `--reseed` (`store.reseed`).

A bad value stops the start with the key's path and the reason (exit status 2), e.g.
`upstream.tls.ca_file: file not found: ca.pem`. Unknown keys are refused. Secrets
(`*.password`, `kafka_config` values, the `/connections` token) never appear in logs.

Keys of a list of sections are written `key[].field`. Scalar top-level keys come first, then
each section in the order of the model.
"""


def _cell(text: str) -> str:
    """One table cell: no newline, `|` escaped, and `<...>` outside backticks shown, not read as HTML."""
    text = text.replace("\n", " ")
    if "\\|" not in text:
        text = text.replace("|", "\\|")
    parts = text.split("`")
    parts[::2] = [part.replace("<", "&lt;").replace(">", "&gt;") for part in parts[::2]]
    return "`".join(parts)


def _table_row(row: Row) -> str:
    description = row.description or ""
    if row.open:
        description = (description + "; " if description else "") + "any keys, passed on as they are"
    return f"| `{row.key}` | {_cell(row.type)} | {_cell(row.default)} | {_cell(description.rstrip('.'))} |"


_TABLE_HEAD = "| key | type | default | description |\n|---|---|---|---|"


def render() -> str:
    all_rows = rows()
    sections = {row.key for row in all_rows if "." not in row.key and "[" not in row.key
                and any(other.key.startswith(row.key + ".") for other in all_rows)}
    out = [_HEADER + "\n## Top-level keys\n", _TABLE_HEAD]
    out.extend(_table_row(row) for row in all_rows if row.key not in sections and "." not in row.key)
    for section in [row for row in all_rows if row.key in sections]:
        out.append(f"\n## `{section.key}`\n")
        if section.description:
            text = section.description.rstrip(".")
            out.append(text[:1].upper() + text[1:] + ".")
            out.append("")
        default = "Required." if section.default == "**required**" else (
            "Off unless given." if section.default.startswith("null") else "")
        if default:
            out.append(default + "\n")
        out.append(_TABLE_HEAD)
        out.extend(_table_row(row) for row in all_rows if row.key.startswith(section.key + "."))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m scripts.config_reference", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date ({len(rows())} keys)")
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(rows())} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
