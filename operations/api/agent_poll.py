"""`nodes/assignments` for many agents: the long poll as an async view, served by the `agents` process.

The WSGI method (`operations.api.agents`) holds a server thread and its
database connection for as long as it waits; with a thousand agents waiting,
tenants would wait for threads. This view answers the same method with the
same body, decisions and errors, but waits on the process's `ChangeBell`
(`reservations.delivery.bell`) with neither: the reads (the token, the node,
its changes) run in the thread pool for a few milliseconds each, and the wait
is an `asyncio.Event`. It is served by an ASGI server with its own URLconf
(`config.agents_urls`, the Procfile's `agents`); `nodes/register` tells an
agent where (`assignmentsUrl`).

The waiter is registered (and cleared) before the first read, so a change that
commits between the read and the wait still rings it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.api.envelope import error_body, exception_handler
from core.authentication import BearerTokenAuthentication
from core.decisions import INVENTORY_REPORT, decide_node_scope
from core.errors import InvalidInput, Unauthenticated
from core.json_input import json_loads_strict
from inventory.services.agents import node_heartbeat
from operations.api.agent_serializers import AssignmentsInput
from operations.api.nodes import node_in_scope
from reservations.delivery.agent import node_changes_after
from reservations.delivery.bell import bell

# How long a request waits for the bell's connection before it answers without waiting.
READY_SECONDS = 5.0


def _first_look(request: HttpRequest, body: Any) -> tuple[str, int, int, list[dict[str, Any]]]:
    """Authenticate, validate, decide on the node and read its changes: (node, after, wait, changes)."""
    found = BearerTokenAuthentication().authenticate(request)  # type: ignore[arg-type]
    if found is None:
        raise Unauthenticated("a valid bearer token is required")
    principal, _token = found
    serializer = AssignmentsInput(data=body)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    scope = decide_node_scope(principal=principal, permissions=(INVENTORY_REPORT,))
    node = node_in_scope(scope, node_id=data["node_id"])
    # The poll is the agent's proof of life too (one UPDATE), so a polling agent sends no heartbeat.
    if not node_heartbeat(node_id=node.pk):
        raise _Disconnected(node.pk)
    return node.pk, data["after"], data["wait_ms"], node_changes_after(node_id=node.pk, after=data["after"])


class _Disconnected(Exception):
    """The node was seen disconnected: the agent answers with a full report before it polls on."""

    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


def _error(exc: Exception) -> JsonResponse:
    """The contract's envelope, exactly as the DRF views answer it (`core.api.envelope`)."""
    response = exception_handler(exc, {"view": "nodes/assignments (agents process)"})
    return JsonResponse(response.data, status=response.status_code)


@csrf_exempt
async def assignments(request: HttpRequest) -> JsonResponse:
    """POST `{nodeId, after?, waitMs?}` → `{nodeId, changes}`, as `nodes/assignments` answers."""
    if request.method != "POST":
        body = error_body("INVALID_INPUT", "method: use POST", [{"field": "method", "message": "use POST"}])
        return JsonResponse(body, status=405)
    try:
        parsed = json_loads_strict(request.body)
    except InvalidInput as exc:
        return _error(exc)
    raw_node = parsed.get("nodeId") if isinstance(parsed, dict) else None
    event = bell.register(raw_node) if isinstance(raw_node, str) else None
    try:
        # No bell after READY_SECONDS: answer what there is now, without waiting.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bell.ready(), READY_SECONDS)
        if event is not None:
            # Rung by the bell's own start, or before the read below: the read sees those changes.
            event.clear()
        look = sync_to_async(_first_look, thread_sensitive=False)
        try:
            node_id, after, wait_ms, changes = await look(request, parsed)
        except _Disconnected as gone:
            return JsonResponse({"nodeId": gone.node_id, "connected": False, "changes": []})
        if not changes and wait_ms > 0 and event is not None and bell.listening:
            try:
                await asyncio.wait_for(event.wait(), wait_ms / 1000)
            except TimeoutError:
                pass
            else:
                read = sync_to_async(node_changes_after, thread_sensitive=False)
                changes = await read(node_id=node_id, after=after)
        return JsonResponse({"nodeId": node_id, "connected": True, "changes": changes})
    except Exception as exc:  # every error in the envelope, as the API's exception handler answers
        return _error(exc)
    finally:
        if event is not None and isinstance(raw_node, str):
            bell.unregister(raw_node, event)
