"""One object read from the API server as raw JSON, its failures as the project's errors.

Raw JSON (``_preload_content=False``) keeps fields the generated client models do
not know yet. The claim and namespace readers share it: a missing object is a
:class:`ClaimError`, any other failure an :class:`ApiUnavailable`, each naming
the object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from driver.errors import ApiUnavailable, ClaimError

READ_TIMEOUT_S = 10.0


def read_raw(
    where: str, call: Callable[[], Any], *, missing: str, unknown: str = ""
) -> dict[str, Any]:
    """The JSON object ``call()`` reads (a typed client call with ``_preload_content=False``).

    ``where`` names the object; ``missing`` ends the not-found message; ``unknown`` ends
    the messages of failed reads (what is unknown because of them).
    """
    try:
        response: Any = call()
        body = json.loads(response.data)
    except ApiException as e:
        if e.status == 404:
            raise ClaimError(f"{where}: not found on the API server{missing}") from e
        raise ApiUnavailable(
            f"{where}: reading it from the API server failed: HTTP {e.status} {e.reason}{unknown}"
        ) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiUnavailable(
            f"{where}: the API server is unreachable ({type(e).__name__}: {e}){unknown}"
        ) from e
    except ValueError as e:
        raise ApiUnavailable(f"{where}: the API server sent invalid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiUnavailable(f"{where}: the API server sent {type(body).__name__}")
    return body
