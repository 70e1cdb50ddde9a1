"""Typed dataclass fields from user input: the checks every config (ModelConfig, the run config, an encoding's own
settings, the comparison's) shares, and how a command-line value gets its type."""
from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from typing import Any

from commands import nearest
from errors import ConfigError


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation))


def _value_matches(value: Any, annotation: Any) -> bool:
    """True when `value` is acceptable for a field annotated with `annotation` (int is accepted for float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_value_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is Any:
        return True
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, annotation)


def check_field_types(obj: Any, where: str) -> None:
    """Raise ConfigError naming the field when a dataclass field holds a value of the wrong type.

    Ints given for float fields are converted to float so that saved configs are stable.
    """
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        annotation = hints[field.name]
        if not _value_matches(value, annotation):
            hint = ""
            if list in (annotation, typing.get_origin(annotation)) and not isinstance(value, (list, tuple, dict)):
                # a per-layer list given one value: "[value]" applies it to every layer, as the key's docs say
                hint = f"; give a list, e.g. [{json.dumps(value)}] (one value for every layer)"
            raise ConfigError(
                f"{where}.{field.name}: expected {_type_name(annotation)}, got {type(value).__name__} {value!r}{hint}"
            )
        if annotation is float and isinstance(value, int):
            setattr(obj, field.name, float(value))


def check_keys(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values`, once every key is a field of dataclass `cls`: an unknown key is refused with the nearest valid one
    (or, when none is close, the list of them). The caller builds `cls(**values)`."""
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        match = nearest(unknown[0], valid)
        hint = f"did you mean {where}.{match}?" if match else f"valid keys are {valid}"
        raise ConfigError(f"{where}: unknown key(s) {unknown}; {hint}")
    return values


def parse_override_value(text: str) -> Any:
    """A CLI value as TOML (so 3e-4, true, 12 and [1, 2] have their types); anything else is a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def set_dotted(values: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """values[section][key] = value for dotted = "section.key"; a longer name sets a key of a table
    ("model.position_args.t5.max_distance"), creating the tables on the way."""
    section, *names = dotted.split(".")
    if not names or not all([section, *names]):
        raise ConfigError(f"{where}: {dotted!r} must look like section.key")
    table, path = values, ""
    for name in [section, *names[:-1]]:
        path = f"{path}.{name}" if path else name
        table = table.setdefault(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{path}] must be a table of keys, got {table!r}; cannot set {dotted}")
    table[names[-1]] = value


def toml_value(value: Any) -> str:
    """`value` written as TOML (what parse_override_value reads back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
