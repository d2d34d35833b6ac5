"""A `reservations/create` passes through few modules, and never calls back into one it left.

The create is the hot path: a request that wanders through many modules, or
that calls from a module back into one still waiting below it on the stack (a
callback up the stack: `services -> request -> services`), is a path whose
order nobody can read from one place. Measured here on a real create over
HTTP, its delivery to the node after the response included (the
`DeliverAfterResponse` middleware holds it until the test client closes the
response, inside the request):

* at most `MAX_MODULES` distinct project modules are entered, `core`'s helpers
  (and the metrics, which only watch) not counted. A module is one job of an app: a top-level module
  (`reservations.services`, `ledger.services.quota`) or a subpackage, whose files are
  the parts of one job (`reservations.placer`: plan, filters, commit);
* no call enters a project module (outside `core`) that is already on the
  stack below another one: neither an app's job nor a single file is ever
  called back while it waits on a call it made. `core` is transparent (a call
  through one of its helpers, the RPC wrapper or the clock, and back is no
  come-back), and a module calling its own helpers is none either.

The path is recorded with `sys.setprofile`: the Django test client runs the
view, and the delivery after the response, on the calling thread. On failure
the message lists the modules and the path, file by file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
from rest_framework.test import APIClient

from inventory.models import Node, Pool
from ledger.models import QuotaMode
from reservations.models import Delivery
from tests.support.api import post, reservation_body
from tests.support.factories import QuotaUsageFactory

# The project's packages; `core` is the shared kernel every app may lean on.
PROJECT = ("core", "inventory", "ledger", "reservations", "capacity", "operations", "worker", "fleets")
MAX_MODULES = 10
# A create that displaces spot reservations was first refused in plain mode, and a refusal names
# the maintenance windows that hold the pool's nodes then (`reservations.maintenance`).
MAX_MODULES_DISPLACING = MAX_MODULES + 1


def _project_module(frame: FrameType) -> str | None:
    module = frame.f_globals.get("__name__", "")
    return module if module.split(".")[0] in PROJECT else None


# The metrics only watch the path (a middleware around it, the placer's observers): like `core`,
# they are no step of it, and counting them would make every create look one module longer.
OBSERVING = ("operations.metrics",)


def _is_core(module: str) -> bool:
    return module.split(".")[0] == "core" or module.startswith(OBSERVING)


def unit_of(module: str) -> str:
    """The module as a job of its app: its top-level module or subpackage (`reservations.placer`)."""
    return ".".join(module.split(".")[:2])


def _runs(modules: list[str]) -> list[str]:
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


@dataclass
class PathRecorder:
    """A profile function: one entry per live frame (its project module or None), and what it saw."""

    stack: list[str | None] = field(default_factory=list)
    # Every project file entered, in order, each time it changes (the path's shape).
    sequence: list[str] = field(default_factory=list)
    comebacks: list[str] = field(default_factory=list)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = _project_module(frame)
            if module is not None:
                self._entered(module, frame.f_code.co_name)
            self.stack.append(module)
        elif event == "return" and self.stack:
            # Frames live when the profile was installed return without an entry: nothing to pop.
            self.stack.pop()

    def _entered(self, module: str, function: str) -> None:
        if not self.sequence or self.sequence[-1] != module:
            self.sequence.append(module)
        if _is_core(module):
            return
        below = [m for m in self.stack if m is not None and not _is_core(m)]
        # A come-back between files, or between an app's jobs (a subpackage's files are one job).
        for name, level in ((module, below), (unit_of(module), [unit_of(m) for m in below])):
            if level and level[-1] != name and name in level:
                self.comebacks.append(f"{' -> '.join(_runs(level))} -> {module}.{function}")

    def modules(self) -> list[str]:
        """The distinct non-core project modules (jobs) entered, in the order first entered."""
        return list(dict.fromkeys(unit_of(m) for m in self.sequence if not _is_core(m)))


def _create(client: APIClient, pool: Pool, key: str, *, gpus: int = 2, **extra: Any) -> Any:
    return post(client, "reservations/create", reservation_body(pool, "acme", key, gpus=gpus, **extra))


def _measured(client: APIClient, pool: Pool) -> tuple[Any, PathRecorder]:
    recorder = PathRecorder()
    previous = sys.getprofile()
    sys.setprofile(recorder)
    try:
        created = _create(client, pool, "measured")
    finally:
        sys.setprofile(previous)
    assert created.status_code == 201, created.json()
    # The delivery ran inside the request (after its response): the outbox is empty again.
    assert not Delivery.objects.exists()
    return created, recorder


def _assert_path(recorder: PathRecorder, *, most: int = MAX_MODULES) -> None:
    modules = recorder.modules()
    path = "\n  ".join(recorder.sequence)
    assert len(modules) <= most, f"{len(modules)} modules: {modules}\nthe path:\n  {path}"
    comebacks = "\n  ".join(dict.fromkeys(recorder.comebacks))
    assert not comebacks, f"calls back into a module below:\n  {comebacks}\nthe path:\n  {path}"


@pytest.mark.django_db(transaction=True)
def test_a_create_over_http_passes_few_modules_and_never_calls_back_into_one_it_left(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    # A first create imports whatever a create imports lazily, so the one measured is the steady state.
    assert _create(owner_client, owned_pool, "warm-up").status_code == 201
    _, recorder = _measured(owner_client, owned_pool)
    _assert_path(recorder)


@pytest.mark.django_db(transaction=True)
def test_a_create_that_displaces_spot_reservations_never_calls_back_into_a_module_it_left(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    # Spot reservations hold all eight GPUs: the create gives them notice (the cut, the notice).
    assert _create(owner_client, owned_pool, "spot-a", spot=True).status_code == 201
    assert (
        post(
            owner_client,
            "reservations/create",
            reservation_body(owned_pool, "acme", "spot-b", gpus=6, spot=True),
        ).status_code
        == 201
    )
    created, recorder = _measured(owner_client, owned_pool)
    assert created.json()["state"] == "scheduled"  # it starts when the notice runs out
    _assert_path(recorder, most=MAX_MODULES_DISPLACING)


@pytest.mark.django_db(transaction=True)
def test_a_create_under_a_concurrent_quota_never_calls_back_into_a_module_it_left(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    QuotaUsageFactory.create(
        pool=owned_pool, tenant_id="acme", resource="gpu", max=8, mode=QuotaMode.CONCURRENT
    )
    assert _create(owner_client, owned_pool, "warm-up").status_code == 201
    _, recorder = _measured(owner_client, owned_pool)
    # The ledger reads the tenant's peak straight from the reservations' reads (`holdings_peaks`).
    _assert_path(recorder)
