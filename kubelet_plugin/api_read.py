"""One object read from the API server as raw JSON, its failures as the project's errors.

Raw JSON keeps fields no client library knows yet. The claim and namespace readers
share it: a missing object is a :class:`ClaimError`, any other failure an
:class:`ApiUnavailable`, each naming the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from driver.errors import ApiUnavailable, ClaimError
from driver.kube.http import ApiError, ApiUnreachable, JsonTooDeep, KubeClient

READ_TIMEOUT_S = 10.0


def read_raw(
    kube: KubeClient,
    path: str,
    where: str,
    *,
    missing: str,
    unknown: str = "",
    query: Mapping[str, str] | None = None,
    timeout_s: float = READ_TIMEOUT_S,
) -> dict[str, Any]:
    """The JSON object at ``path`` (``GET``).

    ``where`` names the object; ``missing`` ends the not-found message; ``unknown`` ends
    the messages of failed reads (what is unknown because of them).
    """
    try:
        return kube.request("GET", path, query=query, timeout_s=timeout_s)
    except ApiError as e:
        if e.status == 404:
            raise ClaimError(f"{where}: not found on the API server{missing}") from e
        raise ApiUnavailable(
            f"{where}: reading it from the API server failed: HTTP {e.status} {e.reason}{unknown}"
        ) from e
    except ApiUnreachable as e:
        raise ApiUnavailable(f"{where}: the API server is unreachable ({e.detail}){unknown}") from e
    except ApiUnavailable as e:
        raise ApiUnavailable(f"{where}: {e}{unknown}") from e
    except JsonTooDeep as e:  # this object, every time: fail it alone, clearly
        raise ClaimError(f"{where}: cannot be read: {e}") from e
    except ValueError as e:
        raise ApiUnavailable(f"{where}: the API server sent invalid JSON: {e}") from e


def read_raw_if_present(
    kube: KubeClient,
    path: str,
    where: str,
    *,
    unknown: str = "",
    timeout_s: float = READ_TIMEOUT_S,
) -> dict[str, Any] | None:
    """:func:`read_raw`, but ``None`` when the object does not exist (``404``)."""
    try:
        return read_raw(kube, path, where, missing="", unknown=unknown, timeout_s=timeout_s)
    except ClaimError as e:
        if isinstance(e.__cause__, ApiError) and e.__cause__.status == 404:
            return None
        raise
