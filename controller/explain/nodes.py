"""Which nodes the pod may use: its nodeSelector and required node affinity (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from controller.explain.model import Json


def node_labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(selector.items()) if labels.get(k) != v]


def _requirement(req: Json, value: str | None) -> bool:
    op, values = req.get("operator"), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def term_matches(term: Json, node: str, labels: Mapping[str, str]) -> bool:
    """One nodeSelectorTerm: every matchExpression and matchField holds."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no node
    return all(_requirement(r, labels.get(str(r.get("key")))) for r in exprs) and all(
        _requirement(r, node if r.get("key") == "metadata.name" else None) for r in fields
    )
