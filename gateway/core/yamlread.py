"""YAML as yaml.safe_load reads it, minus the ways it silently reads something else than was
written: a key given twice in one mapping (the last one wins without a word, so a second
`roles:` would drop every role of the first), and a merge (`<<: *b`) of a mapping that itself
overrides a key it merges (PyYAML 6 then takes the inner merged value, not the override), and a
merge of several mappings that give the same key (PyYAML 6.0.x may let the last one win).
Refused too, as a clear problem rather than a hang or a traceback: aliases that repeat a vast
part of the document (a "billion laughs" alias bomb: PyYAML shares the nodes, but every walk of
the result, a schema check included, meets each repetition), and nesting deeper than the
parser's recursion."""

from __future__ import annotations

import json
from typing import Any

import yaml

MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblems(ValueError):
    """What makes a document unsafe to read; `problems` lists them, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class TooDeep(YamlProblems):
    """A document nested deeper than the parser (and the checks) can recurse: not a problem in its
    content, which could not be read at all."""


# libyaml's parser when PyYAML was built with it (the wheels are): ~8x faster than the pure Python
# one, which matters for the connector catalog read at every start (1 s of the gateway's start-up
# on the development VM). Both compose the same nodes; the Python one is kept for its error text.
_FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# Nodes that aliases may repeat in one document, in all. The shipped files repeat under 1,500; a
# bomb of nine aliases nine levels deep repeats 387 million, each met by every walk of the result.
MAX_REPEATED_NODES = 100_000


def load(text: str) -> Any:
    """The document, as yaml.safe_load returns it; YamlProblems if it is read otherwise than
    written (or would cost too much to read: an alias bomb, nesting too deep), yaml.YAMLError if
    it is not YAML. The checks run on the composed nodes, before PyYAML flattens merges into
    them (after that, a merged key looks given twice)."""
    try:
        try:
            return _load(text, _FAST_LOADER)
        except yaml.YAMLError:
            if _FAST_LOADER is yaml.SafeLoader:
                raise
        # not YAML: the pure Python parser's message quotes the line and points at the column
        return _load(text, yaml.SafeLoader)
    except RecursionError:
        # the parser (and the checks) recurse once per level: a problem to name, never a traceback
        raise TooDeep(["nested too deeply to read (no setting, connector or policy data needs that depth)"]) from None


def _load(text: str, loader_class: type[yaml.SafeLoader]) -> Any:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problems = _problems(loader, node)
        if problems:
            raise YamlProblems(problems)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _problems(loader: yaml.SafeLoader, root: yaml.Node) -> list[str]:
    found: list[tuple[int, str]] = []
    done: set[int] = set()  # an alias is the same node: checked once
    repeats: list[yaml.Node] = []  # each node met again through an alias, once per meeting

    def visit(node: yaml.Node, path: frozenset[int], mappings: bool) -> None:
        if id(node) in path:  # an alias inside the node it names: a structure without end
            found.append((_line(node), f"line {_line(node)}: an alias refers to a node that contains it"))
            return
        if id(node) in done:
            repeats.append(node)
            return
        done.add(id(node))
        inner = path | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                visit(child, inner, mappings)
        elif isinstance(node, yaml.MappingNode):
            if mappings:
                found.extend(_mapping_problems(loader, node))
            for key_node, value_node in node.value:
                visit(key_node, inner, mappings)
                visit(value_node, inner, mappings)

    # first the aliases alone (linear): a cycle, or a bomb, before the mappings' merge checks, which
    # walk what each merge brings in (a chain of merges of merges is a bomb too)
    visit(root, frozenset(), mappings=False)
    if not found and (bomb := _alias_bomb(repeats)):  # sized only without a cycle: that has no size
        found.append(bomb)
    if not found:
        done.clear()
        visit(root, frozenset(), mappings=True)
    return [problem for _, problem in sorted(found)]


def _alias_bomb(repeats: list[yaml.Node]) -> tuple[int, str] | None:
    """The alias at which the nodes repeated through aliases pass MAX_REPEATED_NODES, if they do."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # the node and all it holds, aliases expanded (memoised: linear)
        if id(node) not in sizes:
            if isinstance(node, yaml.SequenceNode):
                sizes[id(node)] = 1 + sum(size(child) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                sizes[id(node)] = 1 + sum(size(k) + size(v) for k, v in node.value)
            else:
                sizes[id(node)] = 1
        return sizes[id(node)]

    repeated = 0
    for node in repeats:
        repeated += size(node)
        if repeated > MAX_REPEATED_NODES:
            line = _line(node)
            return (
                line,
                f"line {line}: aliases repeat more than {MAX_REPEATED_NODES} nodes (this anchor's among them): "
                "an alias bomb, costly to read; write the parts out or repeat less",
            )
    return None


def _mapping_problems(loader: yaml.SafeLoader, node: yaml.MappingNode) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    keys: dict[Any, int] = {}
    out.extend(_shared_merge_keys(loader, node))
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for m in merged:
                if isinstance(m, yaml.MappingNode) and (hidden := _overridden_merge(loader, m)):
                    out.append(
                        (
                            _line(key_node),
                            f"line {_line(key_node)}: merges a mapping (line {_line(m)}) that itself merges and "
                            f"overrides {hidden}: YAML readers disagree on which value wins; write the keys out",
                        )
                    )
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        # as OPA's reader sees a key too: it turns keys into strings, so 1 and "1" (or on and "on") are one
        key = _as_opa_key(loader.construct_object(key_node))
        line = _line(key_node)
        if key not in keys and key_node.value in keys:
            key = key_node.value
        if key in keys:
            out.append(
                (
                    line,
                    f"{key}: given twice in the same mapping (lines {keys[key]} and {line}); "
                    "the second would silently replace the first: keep one",
                )
            )
        else:
            keys.setdefault(key, line)
            keys.setdefault(key_node.value, line)
    return out


def _shared_merge_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> list[tuple[int, str]]:
    """Keys that two mappings merged into `node` both give (`<<: [*a, *b]`, or two `<<:`), unless
    `node` gives the key itself (its own value wins in every reader). YAML 1.1 says the first
    merged mapping wins; PyYAML 6.0.x keeps the first only when the two key strings are the same
    object (short, interned ones) and otherwise the last: `<<: [*strict, *lax]` could read
    verify_tls from lax. Refused rather than read first-wins ourselves: the file would still mean
    something else to PyYAML elsewhere (an editor's linter, a script), and writing the key out in
    the mapping is unambiguous everywhere."""
    own: set[Any] = set()
    sources: list[tuple[int, yaml.MappingNode]] = []
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            sources.extend((_line(key_node), m) for m in merged if isinstance(m, yaml.MappingNode))
        elif isinstance(key_node, yaml.ScalarNode):
            own.add(_as_opa_key(loader.construct_object(key_node)))
    out: list[tuple[int, str]] = []
    first: dict[Any, yaml.MappingNode] = {}  # key -> the merged mapping that gives it first
    for merge_line, m in sources:
        if m is node:  # a merge of itself: reported as an alias
            continue
        given, merged_in = _own_and_merged(loader, m, frozenset({id(node)}))
        shared: list[str] = []
        for key in sorted({_as_opa_key(k) for k in given | merged_in} - own, key=str):
            if key in first and first[key] is not m:  # the same mapping twice gives one value
                shared.append(f"{key} (lines {_line(first[key])} and {_line(m)})")
            first.setdefault(key, m)
        if shared:
            out.append(
                (
                    merge_line,
                    f"line {merge_line}: merges mappings that both give {', '.join(shared)}: YAML readers "
                    "disagree on which value wins; give the key in this mapping itself, or merge only one",
                )
            )
    return out


def _as_opa_key(key: Any) -> Any:
    """A mapping key as it ends up in JSON (OPA's data): booleans and numbers as their text."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    if isinstance(key, int | float):
        return str(key)
    return key


def load_json(text: str) -> Any:
    """A JSON document, as json.loads reads it; YamlProblems if an object gives a key twice (Go's
    decoder, and so OPA, keeps the last one without a word)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                raise YamlProblems([f"{k}: given twice in the same object; the second would replace the first"])
            seen[k] = v
        return seen

    return json.loads(text, object_pairs_hook=pairs)


def _own_and_merged(
    loader: yaml.SafeLoader, node: yaml.MappingNode, path: frozenset[int] = frozenset()
) -> tuple[set[Any], set[Any]]:
    """(the keys a mapping gives itself, the keys it merges from others, at any depth)."""
    path = path | {id(node)}
    own: set[Any] = set()
    merged: set[Any] = set()
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for s in sources:
                if isinstance(s, yaml.MappingNode) and id(s) not in path:  # a merge of itself: reported as an alias
                    inner_own, inner_merged = _own_and_merged(loader, s, path)
                    merged |= inner_own | inner_merged
        elif isinstance(key_node, yaml.ScalarNode):
            own.add(loader.construct_object(key_node))
    return own, merged


def _overridden_merge(loader: yaml.SafeLoader, node: yaml.MappingNode) -> str | None:
    """The keys a merged mapping both merges and overrides (the case PyYAML reads wrongly), or None."""
    own, merged = _own_and_merged(loader, node)
    both = own & merged
    return ", ".join(sorted(str(k) for k in both)) if both else None
