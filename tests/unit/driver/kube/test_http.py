"""The plugin's API client: answers are decoded with bounded nesting."""

from __future__ import annotations

import pytest

from driver.kube.http import JsonTooDeep, RawAnswer

DEEP = b"[" * 2048 + b"]" * 2048


def test_a_deeply_nested_answer_is_a_value_error_not_a_recursion_error() -> None:
    body = b'{"kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": {"p": ' + DEEP + b"}}"
    with pytest.raises(JsonTooDeep, match=r"^ResourceClaim c: spec\.p\[0\]"):
        RawAnswer(200, "OK", body).json()
    assert RawAnswer(500, "Internal", DEEP).message().startswith("[[[")
