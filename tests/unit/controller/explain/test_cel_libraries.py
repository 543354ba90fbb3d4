"""The CEL libraries of the DRA selector environment beyond quantities, versions and the string
basics (sets, lists, two-variable comprehensions, format, IP and CIDR, regex): each row's
result is what kube-scheduler's cel-go (k8s.io/dynamic-resource-allocation/cel v0.37.2) gives
for the expression on the same device."""

from __future__ import annotations

import pytest

from controller.explain.cel import CelEvalError, CelSyntaxError, DeviceData, compile_selector
from tests.unit.controller.explain.test_cel import H100

A = 'device.attributes["gpu.tranche.dev"]'
C = 'device.capacity["gpu.tranche.dev"]'
WORDS = f'{A}.productName.split(" ")'  # ["NVIDIA", "H100", "80GB", "HBM3"]
NUMA = 'device.attributes["resource.kubernetes.io"].numaNode'  # 1

SETS = [
    (f'sets.contains({WORDS}, ["H100", "NVIDIA"])', True),
    (f'sets.contains({WORDS}, ["H200"])', False),
    ('sets.contains(["a"], [])', True),
    ('sets.equivalent(["a", "b"], ["b", "a", "a"])', True),
    ('sets.equivalent(["a"], ["a", "b"])', False),
    (f"sets.intersects([{NUMA}], [0, 1])", True),
    ('sets.intersects(["a"], [])', False),
    (f'sets.contains([{C}.memory], [quantity("81559Mi")])', True),
]

LISTS = [
    ("[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0", True),
    ('[duration("1s"), duration("2s")].sum() == duration("3s")', True),
    ("[1, 5, 3].max() == 5 && [1, 5, 3].min() == 1", True),
    (f'{WORDS}.max() == "NVIDIA" && {WORDS}.min() == "80GB"', True),
    (f"[{A}.cudaComputeCapability.major(), 8].max() == 9", True),
    ('[1, 1, 2].isSorted() && !["b", "a"].isSorted()', True),
    (f'{WORDS}.indexOf("H100") == 1 && [1, 2, 1].lastIndexOf(1) == 2', True),
    (f'{WORDS}.includes("H100") && !{WORDS}.includes("H200")', True),
    (f'{WORDS}.slice(1, 3) == ["H100", "80GB"]', True),
    ("[[1, 2], [3]].flatten() == [1, 2, 3] && [[1, 2], [3]].flatten(0) == [[1, 2], [3]]", True),
    (f'{WORDS}.sort() == ["80GB", "H100", "HBM3", "NVIDIA"]', True),
    ("[1, 2, 1, 3, 2].distinct() == [1, 2, 3]", True),
    (f'{WORDS}.reverse()[0] == "HBM3"', True),
    ("lists.range(3) == [0, 1, 2]", True),
    (f'{WORDS}.sortBy(w, size(w))[0] == "H100"', True),
    ("[3, 1, 2].sortBy(x, -x) == [3, 2, 1]", True),
    ('"abcabc".lastIndexOf("b", 3) == 1 && "abcabc".indexOf("b", 2) == 4', True),
]

TWO_VARIABLES = [
    ("[1, 2].all(i, v, v > i)", True),
    ("[1, 2].exists(i, v, i == 1 && v == 3)", False),
    ("[1, 2, 3].existsOne(i, v, v > 2) && ![1, 2, 3].exists_one(i, v, v > 1)", True),
    (f'{A}.exists(name, value, name == "type" && value == "gpu")', True),
    (f'{A}.all(name, value, name != "profile")', True),
    (f'{A}.existsOne(name, value, name.endsWith("Version"))', True),
    (f'{C}.exists(name, q, name == "memory" && q.isGreaterThan(quantity("79Gi")))', True),
    ("device.attributes.exists(domain, attrs, attrs.size() == 2)", True),
    ("[1, 2].transformList(i, v, i + v) == [1, 3]", True),
    ("[1, 2, 3].transformList(i, v, v % 2 == 1, v * 10) == [10, 30]", True),
    ('{"a": 1, "b": 2}.transformMap(k, v, v + 1) == {"a": 2, "b": 3}', True),
    ('{"a": 1, "b": 2}.transformMapEntry(k, v, v > 1, {v: k}) == {2: "b"}', True),
    # all stops at a false, exists at a true: an error elsewhere does not matter
    ("[0, 1].all(i, v, 2 / v > 5)", False),
    ("[0, 2].exists(i, v, 2 / v == 1)", True),
    ("[1, 0].transformList(i, v, v > 0, 2 / v) == [2]", True),
]

# CEL's three-argument map(x, filter, transform): the transform only where the filter holds
MAP_FILTER = [
    (f'{WORDS}.map(w, w.size() > 4, w) == ["NVIDIA"]', True),
    ("[0, 2].map(x, x > 0, 4 / x) == [2]", True),
    ('{"a": 1, "b": 2}.map(k, k != "a", k + "!") == ["b!"]', True),
    (f'{A}.map(k, k.startsWith("cuda"), k) == ["cudaComputeCapability"]', True),
    ("[0, 2].map(x, 4 / x > 1, x).size() == 1 || true", True),
]

FORMAT = [
    ('"%s-%d".format(["a", 1]) == "a-1"', True),
    (f'"%s/%s".format([device.driver, {A}.type]) == "gpu.tranche.dev/gpu"', True),
    (f'"%d GiB".format([{C}.memory.asInteger() / 1073741824]) == "79 GiB"', True),
    ('"%s".format([[1, "a", 1.5, null]]) == "[1, \\"a\\", 1.500000, null]"', True),
    ('"%s".format([{"b": 1, "a": [true]}]) == "{\\"a\\":[true], \\"b\\":1}"', True),
    ('"%s %s %s".format([2.0, 1234567.0, 1e-7]) == "2 1.234567e+06 1e-07"', True),
    ('"%.2f|%f".format([1234.5, -0.0]) == "1,234.50|0.000000"', True),  # en_US, as cel-go
    ('"%e".format([-1234.5]) == "-1.234500\u00d710⁰³"', True),  # \u00d7: a multiplication sign
    ('"%.15e".format([1.0]) == "  1.000000\u00d710⁰⁰"', True),  # the precision is a width
    ('"%x %X %o %b %%".format([255, "hi", 8, true]) == "ff 6869 10 1 %"', True),
    ('"%s".format([duration("90m")]) == "5400s"', True),
    ('strings.quote("a\\"b\\n") == "\\"a\\\\\\"b\\\\n\\""', True),
]

NETWORK = [
    ('ip("10.0.0.1").family() == 4 && ip("::1").family() == 6', True),
    ('ip("2001:db8::1") == ip("2001:0db8:0:0:0:0:0:1")', True),
    ('string(ip("2001:0db8:0:0:0:0:0:1")) == "2001:db8::1"', True),
    ('ip.isCanonical("2001:db8::1") && !ip.isCanonical("2001:DB8::1")', True),
    ('isIP("10.0.0.1") && !isIP("10.0.0.01") && !isIP("::ffff:1.2.3.4")', True),
    ('ip("127.1.2.3").isLoopback() && ip("0.0.0.0").isUnspecified()', True),
    ('ip("10.0.0.1").isGlobalUnicast() && !ip("169.254.0.1").isGlobalUnicast()', True),
    ('ip("fe80::1").isLinkLocalUnicast() && ip("ff12::1").isLinkLocalMulticast()', True),
    ('cidr("10.0.0.0/8").containsIP("10.255.0.1") && !cidr("10.0.0.0/8").containsIP("::1")', True),
    ('cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16")', True),
    ('cidr("10.1.2.3/8") == cidr("10.0.0.0/8")', False),  # the address is kept as written
    ('cidr("10.1.2.3/8").masked() == cidr("10.0.0.0/8")', True),
    ('cidr("10.1.2.3/8").ip() == ip("10.1.2.3") && cidr("::/0").prefixLength() == 0', True),
    ('isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0/33") && !isCIDR("10.0.0.0/08")', True),
]

REGEX = [
    (f'{A}.productName.find("H[0-9]+") == "H100"', True),
    (f'{A}.productName.findAll("[0-9]+") == ["100", "80", "3"]', True),
    ('"banana".findAll("a", 2) == ["a", "a"]', True),
    ('"abab".findAll("b*") == ["", "b", "b"]', True),  # Go skips an empty match after one
    ('"abc".find("x") == ""', True),
]


@pytest.mark.parametrize(
    ("expression", "expected"),
    SETS + LISTS + TWO_VARIABLES + MAP_FILTER + FORMAT + NETWORK + REGEX,
)
def test_library_selector(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(H100) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("[].max() == 0", "max called on empty list"),
        (f"{WORDS}.slice(2, 1).size() == 0", "start index must be less than or equal"),
        ("lists.range(-1).size() == 0", "size must be non-negative"),
        ("[0, 1].existsOne(i, v, 2 / v > 1)", "divide by zero"),
        ("[0, 2].map(x, 4 / x > 1, x).size() == 1", "divide by zero"),
        # existsOne reads every attribute: a version compared with a string is an error
        (f'{A}.existsOne(name, value, value == "gpu")', "overload"),
        ('{"a": 1, "b": 1}.transformMapEntry(k, v, {v: k}).size() == 2', "already exists"),
        (f'"%s".format([{A}.driverVersion]) == ""', "string clause can only be used"),
        (f'"%d".format([{A}.type]) == ""', "decimal clause can only be used on integers"),
        ('ip("10.0.0.01").family() == 4', "parse error"),
        ('cidr("::ffff:1.2.3.4/120").prefixLength() == 120', "IPv4-mapped"),
        (f'{A}.productName.find(device.driver + "[") == ""', "Illegal regex"),
    ],
)
def test_library_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvalError, match=None) as got:
        compile_selector(expression).matches(H100)
    assert message in str(got.value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # cel-go refuses these when it compiles the selector (so does the API server)
        (f"{C}.memory.sign() == 1", "declares only sign(x)"),
        (f'isGreaterThan({C}.memory, quantity("1"))', "declares only x.isGreaterThan(...)"),
        ("[1, 2].all(i, i, true)", "duplicate variable name: i"),
        ("[1, 2].transformList(i, v) == []", "transformList() takes 3 or 4 arguments"),
        ("[1, 2].existsOne(v, v == 1)", "existsOne() takes 3 arguments"),
        # the scheduler evaluates these; explain says it cannot rather than guess
        ('isURL("https://example.com")', "explain cannot evaluate CEL's URL library (isURL())"),
        ('url("https://x").getHost() == "x"', "explain cannot evaluate CEL's URL library"),
        ('format.dns1123Label().validate("a").hasValue()', "cannot evaluate CEL's format library"),
    ],
)
def test_library_refusals(expression: str, message: str) -> None:
    with pytest.raises(CelSyntaxError, match=None) as got:
        compile_selector(expression)
    assert message in str(got.value)


def test_a_comprehension_over_attributes_reads_the_values_it_does_not_name() -> None:
    # results are cached by the attributes an expression names; this one names none of them
    selector = compile_selector(f'{A}.existsOne(name, value, value == "GPU-1")')
    one = DeviceData(H100.driver, {"type": {"string": "gpu"}, "uuid": {"string": "GPU-1"}}, {})
    two = DeviceData(H100.driver, {"type": {"string": "gpu"}, "uuid": {"string": "GPU-2"}}, {})
    assert selector.matches(one) is True
    assert selector.matches(two) is False
