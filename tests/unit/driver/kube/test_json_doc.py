"""Bounded JSON: a too-deep value or a too-long number never escapes as an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest

from driver.kube.json_doc import MAX_DEPTH, JsonTooDeep, decode, decode_object, undecodable

DEEP = "[" * 2048 + "]" * 2048  # 4 KiB of nested arrays


def claim_text(name: str, parameters: str = "{}") -> str:
    return (
        f'{{"kind": "ResourceClaim", "metadata": {{"name": "{name}", "namespace": "team-a"}}, '
        f'"spec": {{"devices": {{"config": [{{"opaque": {{"parameters": {parameters}}}}}]}}}}, '
        '"status": {"allocation": {"devices": {"results": [{"device": "gpu-1"}]}}}}'
    )


def test_a_deep_object_is_refused_naming_the_object_and_field() -> None:
    with pytest.raises(JsonTooDeep) as info:
        decode_object(claim_text("deep", DEEP))
    assert str(info.value).startswith(
        "ResourceClaim team-a/deep: spec.devices.config[0].opaque.parameters[0][0]"
    )
    assert f"nested deeper than {MAX_DEPTH} levels; not read" in str(info.value)


def test_a_list_keeps_its_other_items_and_marks_the_deep_one() -> None:
    items = f"{claim_text('ok')}, {claim_text('deep', DEEP)}"
    body = f'{{"kind": "ResourceClaimList", "items": [{items}]}}'
    doc = decode_object(body.encode())
    ok, deep = doc["items"]
    assert (
        undecodable(ok) is None and ok["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {}
    )
    note = undecodable(deep)
    assert note is not None and note.startswith(
        "ResourceClaim team-a/deep: spec.devices.config[0].opaque.parameters"
    )
    assert deep["status"]["allocation"]["devices"]["results"] == [{"device": "gpu-1"}]


def test_items_of_a_list_are_named_with_the_lists_kind() -> None:
    item = '{"metadata": {"name": "x"}, "p": ' + DEEP + "}"
    doc = decode_object('{"kind": "NamespaceList", "items": [' + item + "]}")
    note = undecodable(doc["items"][0])
    assert note is not None and note.startswith("Namespace x: p[0]")


def test_a_huge_number_is_cut_like_a_deep_value() -> None:
    with pytest.raises(
        JsonTooDeep, match=r"spec\.devices\.config\[0\]\.opaque\.parameters\.x: a number"
    ):
        decode_object(claim_text("big", '{"x": ' + "9" * 5000 + "}"))


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH])
def test_nesting_up_to_the_limit_is_read_unchanged(depth: int) -> None:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    text = json.dumps(value)
    assert decode(text) == (value, [])
    wrapped = json.dumps({"a": value})  # one level more
    if depth < MAX_DEPTH:
        assert decode_object(wrapped) == {"a": value}
    else:
        with pytest.raises(JsonTooDeep, match=r"^object: a\[0\]"):
            decode_object(wrapped)


@pytest.mark.parametrize("text", ["<html>", '{"a": [}', '"a string"', "[1, 2"])
def test_what_is_not_a_json_object_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        decode_object(text)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 5000, "t": {"u": ']}\\"[{'}})
    assert decode_object(text) == json.loads(text)
