"""CEL device selectors evaluated as kube-scheduler evaluates them, on ``cel-python``.

The environment is the one of DRA selectors (``resource.k8s.io``): one variable,
``device``, with ``driver``, ``attributes[domain].<id>``, ``capacity[domain].<id>``
and ``allowMultipleAllocations``. An unknown domain is an empty map; an unknown
attribute is an evaluation error (the scheduler then refuses the claim), which
``has(...)`` or ``"id" in device.attributes[domain]`` guard against.

``cel-python`` brings the CEL core and ``matches``; the Kubernetes extension
libraries that DRA selectors use are added here: quantities (``quantity``,
``isQuantity``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``,
``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``), semantic versions
(``semver``, ``isSemver``, ``major``, ``minor``, ``patch``, ``compareTo``,
``isGreaterThan``, ``isLessThan``) and the strings library (``lowerAscii``,
``upperAscii``, ``trim``, ``replace``, ``split``, ``join``, ``indexOf``,
``lastIndexOf``, ``substring``, ``charAt``). Version attributes arrive as semver
values and capacities as quantities, as in the scheduler.

``==``, ``!=``, ``in`` and the orderings follow cel-go, not cel-python: values of
different types are unequal rather than an error, numbers compare across int, uint and
double, and only a quantity or semantic version compared with another type fails.

Where things live: ``values.py`` the errors, :class:`Quantity` and :class:`Semver`;
``library.py`` the Kubernetes extension functions; ``compare.py`` cel-go's comparisons;
``device.py`` the ``device`` variable; ``selector.py`` compiling and the cached evaluation;
``checks.py`` what cel-go refuses to compile though cel-python parses it;
``optional.py`` cel-go's optional values (``m.?key.orValue(x)``, enabled in Kubernetes since
1.28), parsed by ``grammar.py`` and evaluated by ``interpreter.py``, which also evaluates
``cel.bind(name, value, expr)``; ``extensions.py`` the other
libraries of the scheduler's environment, one module each: ``lib_sets.py``, ``lib_lists.py``,
``comprehensions.py`` (two-variable comprehensions, ``sortBy``), ``lib_format.py``
(``format``, ``strings.quote``), ``lib_net.py`` (``ip``, ``cidr``), ``lib_regex.py``
(``find``, ``findAll``); it refuses the URL and format libraries, which explain does not
evaluate.

Public: :func:`compile_selector` (raises :class:`CelSyntaxError`), :class:`Selector`
with ``matches(device) -> bool`` (raises :class:`CelEvalError`), :class:`Quantity`,
:class:`Semver`.
"""

from controller.explain.cel.device import DeviceData
from controller.explain.cel.selector import Selector, compile_selector
from controller.explain.cel.values import CelEvalError, CelSyntaxError, Quantity, Semver

__all__ = [
    "CelEvalError",
    "CelSyntaxError",
    "DeviceData",
    "Quantity",
    "Selector",
    "Semver",
    "compile_selector",
]
