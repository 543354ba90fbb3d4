"""DRA selectors on cel-python with the Kubernetes extensions: a table of expressions on one
device, as kube-scheduler evaluates them."""

from __future__ import annotations

import pytest

from controller.explain.cel import CelEvalError, CelSyntaxError, DeviceData, compile_selector

A = 'device.attributes["gpu.tranche.dev"]'
C = 'device.capacity["gpu.tranche.dev"]'
H100 = DeviceData(
    "gpu.tranche.dev",
    {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.133.20"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "mpsMemoryLimitEnforced": {"bool": False},
    },
    {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
)

TRUE_FALSE = [
    (f'{A}.type == "gpu"', True),
    ('device.driver == "gpu.tranche.dev"', True),
    ('device.driver == "gpu.nvidia.com"', False),
    (f'{A}.productName.startsWith("NVIDIA H100")', True),
    (f'{A}.productName.matches("^NVIDIA (H100|H200)")', True),
    (f'{A}.productName.lowerAscii().contains("h100")', True),
    (f'{A}.productName.upperAscii() == "NVIDIA H100 80GB HBM3"', True),
    (f'{A}.productName.split(" ")[1] == "H100"', True),
    (f'{A}.productName.replace("NVIDIA ", "") == "H100 80GB HBM3"', True),
    (f'{A}.productName.indexOf("H100") == 7', True),
    (f'{A}.productName.substring(0, 6) == "NVIDIA"', True),
    (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
    (f'{C}.memory.compareTo(quantity("80Gi")) >= 0', False),
    (f'{C}.memory.isGreaterThan(quantity("79Gi"))', True),
    (f'{C}.memory.isLessThan(quantity("1Ti"))', True),
    (f"{C}.multiprocessors.asInteger() == 132", True),
    (f'{C}.memory.add(quantity("1Mi")).compareTo(quantity("81560Mi")) == 0', True),
    (f'{C}.multiprocessors.sub(quantity("32")).asInteger() == 100', True),
    (f"sign({C}.memory) == 1 && {C}.memory.isInteger()", True),  # sign(q): cel-go has no q.sign()
    ('isQuantity("10Gi") && !isQuantity("ten")', True),
    (f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0"))', True),
    (f'{A}.cudaComputeCapability.compareTo(semver("9.0.0")) == 0', True),
    (f'{A}.driverVersion.isLessThan(semver("535.0.0"))', False),
    (f"{A}.driverVersion.major() == 570 && {A}.driverVersion.minor() == 133", True),
    ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ('isSemver("1.2.3") && !isSemver("1.2")', True),
    ('semver("v1.2", true) == semver("1.2.0")', True),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"', True),
    ('device.attributes["resource.kubernetes.io"].numaNode == 1', True),
    (f"{A}.mpsMemoryLimitEnforced == false", True),
    (f'"sharing" in {A}', False),
    (f'!("dedicatedTo" in {A})', True),
    (f"has({A}.profile)", False),
    (f"has(({A}.type))", True),  # parentheses leave a field selection one
    (f"has({A}.?type.value)", False),  # a field of the optional, not a key of the map
    (f'{A}.type == "mig" && {A}.profile == "1g.10gb"', False),  # && stops at false
    (f'{A}.type == "gpu" || {A}.profile == "1g.10gb"', True),
    ('device.attributes["other.example.com"].size() == 0', True),  # unknown domain: empty
    ("device.allowMultipleAllocations == false", True),
    # cel-go's ==: other types are unequal, not an error; numbers compare across types
    (f"{A}.type == 1", False),
    (f"{A}.type != 1", True),
    ('device.attributes["resource.kubernetes.io"].numaNode == "1"', False),
    ('device.attributes["resource.kubernetes.io"].numaNode in ["1", "2"]', False),
    (f"{A}.mpsMemoryLimitEnforced == 0", False),
    ('device.attributes["resource.kubernetes.io"].numaNode == 1.0', True),
    ('device.attributes["resource.kubernetes.io"].numaNode < 1.5', True),
    # cel.bind (ext.Bindings, in the DRA environment since 1.31) names a value once
    (f'cel.bind(a, {A}, a.type == "gpu" && a.productName.startsWith("NVIDIA"))', True),
    (f'cel.bind(a, {A}, a.?profile.orValue("") == "")', True),
    ("cel.bind(a, 1, cel.bind(b, a + 1, b == 2))", True),
    ("cel.bind(a, 1, [1, 2].exists(x, x == a))", True),
    ('cel.bind(a, quantity("bad"), true)', True),  # a value not used is no error
    ("cel.bind(device, 1, device == 1)", True),
    (f'dyn({A}.type) == "gpu"', True),
]


@pytest.mark.parametrize(("expression", "expected"), TRUE_FALSE)
def test_selector(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(H100) is expected


# A library function that fails (a bad quantity, an index out of range) gives an error value, as in
# cel-go, which `||`, `&&` and `?:` absorb when the other side decides the result; each row's
# result is kube-scheduler's (k8s.io/dynamic-resource-allocation/cel on cel-go v0.29).
ABSORBED = [
    ('true || quantity("bad") == quantity("1")', True),
    ('quantity("bad") == quantity("1") || true', True),
    ('false && quantity("bad") == quantity("1")', False),
    ('quantity("bad") == quantity("1") && false', False),
    ('!(quantity("bad") == quantity("1")) || true', True),
    ('true ? true : quantity("bad") == quantity("1")', True),
    ('semver("x").major() == 1 || true', True),
    ('quantity("1.5").asInteger() == 1 || true', True),
    (f'{A}.productName.substring(5, 99) == "" || true', True),
    (f'{A}.productName.charAt(99) == "" || {A}.type == "gpu"', True),
    (f'{A}.productName.size() > 30 && {A}.productName.substring(0, 30) == ""', False),
    (f'isQuantity({A}.type) && quantity({A}.type).isGreaterThan(quantity("1"))', False),
    ('[1, 2].exists(x, quantity("bad") == quantity("1") || x == 1)', True),
    # an error inside a macro's expression is an error value too
    ('[1, 2].map(x, quantity("bad")).size() == 2 || true', True),
    # two errors are an error value too, which a third operand absorbs
    (f'{A}.profile == "x" || {A}.migProfile == "x" || {A}.type == "gpu"', True),
    (f'({A}.profile == "x" && {A}.migProfile == "x") && false', False),
    (f'["profile", "migProfile"].exists(n, {A}[n] == "x") || {A}.type == "gpu"', True),
    (f'["profile", "migProfile"].all(n, {A}[n] == "x") && false', False),
    (f'["profile", "type"].exists(n, {A}[n] == "gpu")', True),
    (f'["type", "profile"].all(n, {A}[n] == "x")', False),
    (f'["profile", "migProfile", "type"].exists_one(n, {A}[n] == "gpu") || true', True),
    ('[1, 2].filter(x, x == 1 ? quantity("bad").isInteger() : true).size() == 1 || true', True),
    (f'{A}.?productName.optMap(n, quantity(n)).hasValue() || {A}.type == "gpu"', True),
    (f"{A}.?productName.optFlatMap(n, optional.of(quantity(n))).hasValue() || true", True),
]


@pytest.mark.parametrize(("expression", "expected"), ABSORBED)
def test_library_errors_are_absorbed_by_logical_operators(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(H100) is expected


# cel-go's optional library (cel.OptionalTypes), in Kubernetes' base CEL environment since 1.28;
# the expected results follow cel-go: `.?`/`[?]` give optional.none() for an absent key, every
# qualifier after an optional one tests presence too, `or`/`orValue` short-circuit.
OPTIONAL = [
    (f'{A}.?model.orValue("") == ""', True),
    (f'{A}.?type.orValue("") == "gpu"', True),
    (f'{A}[?"type"].value() == "gpu"', True),
    (f"{A}.?profile.hasValue()", False),
    (f"{A}.?type.hasValue()", True),
    ('device.attributes["other.example.com"].?model.orValue("none") == "none"', True),
    ('device.attributes[?"other.example.com"].hasValue()', True),  # an unknown domain is {}
    ('device.?attributes["gpu.tranche.dev"].type == optional.of("gpu")', True),
    ('device.?attributes["gpu.tranche.dev"].profile == optional.none()', True),
    (f'{A}.?profile.or({A}.?type).value() == "gpu"', True),
    (f'{A}.?type.or(optional.of("x")) == optional.of("gpu")', True),
    (f'{A}.?type.orValue({A}.profile) == "gpu"', True),  # the default is not evaluated
    (f'{A}.?productName.optMap(n, n.startsWith("NVIDIA H100")).orValue(false)', True),
    (f'{A}.?profile.optMap(p, p == "1g.10gb").orValue(true)', True),
    (
        f'{A}.?type.optFlatMap(t, t == "gpu" ? optional.of(1) : optional.none()).orValue(0) == 1',
        True,
    ),
    ('optional.ofNonZeroValue("").hasValue()', False),
    (f"optional.ofNonZeroValue({C}.memory).hasValue()", True),
    ("optional.none() == optional.none() && optional.of(1) != optional.none()", True),
    (f'{A}.productName.split(" ")[?5].orValue("") == ""', True),
    (f'{A}.productName.split(" ")[?1] == optional.of("H100")', True),
    ('{"a": 1}[?"a"].value() == 1 && !{"a": 1}[?"b"].hasValue()', True),
    ("optional.unwrap([optional.of(1), optional.none()]) == [1]", True),
    ("[optional.none(), optional.of(2)].unwrapOpt() == [2]", True),
    ("[1, 2, 3].first().value() == 1 && [1, 2, 3].last().value() == 3", True),
    (f'{C}.?memory.orValue(quantity("0")).isGreaterThan(quantity("80Gi"))', False),
    (f'false && {A}.?profile.value() == "x"', False),
    # optional elements: `[?x]` and `{?k: x}` add x's value when present and nothing when not
    (f'[?{A}.?type] == ["gpu"]', True),
    (f"[?{A}.?profile].size() == 0", True),
    (f'[?{A}.?profile, ?{A}.?type, "x"] == ["gpu", "x"]', True),
    (f'"gpu" in [?{A}.?type]', True),
    (f"[?{A}.?productName.optMap(n, n.size())] == [21]", True),
    ("[1, ?optional.of(2), ?optional.none(), 3] == [1, 2, 3]", True),
    ('{?"k": optional.none()} == {}', True),
    ('{?"k": optional.of(1), "j": 2} == {"k": 1, "j": 2}', True),
    (f'{{?"a": {A}.?profile, ?"b": {A}.?type}} == {{"b": "gpu"}}', True),
    (f"{{?{A}.type: optional.of(1)}}[{A}.type] == 1", True),
    ('{"a": 1, "a": 2}["a"] == 2', True),  # cel-go keeps the last of repeated keys
    ('{?"a": optional.of(1), "a": 2}["a"] == 2', True),
    ("[1, 2,] == [1, 2] && {1: 2,}.size() == 1", True),  # a trailing comma is allowed
    ('[?optional.none(), ?optional.of(quantity("bad"))].size() == 1 || true', True),
]


@pytest.mark.parametrize(("expression", "expected"), OPTIONAL)
def test_optional_selector(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(H100) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f'{A}.profile == "1g.10gb"', "profile"),  # a missing attribute is an error, no match
        ('device.attributes["other.example.com"].model == "x"', "model"),
        (f'{A}.driverVersion == "570.133.20"', "overload"),  # a version is no string
        (f"{C}.multiprocessors == 132", "overload"),  # nor a quantity a number
        (f'{C}.memory.compareTo(semver("1.0.0")) > 0', "both sides"),
        ('quantity("lots") == quantity("1")', "not a quantity"),
        (f'{A}.productName.substring(5, 99) == ""', "out of range"),
        (f'false || {A}.productName.charAt(99) == ""', "out of range"),
        ('semver("x") == semver("1.0.0") || false', "not a semantic version"),
        ('device.driver + "x"', "not a bool"),
        (f'{A}.?profile.value() == "x"', "optional.none() dereference"),
        (f'{A}.type.orValue("x") == "x"', "no such overload"),
        (f'cel.bind(a, {A}, a.profile == "x")', "profile"),
        (f"[?optional.of({A}.profile)].size() == 1", "profile"),  # the element's error
        (f'{{?"k": optional.of({A}.profile)}}.size() == 1', "profile"),
        (f'[?{A}.type] == ["gpu"]', "needs an optional"),  # cel-go does not compile these
        (f'{{?"k": {A}.type}}.size() == 1', "needs an optional"),
        # two errors on either side of || or &&: the first one, as cel-go reports
        (f'{A}.profile == "1g.10gb" || {A}.migProfile == "1g.10gb"', "profile"),
        ('{"a": 1}.first == 1 && {"a": 1}.second == 1', "first"),
        (f'["profile", "migProfile"].exists(n, {A}[n] == "x")', "profile"),
    ],
)
def test_evaluation_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvalError, match=None) as got:
        compile_selector(expression).matches(H100)
    assert message in str(got.value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("device.driver ==", "does not parse"),
        (f'{A}.type = "gpu"', "does not parse"),
        ("lowerascii(device.driver)", "undeclared function 'lowerascii'"),
        ("bind(a, 1, a == 1)", "undeclared function 'bind'"),
        ("cel.bind(1, 1, true)", "cel.bind() variable names must be simple identifiers"),
        (f"{A}.?", "does not parse"),
        # cel-go's has() takes a field selection only, never an optional one or an index
        (f"has({A}.?profile)", "invalid argument to has() macro (line 1, column 5)"),
        (f'has({A}[?"profile"]) || true', "invalid argument to has() macro"),
        (f'{A}.type == "gpu" && has({A}["profile"])', "invalid argument to has() macro"),
        ("has(device)", "invalid argument to has() macro"),
        (f"has({A}.type.size())", "invalid argument to has() macro"),
    ],
)
def test_syntax_errors(expression: str, message: str) -> None:
    with pytest.raises(CelSyntaxError, match=None) as got:
        compile_selector(expression)
    assert message in str(got.value)


def test_results_are_shared_by_devices_that_differ_only_in_unread_attributes() -> None:
    selector = compile_selector(f'{A}.type == "gpu"')
    twin = DeviceData(H100.driver, {**H100.attributes, "uuid": {"string": "GPU-2"}}, H100.capacity)
    assert selector.matches(H100) and selector.matches(twin)
    assert len(selector._cache) == 2  # the set of attribute names differs, values do not count
    assert selector.matches(
        DeviceData(H100.driver, {**H100.attributes, "uuid": {"string": "GPU-3"}}, H100.capacity)
    )
    assert len(selector._cache) == 2
