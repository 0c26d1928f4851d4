"""What a lever writes into the configs to paste, from its own entry (``Lever.exported.function``).

A lever's export function returns, for one file, a mapping (keys and values, nested by
section: ``{"dynamo_config": {"dynamo_mode": "max-autotune"}}``), or for ``torch_settings.py``
lines of Python; ``"#"`` in a mapping holds comment lines, and in a TOML file a ``(value,
comment)`` pair is a value with its comment on its line. Each exporter merges them into what
it wrote: a key the file already has is replaced where it stands (the exporter writes a
library's defaults, a lever overrides them), others go at the end of their section, a new
section at the end of the file; so a lever's exports belong to its declaration and no
exporter names it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tuner.inputs.levers import LEVERS

if TYPE_CHECKING:
    from tuner.inputs.space import Config


def lever_fragments(config: "Config", file: str, world_size: int) -> list[Any]:
    """Every lever's fragment for ``file``, in declaration order (none where it says nothing)."""
    out = []
    for lever in LEVERS.values():
        if lever.exported.function is not None and file in lever.exported.fields:
            fragment = lever.exported.function(config, file, world_size)
            if fragment:
                out.append(fragment)
    return out


def merge_dict(into: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """``fragment`` merged into ``into`` (nested mappings merged, values replaced)."""
    for key, value in fragment.items():
        if key == "#":
            continue
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge_dict(into[key], value)
        else:
            into[key] = value
    return into


def _scalar(value: Any, quote: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"{quote}{value}{quote}" if quote else value
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def merge_yaml_lines(lines: list[str], fragment: dict[str, Any]) -> list[str]:
    """``fragment`` into a YAML file written as lines: a top-level key whose block exists
    gets its sub-keys replaced where they stand, or added at that block's end; others are
    appended."""
    out = list(lines)
    for key, value in fragment.items():
        if key == "#":
            out += [f"# {c}" for c in value]
            continue
        if not isinstance(value, dict):
            _put(out, 0, len(out), f"{key}:", f"{key}: {_scalar(value, '')}")
            continue
        if f"{key}:" not in out:
            out.append(f"{key}:")
        start = out.index(f"{key}:") + 1
        for k, v in value.items():
            end = start
            while end < len(out) and out[end].startswith("  "):
                end += 1
            _put(out, start, end, f"  {k}:", f"  {k}: {_scalar(v, '')}")
    return out


def _put(lines: list[str], start: int, end: int, prefix: str, line: str) -> None:
    """``line`` in place of the one in ``lines[start:end]`` that starts with ``prefix``, else
    at ``end``."""
    for at in range(start, end):
        if lines[at].startswith(prefix):
            lines[at] = line
            return
    lines.insert(end, line)


def merge_toml_lines(lines: list[str], fragment: dict[str, Any]) -> list[str]:
    """``fragment`` (``{section: {key: value}}``) into a TOML file written as lines: a section
    that exists gets its keys replaced where they stand, or added at its end; others are
    appended."""
    out = list(lines)
    for section, values in fragment.items():
        if section == "#":
            out += [f"# {c}" for c in values]
            continue
        header = f"[{section}]"
        if header not in out:
            out += ["", header]
        start = out.index(header) + 1
        for k, v in values.items():
            end = start
            while end < len(out) and out[end] and not out[end].startswith("["):
                end += 1
            if k == "#":
                out[end:end] = [f"# {c}" for c in v]
                continue
            value, comment = v if isinstance(v, tuple) else (v, "")
            _put(out, start, end, f"{k} = ", f"{k} = {_scalar(value, chr(34))}" + (f"  # {comment}" if comment else ""))
    return out
