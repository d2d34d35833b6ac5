"""The agent's side of the API: the node agent's methods over HTTP, nothing else.

Every method is `POST /api/compute/<group>/<method>` with a bearer token (a
node-agent token, ideally scoped to the host's pool). An error answer becomes
an `ApiError` carrying the contract's code, so the daemon decides on codes,
never on messages; a server that cannot be reached is `Unreachable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

# A long poll waits at most this long on the server; the HTTP timeout leaves room for it.
TIMEOUT_SECONDS = 10.0


class Unreachable(Exception):
    """The service did not answer (connection refused, timeout, a proxy's HTML error page)."""


class ApiError(Exception):
    """The service answered with the error envelope."""

    def __init__(self, status: int, code: str, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


@dataclass
class AgentClient:
    """One session to the service, with the agent's token."""

    url: str
    token: str

    def __post_init__(self) -> None:
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Bearer {self.token}", "User-Agent": "better-compute-agent"}
        )

    def call(self, method: str, body: dict[str, Any], *, wait_seconds: float = 0.0) -> Any:
        """One method's answer (a dict), or `ApiError` / `Unreachable`."""
        try:
            response = self.session.post(
                f"{self.url.rstrip('/')}/api/compute/{method}",
                json=body,
                timeout=TIMEOUT_SECONDS + wait_seconds,
            )
        except requests.RequestException as exc:
            raise Unreachable(f"{self.url}: {exc}") from exc
        try:
            answer = response.json()
        except ValueError as exc:
            raise Unreachable(f"{self.url} answered {response.status_code} without JSON") from exc
        if response.status_code >= 400:
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise ApiError(
                response.status_code,
                str(error.get("code", "INTERNAL")),
                str(error.get("message", response.reason)),
                list(error.get("details", [])),
            )
        return answer

    def register(self, *, pool_id: str, hostname: str, labels: dict[str, str]) -> tuple[str, str]:
        """The node id, and where to long-poll its assignments (empty: this same URL)."""
        answer = self.call("nodes/register", {"poolId": pool_id, "hostname": hostname, "labels": labels})
        return str(answer["nodeId"]), str(answer.get("assignmentsUrl") or "")

    def report(self, *, node_id: str, report: dict[str, Any]) -> Any:
        return self.call("inventory/report", {"nodeId": node_id, "report": report})

    def heartbeat(self, *, node_id: str) -> bool:
        """True while the node is connected; False asks for a full report."""
        return bool(self.call("nodes/heartbeat", {"nodeId": node_id})["connected"])

    def assignments(self, *, node_id: str, after: int, wait_ms: int) -> tuple[list[dict[str, Any]], bool]:
        """The changes after `after`, and whether the node is connected (the poll is a heartbeat too)."""
        body = {"nodeId": node_id, "after": after, "waitMs": wait_ms}
        answer = self.call("nodes/assignments", body, wait_seconds=wait_ms / 1000)
        changes: list[dict[str, Any]] = answer["changes"]
        return changes, bool(answer.get("connected", True))

    def ack(
        self,
        *,
        node_id: str,
        delivery_id: int,
        accepted: bool,
        reason: str | None,
        placement: dict[str, Any] | None = None,
    ) -> Any:
        body: dict[str, Any] = {
            "nodeId": node_id,
            "deliveryId": delivery_id,
            "accepted": accepted,
            "reason": reason or "",
        }
        if placement is not None:
            body["placement"] = placement
        return self.call("nodes/ack", body)
