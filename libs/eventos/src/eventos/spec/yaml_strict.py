"""A strict YAML loader for specs: a key given twice in one mapping is refused (PyYAML keeps the
last silently), and every error names its source (the file given to `eventosctl apply -f`, or
the request body) with its line and column, counted from 1."""

from __future__ import annotations

import io
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from eventos.errors import SpecInvalid

BODY = "request body"  # the source's name when the API reads a spec from a request
YAML_FIELD = "(yaml)"
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """SafeLoader refusing duplicate keys, with the key's place in the message."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:  # the keys written here (a `<<` merge's may be overridden)
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor says so
            if first is not None:
                raise ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first.line + 1})",
                    key_node.start_mark,
                )  # fmt: skip
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return ""
    return f":{mark.line + 1}:{mark.column + 1}"


def _message(exc: yaml.YAMLError) -> str:
    """The problem in words (without PyYAML's own file lines, which `_where` replaces)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        context, mark = exc.context or "", exc.context_mark
        if context and mark is not None and mark is not exc.problem_mark:
            context += f" (from line {mark.line + 1}, column {mark.column + 1})"
        parts = [context, exc.problem or ""]
        return "; ".join(p for p in parts if p) or "invalid YAML"
    return str(exc)


def documents(text: str, source: str = BODY) -> list[Any]:
    """The documents of a YAML text (several may be separated by `---`), empty ones left out;
    SpecInvalid at `(yaml)` naming `source:line:column` and the problem."""
    stream = io.StringIO(text)
    stream.name = source  # PyYAML names its marks after the stream
    try:
        return [d for d in yaml.load_all(stream, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecInvalid([(YAML_FIELD, f"{source}{_where(exc)}: {_message(exc)}")]) from None
    except RecursionError:
        raise SpecInvalid([(YAML_FIELD, f"{source}: nested too deeply")]) from None
