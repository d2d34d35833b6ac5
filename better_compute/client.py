"""The API over HTTP: `POST <url>/api/compute/<group>/<method>` with a JSON body and a bearer token.

Three outcomes, one per exit code of the CLI:

* a JSON object with a 2xx status: the answer;
* an error envelope `{"error": {"code", "message", "details"}}`: ApiError (exit 1);
* no connection, a timeout, a redirect, or anything that is not the contract's
  JSON (an HTML error page from a proxy, an empty body): Unreachable (exit 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import requests

from better_compute import __version__

API_PREFIX = "/api/compute/"
CONNECT_SECONDS = 10.0
# Reads wait this long beyond any `wait.timeoutMs` the request asks the server to spend.
READ_SECONDS = 60.0


@dataclass
class ApiError(Exception):
    """The API refused: its error envelope, as it sent it."""

    code: str
    message: str
    details: list[Any] = field(default_factory=list)
    status: int | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Unreachable(Exception):
    """The server could not be reached, or did not answer with the contract's JSON."""


def _snippet(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _envelope(body: Any) -> ApiError | None:
    """The ApiError an error body carries, or None when it is not the contract's envelope."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return None
    error = body["error"]
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        return None
    details = error.get("details")
    return ApiError(code=code, message=message, details=details if isinstance(details, list) else [])


class Client:
    """One server, one token; `call("capacity/summary", {...})` answers the API's JSON object."""

    def __init__(self, url: str, token: str, *, session: requests.Session | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.session = session or requests.Session()

    def endpoint(self, method: str) -> str:
        return f"{self.url}{API_PREFIX}{method}"

    def call(self, method: str, body: dict[str, Any], *, extra_seconds: float = 0.0) -> dict[str, Any]:
        url = self.endpoint(method)
        try:
            response = self.session.post(
                url,
                data=json.dumps(body),
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                    "User-Agent": f"better-compute/{__version__}",
                },
                timeout=(CONNECT_SECONDS, READ_SECONDS + extra_seconds),
                allow_redirects=False,
            )
        except requests.exceptions.Timeout:
            raise Unreachable(f"{url}: no answer within {READ_SECONDS + extra_seconds:.0f} s") from None
        except requests.exceptions.ConnectionError as exc:
            raise Unreachable(f"cannot reach {self.url}: {_connection_reason(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise Unreachable(f"{url}: {exc}") from None
        return self._answer(url, response)

    @staticmethod
    def _answer(url: str, response: requests.Response) -> dict[str, Any]:
        status = response.status_code
        content_type = response.headers.get("Content-Type", "")
        try:
            body = response.json()
        except ValueError:
            body = None
        if 200 <= status < 300 and isinstance(body, dict):
            return body
        error = _envelope(body)
        if status >= 400 and error is not None:
            error.status = status
            raise error
        shown = content_type.split(";")[0] or "no content type"
        where = f" (redirected to {response.headers['Location']})" if "Location" in response.headers else ""
        raise Unreachable(
            f"{url} answered HTTP {status}{where} with something that is not the API's JSON "
            f"({shown}): {_snippet(response.text) or 'an empty body'}"
        )


def _connection_reason(exc: Exception) -> str:
    """The innermost reason of a connection error (`Connection refused`), not urllib3's whole chain."""
    reason: BaseException = exc
    while True:
        inner = (
            reason.__cause__
            or reason.__context__
            or next((arg for arg in getattr(reason, "args", ()) if isinstance(arg, BaseException)), None)
        )
        if inner is None or inner is reason:
            break
        reason = inner
    text = str(reason)
    # urllib3 prefixes its own object's repr: keep what follows the last colon-space pair.
    if "]" in text and "Errno" in text:
        text = text[text.index("[Errno") :]
    return _snippet(text, 160)
