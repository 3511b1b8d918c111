"""The three patch formats of the Kubernetes API: JSON merge patch, JSON patch, strategic merge.

Strategic merge is simplified: lists named in `MERGE_KEYS` merge item by item on their key, the
primitive lists in `PRIMITIVE_MERGE_LISTS` take the union, every other list is replaced; the
`$patch: delete`/`replace` and `$deleteFromPrimitiveList` directives work, `$setElementOrder` and
`$retainKeys` are accepted and ignored. A real server reads merge keys from the type's schema.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PatchError", "PatchConflict", "json_merge_patch", "json_patch", "strategic_merge_patch"]

# Field name -> the key items of such a list merge on (the schema's patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}
# "ports" merges on containerPort in a container and on port in a Service.
_PORT_KEYS = ("containerPort", "port")
PRIMITIVE_MERGE_LISTS = frozenset({"finalizers"})


class PatchError(ValueError):
    """A patch that is malformed (the server answers 400)."""


class PatchConflict(ValueError):
    """A well-formed JSON patch that cannot apply, e.g. a failed `test` (the server answers 422)."""


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"invalid JSON pointer {path!r}")
    if not path:
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], part: str, *, for_add: bool) -> int:
    if for_add and part == "-":
        return len(container)
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchConflict(f"invalid array index {part!r}")
    index = int(part)
    if index > len(container) or (not for_add and index == len(container)):
        raise PatchConflict(f"array index {index} out of range")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchConflict(f"path element {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise PatchConflict(f"path element {token!r} is not in an object or array")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchConflict(f"path element {last!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise PatchConflict(f"path element {last!r} is not in an object or array")


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchConflict("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchConflict(f"cannot remove {last!r}: it does not exist")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, for_add=False))
    raise PatchConflict(f"cannot remove {last!r}: not in an object or array")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise PatchConflict(f"cannot add {last!r}: not in an object or array")
    return doc


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test), applied to a copy of `document`.

    Raises:
        PatchError: `operations` is not a list of operations.
        PatchConflict: an operation cannot apply (a `test` that fails, a missing path).
    """
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be an array of operations")
    doc = copy.deepcopy(document)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation {op!r}")
        kind, tokens = op["op"], _pointer(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"JSON patch operation {kind!r} needs a value")
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            _get(doc, tokens)
            if tokens:
                _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            actual = _get(doc, tokens)
            if actual != op["value"]:
                raise PatchConflict(f"testing value {op['path']} failed: {actual!r} != {op['value']!r}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        for key in _PORT_KEYS:
            if all(isinstance(i, dict) and key in i for i in items):
                return key
        return None
    return MERGE_KEYS.get(field)


def _merge_list(field: str, target: Any, patch: list[Any]) -> list[Any]:
    current = list(target) if isinstance(target, list) else []
    if field in PRIMITIVE_MERGE_LISTS:
        return current + [copy.deepcopy(v) for v in patch if v not in current]
    key = _merge_key(field, patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return [_strip_directives(copy.deepcopy(v)) for v in patch]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip_directives(copy.deepcopy(i)) for i in patch if i.get("$patch") != "replace"]
    result = copy.deepcopy(current)
    for item in patch:
        if key not in item:
            raise PatchError(f"an item of {field} lacks its merge key {key!r}")
        at = next((n for n, c in enumerate(result) if isinstance(c, dict) and c.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                result.pop(at)
        elif at is None:
            result.append(_strip_directives(copy.deepcopy(item)))
        else:
            result[at] = strategic_merge_patch(result[at], item)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The simplified strategic merge described in this module's docstring."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(copy.deepcopy(patch))
    if directive not in (None, "merge"):
        raise PatchError(f"unsupported $patch directive {directive!r} on an object")
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        _merge_field(result, key, value)
    return result


def _merge_field(result: dict[str, Any], key: str, value: Any) -> None:
    if key.startswith("$deleteFromPrimitiveList/"):
        field = key.split("/", 1)[1]
        if isinstance(result.get(field), list) and isinstance(value, list):
            result[field] = [v for v in result[field] if v not in value]
    elif key.startswith("$"):
        return  # $patch is handled by the caller; $setElementOrder and $retainKeys only order or prune
    elif value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
        result.pop(key, None)
    elif isinstance(value, dict):
        result[key] = strategic_merge_patch(result.get(key), value)
    elif isinstance(value, list):
        result[key] = _merge_list(key, result.get(key), value)
    else:
        result[key] = value
