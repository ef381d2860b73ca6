"""The one strict JSON reader used for text from outside: a client's body, a token's payload, a
Proxmox answer, a command's output. What Python's json takes and JSON does not is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.core.jsonread import NotJson, loads


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("NaN", "NaN is not a JSON value"),
        ('{"a": [Infinity]}', "Infinity is not a JSON value"),
        ("-Infinity", "-Infinity is not a JSON value"),
        ('{"a": 1e999}', "the number 1e999 is out of range"),
        ("-1.5E400", "the number -1.5E400 is out of range"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # beyond Python's own recursion
    ],
)
def test_what_python_takes_and_json_does_not_is_refused(text: str, reason: str) -> None:
    with pytest.raises(NotJson) as err:
        loads(text)
    assert str(err.value) == reason


def test_an_out_of_range_number_is_quoted_briefly() -> None:
    with pytest.raises(NotJson) as err:
        loads("1" + "0" * 500 + "e999")
    assert len(str(err.value)) < 80


def test_depth_is_bounded_only_when_asked() -> None:
    deep: Any = 1
    for _ in range(10):
        deep = {"a": [deep]}  # 20 levels
    text = json.dumps(deep)
    assert loads(text) == deep
    assert loads(text, max_depth=20) == deep
    with pytest.raises(NotJson, match="nested deeper than 19 levels"):
        loads(text, max_depth=19)
    # many brackets side by side are no depth
    flat = json.dumps([[1]] * 500)
    assert loads(flat, max_depth=2) == [[1]] * 500


def test_malformed_text_is_still_a_decode_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        loads('{"a": ')
    with pytest.raises(ValueError):
        loads("1" * 5000)  # longer than Python converts an int


def test_ordinary_json_reads_as_json_does() -> None:
    text = '{"a": [1, 2.5, -0.0, 1e300, "x", null, true, false], "b": {}}'
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ('{"a": 1, "a": 2}', "a"),
        ('{"params": {"name": "vm_list", "arguments": {}, "name": "vm_destroy"}}', "name"),
        ('[{"x": 1}, {"y": 1, "y": 1}]', "y"),  # the same value twice is still two copies
        ('{"' + "k" * 60 + '": 1, "' + "k" * 60 + '": 2}', "k" * 40 + "..."),
        ('{"\\u0000": 1, "\\u0000": 2}', "\\u0000"),  # named escaped: a reason never carries a control
    ],
)
def test_a_name_twice_in_one_object_is_refused_when_asked(text: str, name: str) -> None:
    with pytest.raises(NotJson) as err:
        loads(text, unique_names=True)
    assert str(err.value) == f'the name "{name}" appears more than once in one object'
    loads(text)  # not asked: Python's reading, the last copy (a Proxmox answer, a command's output)


def test_the_same_name_in_different_objects_is_fine() -> None:
    doc = {"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}
    assert loads(json.dumps(doc), unique_names=True) == doc
