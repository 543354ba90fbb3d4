"""Our kubelet protos against upstream k8s.io/kubelet, on everything the wire sees.

The upstream modules are fetched at test time through the Go module proxy (or
found in the local module cache) and never copied into the repository. Their
``.proto`` files are compiled with grpcio-tools' protoc; the descriptors are
compared with those of our generated modules: packages, services, methods and
their streaming, messages, fields (name, number, type, type name, label,
proto3 ``optional``), nested map entries and enums.

v0.37.2 (the newest kubelet of the version matrix) must match exactly. The kubelets of
the older releases the plugin runs with (v0.34.4, v0.35.4, v0.36.3: each asks for the DRA
service ``v1.DRAPlugin`` or ``v1beta1.DRAPlugin`` and opens ``v1alpha1.DRAResourceHealth``)
must find every service, method, message and field they know in ours, unchanged; fields
they do not know yet are skipped by their decoders and listed by the test.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc  # type: ignore[import-untyped]

from proto.gen.dra.v1 import api_pb2 as dra_v1
from proto.gen.dra.v1beta1 import api_pb2 as dra_v1beta1
from proto.gen.drahealth.v1 import api_pb2 as health_v1
from proto.gen.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from proto.gen.pluginregistration import api_pb2 as registration
from tests.conftest import unavailable

KUBELET_MODULE = "k8s.io/kubelet@v0.37.2"
OLDER_KUBELETS = ("k8s.io/kubelet@v0.34.4", "k8s.io/kubelet@v0.35.4", "k8s.io/kubelet@v0.36.3")
# Services an older kubelet uses: the DRA service it picks from our supported versions
# (servicesSupportedByKubelet in pkg/kubelet/cm/dra/plugin/dra_plugin.go of 1.34 - 1.36:
# v1, v1beta1), the registration service, and the health stream it opens (v1alpha1 only).
OLDER_KUBELET_PROTOS = (
    "pkg/apis/dra/v1/api.proto",
    "pkg/apis/dra/v1beta1/api.proto",
    "pkg/apis/pluginregistration/v1/api.proto",
    "pkg/apis/dra-health/v1alpha1/api.proto",
)
PAIRS: list[tuple[str, ModuleType]] = [
    ("pkg/apis/dra/v1/api.proto", dra_v1),
    ("pkg/apis/dra/v1beta1/api.proto", dra_v1beta1),
    ("pkg/apis/pluginregistration/v1/api.proto", registration),
    ("pkg/apis/dra-health/v1alpha1/api.proto", health_v1alpha1),
    ("pkg/apis/dra-health/v1/api.proto", health_v1),
]
GOGO_IMPORT = re.compile(r'^\s*import\s+"github\.com/gogo/[^"]+";\s*$', re.MULTILINE)
GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^;]+;\s*$", re.MULTILINE)
GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def _unavailable(reason: str) -> NoReturn:
    """Fails under CI=true (tests.conftest.unavailable), skips elsewhere."""
    unavailable(f"upstream k8s.io/kubelet protos unavailable: {reason}")


@functools.cache
def _download(module: str) -> Path:
    """The directory of ``module`` (``k8s.io/kubelet@v0.34.4``) in the Go module cache."""
    go = shutil.which("go")
    if go is None:
        _unavailable("'go' is not on PATH")
    with tempfile.TemporaryDirectory(prefix="wirecompat-") as tmp:
        Path(tmp, "go.mod").write_text("module wirecompat.invalid\n\ngo 1.24\n")
        env = {**os.environ, "GOFLAGS": "-mod=mod -modcacherw"}
        try:
            done = subprocess.run(
                [go, "mod", "download", "-json", module],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
        except subprocess.TimeoutExpired:
            _unavailable(f"'go mod download {module}' timed out")
    if done.returncode != 0:
        _unavailable(f"'go mod download' failed: {done.stdout.strip()} {done.stderr.strip()}")
    directory = json.loads(done.stdout).get("Dir", "")
    if not directory or not Path(directory).is_dir():
        _unavailable(f"'go mod download' gave no module directory: {done.stdout.strip()}")
    return Path(directory)


@pytest.fixture(scope="module")
def kubelet_module_dir() -> Path:
    return _download(KUBELET_MODULE)


def _upstream_descriptor(
    module_dir: Path, rel: str, work: Path
) -> descriptor_pb2.FileDescriptorProto:
    """Compile one upstream file (gogoproto options stripped; they never touch the wire)."""
    source = (module_dir / rel).read_text()
    source = GOGO_FIELD_OPTIONS.sub("", GOGO_FILE_OPTION.sub("", GOGO_IMPORT.sub("", source)))
    copy = work / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(source)
    out = work / (rel.replace("/", "_") + ".pb")
    args = ["protoc", f"-I{work}", f"--descriptor_set_out={out}", "--include_imports", str(copy)]
    assert protoc.main(args) == 0, f"protoc could not compile upstream {rel}"
    file_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (target,) = [f for f in file_set.file if f.name == rel]
    return target


def _ours(module: ModuleType) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
    return {
        "fields": {
            f.name: {
                "number": f.number,
                "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                "type_name": f.type_name,
                "label": descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                "proto3_optional": f.proto3_optional,
                "in_oneof": m.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else "",
            }
            for f in m.field
        },
        "nested": {n.name: _message(n) for n in m.nested_type},
        "map_entry": m.options.map_entry,
        "enums": {e.name: _enum(e) for e in m.enum_type},
    }


def _enum(e: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
    return {v.name: v.number for v in e.value}


def wire_shape(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Everything of a file descriptor that decides the bytes and method paths on the wire."""
    return {
        "syntax": fd.syntax or "proto2",
        "package": fd.package,
        "services": {
            s.name: {
                m.name: {
                    "input": m.input_type,
                    "output": m.output_type,
                    "client_streaming": m.client_streaming,
                    "server_streaming": m.server_streaming,
                }
                for m in s.method
            }
            for s in fd.service
        },
        "messages": {m.name: _message(m) for m in fd.message_type},
        "enums": {e.name: _enum(e) for e in fd.enum_type},
        "dependencies": sorted(d for d in fd.dependency if "gogo" not in d),
    }


def _differences(upstream: Any, ours: Any, path: str = "") -> list[str]:
    if isinstance(upstream, dict) and isinstance(ours, dict):
        out: list[str] = []
        for key in sorted(set(upstream) | set(ours)):
            where = f"{path}.{key}" if path else str(key)
            if key not in ours:
                out.append(f"{where}: missing in ours (upstream {upstream[key]!r})")
            elif key not in upstream:
                out.append(f"{where}: not upstream (ours {ours[key]!r})")
            else:
                out.extend(_differences(upstream[key], ours[key], where))
        return out
    return [] if upstream == ours else [f"{path}: upstream {upstream!r}, ours {ours!r}"]


@pytest.mark.parametrize(("rel", "module"), PAIRS, ids=[rel for rel, _ in PAIRS])
def test_generated_protos_match_upstream_on_the_wire(
    kubelet_module_dir: Path, rel: str, module: ModuleType, tmp_path: Path
) -> None:
    assert (kubelet_module_dir / rel).is_file(), f"{KUBELET_MODULE} has no {rel}"
    upstream = wire_shape(_upstream_descriptor(kubelet_module_dir, rel, tmp_path))
    ours = wire_shape(_ours(module))
    assert upstream["services"], f"no service parsed from upstream {rel}"
    assert _differences(upstream, ours) == []


def test_the_comparison_notices_a_changed_field_number(
    kubelet_module_dir: Path, tmp_path: Path
) -> None:
    rel = "pkg/apis/dra/v1/api.proto"
    upstream = _upstream_descriptor(kubelet_module_dir, rel, tmp_path)
    ours = _ours(dra_v1)
    device = next(m for m in ours.message_type if m.name == "Device")
    share_id = next(f for f in device.field if f.name == "share_id")
    share_id.number = 6
    share_id.proto3_optional = False
    assert _differences(wire_shape(upstream), wire_shape(ours)) == [
        "messages.Device.fields.share_id.number: upstream 5, ours 6",
        "messages.Device.fields.share_id.proto3_optional: upstream True, ours False",
    ]


def _only_newer_fields(differences: list[str]) -> tuple[list[str], list[str]]:
    """Split differences into fields only ours has (an older decoder skips unknown fields)
    and everything else (what the older kubelet would see differently)."""
    newer = [d for d in differences if re.match(r"^messages\.[\w.]+\.fields\.\w+: not upstream", d)]
    return newer, [d for d in differences if d not in newer]


@pytest.mark.parametrize("module_version", OLDER_KUBELETS)
@pytest.mark.parametrize(("rel", "module"), PAIRS, ids=[rel for rel, _ in PAIRS])
def test_older_kubelets_find_what_they_know_unchanged(
    module_version: str, rel: str, module: ModuleType, tmp_path: Path
) -> None:
    module_dir = _download(module_version)
    if rel not in OLDER_KUBELET_PROTOS:
        # dra-health/v1 is new in 1.37: an older kubelet never calls it.
        assert not (module_dir / rel).exists(), f"{module_version} has {rel}; compare it too"
        return
    assert (module_dir / rel).is_file(), f"{module_version} has no {rel}"
    upstream = wire_shape(_upstream_descriptor(module_dir, rel, tmp_path))
    ours = wire_shape(_ours(module))
    assert upstream["services"], f"no service parsed from upstream {rel}"
    newer, changed = _only_newer_fields(_differences(upstream, ours))
    assert changed == [], f"{module_version} would read {rel} differently"
    if newer:
        print(f"{module_version} {rel}: fields it does not know: {newer}")


@pytest.mark.parametrize(
    ("module_version", "unknown"),
    [
        ("k8s.io/kubelet@v0.34.4", ["health_check_timeout_seconds", "message"]),
        ("k8s.io/kubelet@v0.35.4", ["message"]),
        ("k8s.io/kubelet@v0.36.3", []),
    ],
)
def test_health_fields_older_kubelets_ignore(
    module_version: str, unknown: list[str], tmp_path: Path
) -> None:
    """Why the plugin re-sends its health list every 10 s (a 1.34 kubelet cannot be told a
    device's timeout and marks it Unknown 30 s after its last message), and why 1.34 and 1.35
    show no health message in pod status (docs/install.md's version table)."""
    rel = "pkg/apis/dra-health/v1alpha1/api.proto"
    upstream = wire_shape(_upstream_descriptor(_download(module_version), rel, tmp_path))
    newer, _ = _only_newer_fields(_differences(upstream, wire_shape(_ours(health_v1alpha1))))
    assert [d.split(": ")[0].rsplit(".", 1)[1] for d in newer] == unknown
