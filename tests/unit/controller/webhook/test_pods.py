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

GPU = "nvidia.com/gpu"


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
        init=(_c("warm", {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"}),),
    )
    m = mutate_pod(pod)
    assert m is not None
    out = _apply(pod, m.patch)
    names = [c["name"] for c in out["spec"]["resourceClaims"]]
    assert names == ["legacy-c0-gpu", "legacy-c1-mig-1g-10gb"]  # the init container reuses c0's
    assert out["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "legacy-c0-gpu"}]}
    assert sorted(t.name for t in m.templates) == [
        "tranche-legacy-gpu-1", "tranche-legacy-mig-1g-10gb-1"]  # fmt: skip
    mig = next(t for t in m.templates if t.legacy.mig_profile)
    exactly = mig.requests()[0]["exactly"]
    assert exactly["deviceClassName"] == "mig.gpu.tranche.dev"
    assert '"1g.10gb"' in exactly["selectors"][0]["cel"]["expression"]
    assert "nvidia.com/mig-1g.10gb" not in json.dumps(out["spec"]["containers"][1]["resources"])


def _sidecar(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {**_c(name, limits), "restartPolicy": "Always"}


def _claims(out: dict[str, Any]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The pod's legacy claims with their template's count, and each container's claims."""
    counts = {
        c["name"]: int(c["resourceClaimTemplateName"].rsplit("-", 1)[1])
        for c in out["spec"].get("resourceClaims", [])
    }
    containers = out["spec"].get("initContainers", []) + out["spec"]["containers"]
    uses = {c["name"]: [x["name"] for x in c["resources"].get("claims", [])] for c in containers}
    return counts, uses


@pytest.mark.parametrize(
    ("init", "containers", "claims", "uses"),
    [
        # an init container's GPU is one of the app container's, as the device plugin and the
        # 1.37 bridge give it: one GPU for the pod, not two (a 1-GPU node fits it)
        ([_c("check", {GPU: "1"})], [_c("main", {GPU: "1"})],
         {"legacy-c0-gpu": 1}, {"check": ["legacy-c0-gpu"], "main": ["legacy-c0-gpu"]}),
        # it takes the later containers' claims in order until they hold its count
        ([_c("check", {GPU: "2"})], [_c("a", {GPU: "1"}), _c("b", {GPU: "1"})],
         {"legacy-c0-gpu": 1, "legacy-c1-gpu": 1},
         {"check": ["legacy-c0-gpu", "legacy-c1-gpu"], "a": ["legacy-c0-gpu"],
          "b": ["legacy-c1-gpu"]}),
        # what they lack comes from one claim the init containers share, the largest lack
        ([_c("x", {GPU: "3"}), _c("y", {GPU: "2"})], [_c("main", {GPU: "1"})],
         {"legacy-i0-gpu": 2, "legacy-c0-gpu": 1},
         {"x": ["legacy-c0-gpu", "legacy-i0-gpu"], "y": ["legacy-c0-gpu", "legacy-i0-gpu"],
          "main": ["legacy-c0-gpu"]}),
        # an init container alone keeps its own claim
        ([_c("warm", {GPU: "2"})], [_c("main", {"cpu": "1"})],
         {"legacy-i0-gpu": 2}, {"warm": ["legacy-i0-gpu"], "main": []}),
        # a sidecar runs beside the others: a claim of its own, reusable only by the init
        # containers before it
        ([_sidecar("log", {GPU: "1"}), _c("late", {GPU: "1"})], [_c("main", {GPU: "1"})],
         {"legacy-i0-gpu": 1, "legacy-c0-gpu": 1},
         {"log": ["legacy-i0-gpu"], "late": ["legacy-c0-gpu"], "main": ["legacy-c0-gpu"]}),
        ([_c("early", {GPU: "1"}), _sidecar("log", {GPU: "1"})], [_c("main", {"cpu": "1"})],
         {"legacy-i1-gpu": 1}, {"early": ["legacy-i1-gpu"], "log": ["legacy-i1-gpu"], "main": []}),
    ],
)  # fmt: skip
def test_init_containers_reuse_the_devices_of_the_containers_after_them(
    init: list[dict[str, Any]],
    containers: list[dict[str, Any]],
    claims: dict[str, int],
    uses: dict[str, list[str]],
) -> None:
    pod = _pod(*containers, init=tuple(init))
    m = mutate_pod(pod)
    assert m is not None
    out = _apply(pod, m.patch)
    assert _claims(out) == (claims, uses)
    summary = out["metadata"]["annotations"][ANNOTATION_REWRITTEN]
    assert {(t.name, t.count) for t in templates_of(summary)} == {
        (f"tranche-legacy-gpu-{n}", n) for n in claims.values()
    }
    assert GPU not in json.dumps(out["spec"])


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
