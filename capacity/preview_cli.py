"""The placement preview behind `manage.py capacity --preview` (the seeds' CLI)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TextIO

from django.core.management.base import CommandError

from capacity.cli_device_match import parse_cli_selector
from capacity.selectors.planning import capacity_preview
from core.errors import DomainError
from inventory.choices import SLOT_SHARING
from inventory.models import Pool
from reservations.request.device_match import selector_to_api
from reservations.request.parse import parse_reservation_request


def preview_command(
    tenant_id: str,
    pool_id: str,
    gpus: int,
    duration: str,
    selector: str | None,
    as_json: bool,
    stdout: TextIO | Any,
) -> dict[str, Any]:
    """Build the same request the API takes, run the preview, print a table (or the API's JSON)."""
    body: dict[str, Any] = {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": gpus}],
        "duration": int(duration) if duration.isdigit() else duration,
        "idempotencyKey": "cli-preview",
    }
    try:
        if selector:
            body["devices"][0]["selector"] = selector_to_api(parse_cli_selector(selector))
        request = parse_reservation_request(body)
        from ledger.access import visible_pools

        pool: Pool | None = visible_pools(tenant_id=tenant_id).filter(pk=pool_id).first()
        if pool is None:
            raise CommandError(f"pool {pool_id} not found for tenant {tenant_id}")
        # Whole GPUs are not sold from a fractional pool: preview its atoms instead.
        if pool.sharing == "mig":
            body["devices"][0]["class"] = "gpu.mig"
            request = parse_reservation_request(body)
        elif pool.sharing in SLOT_SHARING:
            body["devices"][0]["class"] = "gpu.slot"
            request = parse_reservation_request(body)
        answer = capacity_preview(request=request, pool=pool)
    except DomainError as exc:
        raise CommandError(exc.message) from exc
    if as_json:
        stdout.write(json.dumps(answer, indent=2))
        return answer
    lines = [
        f"fits: {'yes' if answer['fits'] else 'no'}"
        f"   start: {_local(answer['start'])}   end: {_local(answer['end'])}",
    ]
    if answer["reason"]:
        lines.append(f"reason: {answer['reason']['code']}: {answer['reason']['message']}")
    if answer["preemptible"]:
        p = answer["preemptible"]
        lines.append(f"would displace {p['count']} spot reservation(s), starting at {_local(p['startsAt'])}")
    if answer["candidates"]:
        width = max(len(c["nodeId"]) for c in answer["candidates"])
        lines.append(f"{'rank':>4}  {'node':<{width}}  {'score':>6}  atoms")
        for rank, candidate in enumerate(answer["candidates"], start=1):
            lines.append(
                f"{rank:>4}  {candidate['nodeId']:<{width}}  {candidate['score']:>6.2f}  "
                + ", ".join(candidate["atoms"])
            )
    stdout.write("\n".join(lines))
    return answer


def _local(ms: int | None) -> str:
    """Epoch milliseconds as ISO-8601 in the local time zone, to the second."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="seconds")
