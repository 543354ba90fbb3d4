"""Text that may be JSON or YAML (flags, ``@FILE`` settings, kubeconfigs), parsed once.

JSON is tried first with the standard library; only text that is not JSON loads the YAML
parser. The Helm chart renders every structured setting as JSON and a pod reads its service
account rather than a kubeconfig, so an installed plugin never imports PyYAML (about 1 MiB of
its resident memory, docs/performance.md).
"""

from __future__ import annotations

import json
from typing import Any


class NotJsonOrYaml(ValueError):
    """The text is neither JSON nor YAML; the message is the YAML parser's."""


def parse_json_or_yaml(text: str) -> Any:
    """The document in ``text`` (``None`` for empty YAML); :class:`NotJsonOrYaml` when neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml  # noqa: PLC0415 - only for text that is not JSON (see the module docstring)

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise NotJsonOrYaml(str(e)) from e
