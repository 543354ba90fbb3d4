"""The fallback webhook's pod rewrite: legacy resources become per-container claims."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controller.webhook.pods import (
    ANNOTATION_REWRITTEN,
    LABEL_REWRITTEN,
    ZERO_COUNTS,
    PodRejected,
    mutate_pod,
    templates_of,
)


def _apply(doc: dict[str, Any], patch: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """A minimal RFC 6902 ``add`` (all the webhook emits)."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[parts[-1]] = op["value"]
    return out


def _pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "train"}, "spec": spec}


def _c(name: str, limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits}
    if requests:
        res["requests"] = requests
    return {"name": name, "image": "cuda", "resources": res}


def test_two_gpus_become_a_claim_from_the_per_count_template() -> None:
    pod = _pod(_c("main", {"nvidia.com/gpu": "2", "cpu": "4"}, {"cpu": "1"}))
    m = mutate_pod(pod)
    assert m is not None
    out = _apply(pod, m.patch)
    res = out["spec"]["containers"][0]["resources"]
    assert res == {"limits": {"cpu": "4"}, "requests": {"cpu": "1"},
                   "claims": [{"name": "legacy-c0-gpu"}]}  # fmt: skip
    assert out["spec"]["resourceClaims"] == [
        {"name": "legacy-c0-gpu", "resourceClaimTemplateName": "tranche-legacy-gpu-2"}
    ]
    assert out["metadata"]["annotations"][ANNOTATION_REWRITTEN] == "c0:nvidia.com/gpu=2"
    (t,) = m.templates
    body = t.body("team-a")
    req = body["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (req["deviceClassName"], req["count"]) == ("gpu.tranche.dev", 2)
    assert body["metadata"]["namespace"] == "team-a"


def test_each_container_gets_its_own_claim_and_mig_keeps_the_mig_class() -> None:
    pod = _pod(
        _c("a", {"nvidia.com/gpu": "1"}),
        _c("b", {"nvidia.com/mig-1g.10gb": "1"}),
        init=(_c("warm", {"nvidia.com/gpu": "1"}),),
    )
    m = mutate_pod(pod)
    assert m is not None
    out = _apply(pod, m.patch)
    names = [c["name"] for c in out["spec"]["resourceClaims"]]
    assert names == ["legacy-i0-gpu", "legacy-c0-gpu", "legacy-c1-mig-1g-10gb"]
    assert sorted(t.name for t in m.templates) == [
        "tranche-legacy-gpu-1", "tranche-legacy-mig-1g-10gb-1"]  # fmt: skip
    mig = next(t for t in m.templates if t.legacy.mig_profile)
    exactly = mig.requests()[0]["exactly"]
    assert exactly["deviceClassName"] == "mig.gpu.tranche.dev"
    assert '"1g.10gb"' in exactly["selectors"][0]["cel"]["expression"]
    assert "nvidia.com/mig-1g.10gb" not in json.dumps(out["spec"]["containers"][1]["resources"])


def test_pods_without_legacy_resources_are_left_alone() -> None:
    assert mutate_pod(_pod(_c("a", {"cpu": "1"}))) is None
    assert mutate_pod({"spec": {"containers": [{"name": "x"}]}}) is None


def test_existing_claims_and_annotations_are_kept() -> None:
    pod = _pod(_c("a", {"nvidia.com/gpu": "1"}))
    pod["metadata"]["annotations"] = {"team": "vision"}
    pod["spec"]["resourceClaims"] = [{"name": "scratch", "resourceClaimName": "nvme"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "scratch"}]
    m = mutate_pod(pod)
    assert m is not None
    out = _apply(pod, m.patch)
    assert out["metadata"]["annotations"]["team"] == "vision"
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["scratch", "legacy-c0-gpu"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "scratch"}, {"name": "legacy-c0-gpu"}]  # fmt: skip


def test_a_zero_count_is_removed_without_a_claim() -> None:
    pod = _pod(_c("a", {"nvidia.com/gpu": "0", "cpu": "1"}))
    m = mutate_pod(pod)
    assert m is not None and m.templates == ()
    out = _apply(pod, m.patch)
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}}
    assert "resourceClaims" not in out["spec"]


@pytest.mark.parametrize(
    ("limits", "requests", "field"),
    [
        ({"nvidia.com/gpu": "1.5"}, None, "spec.containers[0].resources.limits[nvidia.com/gpu]"),
        ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}, "spec.containers[0].resources"),
    ],
)
def test_bad_counts_are_rejected_naming_the_field(
    limits: dict[str, str], requests: dict[str, str] | None, field: str
) -> None:
    with pytest.raises(PodRejected) as e:
        mutate_pod(_pod(_c("a", limits, requests)))
    assert field in str(e.value)


def test_a_clashing_claim_name_is_rejected() -> None:
    pod = _pod(_c("a", {"nvidia.com/gpu": "1"}))
    pod["spec"]["resourceClaims"] = [{"name": "legacy-c0-gpu", "resourceClaimName": "x"}]
    with pytest.raises(PodRejected, match="legacy-c0-gpu"):
        mutate_pod(pod)


def test_rewritten_pods_are_labelled_for_the_template_writer() -> None:
    pod = _pod(_c("a", {"nvidia.com/gpu": "2"}), _c("b", {"nvidia.com/mig-1g.10gb": "1"}))
    mutation = mutate_pod(pod)
    assert mutation is not None
    out = _apply(pod, mutation.patch)
    assert out["metadata"]["labels"] == {LABEL_REWRITTEN: "true"}
    # the writer reads back from the annotation exactly the templates the rewrite names
    summary = out["metadata"]["annotations"][ANNOTATION_REWRITTEN]
    assert {t.name for t in templates_of(summary)} == {t.name for t in mutation.templates}
    labelled = _pod(_c("a", {"nvidia.com/gpu": "1"}))
    labelled["metadata"]["labels"] = {"app": "x"}
    again = mutate_pod(labelled)
    assert again is not None
    assert _apply(labelled, again.patch)["metadata"]["labels"] == {
        "app": "x",
        LABEL_REWRITTEN: "true",
    }


@pytest.mark.parametrize("summary", ["c0:nvidia.com/gpu=x", "c0:example.com/gpu=1", "c0:"])
def test_an_annotation_that_is_not_a_rewrite_names_itself(summary: str) -> None:
    with pytest.raises(PodRejected, match="is not a rewrite"):
        templates_of(summary)
    assert templates_of(ZERO_COUNTS) == ()
