"""YAML read as written (gateway/core/yamlread.py): what yaml.safe_load would read silently
otherwise is refused with the line, and everything else is read exactly as safe_load reads it."""

from __future__ import annotations

import re

import pytest
import yaml

from gateway.core import yamlread


@pytest.mark.parametrize(
    "text",
    [
        "x: 1\n",
        "",
        "a: &a {x: 1}\nb: {<<: *a, x: 5}\n",  # a merge, then an override of one's own: YAML's way
        "a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: *b, x: 3}\n",  # a chain without an inner override
        "a: &a {x: 1}\nb: &b {y: 1}\nc: {<<: [*a, *b], x: 3}\n",
        "b: &b {y: 1}\na: [*b, *b]\n",  # the same node twice is no cycle
        "defs:\n  a: &a {x: 1}\n  b: &b {<<: *a, y: 5}\nc: {<<: *b, z: 3}\n",
    ],
)
def test_read_as_safe_load_reads_it(text: str) -> None:
    assert yamlread.load(text) == yaml.safe_load(text)


def problems(text: str) -> list[str]:
    with pytest.raises(yamlread.YamlProblems) as err:
        yamlread.load(text)
    return err.value.problems


def test_a_key_given_twice_is_refused_at_any_depth() -> None:
    assert problems("roles:\n  a: 1\nroles:\n  b: 2\nx:\n  - {k: 1, k: 2}\n") == [
        "roles: given twice in the same mapping (lines 1 and 3); the second would silently replace the first: keep one",
        "k: given twice in the same mapping (lines 6 and 6); the second would silently replace the first: keep one",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "a: &a {x: 1}\nb: &b {<<: *a, x: 5}\nc: {<<: *b, z: 3}\n",
        # nested: the old loader also called x "given twice" (it saw the merge already flattened)
        "defs:\n  a: &a {x: 1}\n  b: &b {<<: *a, x: 5}\nc: {<<: *b, z: 3}\n",
    ],
)
def test_a_merged_mapping_that_overrides_its_own_merge_is_refused(text: str) -> None:
    """PyYAML 6 reads c.x as 1, not the 5 that b says (OPA's reader says 5): readers disagree."""
    assert yaml.safe_load(text)["c"]["x"] == 1
    [problem] = problems(text)
    assert "merges a mapping" in problem and "overrides x" in problem, problem


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {x: 1, <<: *a}\n"])
def test_a_structure_without_end_is_refused(text: str) -> None:
    assert problems(text) == ["line 1: an alias refers to a node that contains it"]


@pytest.mark.parametrize("text", ['a: {1: x, "1": y}\n', 'a: {on: 1, "on": 2}\n', "a: {1.0: x, 1: y}\n"])
def test_keys_one_to_opa_are_one_here(text: str) -> None:
    """OPA turns keys into strings: 1 and "1" (and on and "on") are one key there, the last kept."""
    [problem] = problems(text)
    assert "given twice in the same mapping" in problem, problem


def test_a_json_key_given_twice_is_refused() -> None:
    with pytest.raises(yamlread.YamlProblems) as err:
        yamlread.load_json('{"bindings": [{"role": "admin"}], "bindings": [{"role": "viewer"}]}')
    assert err.value.problems == ["bindings: given twice in the same object; the second would replace the first"]
    assert yamlread.load_json('{"a": {"b": 1}, "b": {"a": 2}}') == {"a": {"b": 1}, "b": {"a": 2}}


@pytest.mark.parametrize(
    "text",
    [
        # PyYAML 6.0.x keeps the first merged key only by id(key text): short keys are interned (the
        # first mapping wins, as YAML 1.1 says), longer ones are not (the last one wins)
        "a: &a {verify_tls: true}\nb: &b {verify_tls: false}\nc: {<<: [*a, *b]}\n",
        "a: &a {x: 1}\nb: &b {x: 2}\nc: {<<: [*a, *b]}\n",
        # two merge keys in one mapping merge into one list
        "a: &a {verify_tls: true}\nb: &b {verify_tls: false}\nc:\n  <<: *a\n  <<: *b\n",
        # a key one of them only merges from a third
        "z: &z {verify_tls: false}\na: &a {verify_tls: true}\nb: &b {<<: *z, y: 1}\nc: {<<: [*a, *b]}\n",
    ],
)
def test_a_merge_list_whose_mappings_share_a_key_is_refused(text: str) -> None:
    [problem] = problems(text)
    assert re.fullmatch(r"line [345]: merges mappings that both give (verify_tls|x) \(lines \d and \d\): .*", problem)


def test_the_same_mapping_merged_twice_is_read_as_safe_load_reads_it() -> None:
    text = "a: &a {verify_tls: true}\nc: {<<: [*a, *a]}\n"
    assert yamlread.load(text) == yaml.safe_load(text)


def test_a_merge_list_overridden_by_its_own_mapping_is_read_as_safe_load_reads_it() -> None:
    """The mapping's own key wins over every merged one, in every reader: nothing to refuse."""
    text = "a: &a {verify_tls: true}\nb: &b {verify_tls: false}\nc: {<<: [*a, *b], verify_tls: true}\n"
    assert yamlread.load(text) == yaml.safe_load(text) == {**yaml.safe_load(text), "c": {"verify_tls": True}}
