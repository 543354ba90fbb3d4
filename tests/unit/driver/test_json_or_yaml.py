"""Settings text: JSON read by the standard library, YAML only when it is not JSON."""

from __future__ import annotations

import pytest

from driver.json_or_yaml import NotJsonOrYaml, parse_json_or_yaml


@pytest.mark.parametrize(
    ("text", "doc"),
    [
        ('{"groups": ["blue"], "maxShares": 4}', {"groups": ["blue"], "maxShares": 4}),
        ("groups: [blue]\nmaxShares: 4\n", {"groups": ["blue"], "maxShares": 4}),
        ("'*': [gpu, mig]", {"*": ["gpu", "mig"]}),
        ("", None),
    ],
)
def test_json_and_yaml_give_the_same_document(text: str, doc: object) -> None:
    assert parse_json_or_yaml(text) == doc


def test_text_that_is_neither_names_the_position() -> None:
    with pytest.raises(NotJsonOrYaml, match="line 1, column 6"):
        parse_json_or_yaml("{a: [")
    assert issubclass(NotJsonOrYaml, ValueError)
