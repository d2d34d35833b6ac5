"""The node actions the node console offers: each one's form, its words and its service call.

Every call is one `operations.services` node action; `nodes` renders the
reason page, calls it for each node and says what moved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms

from core.admin import OptionalReasonForm, ReasonForm
from inventory.models import Node, TaintEffect


class TaintForm(forms.Form):
    key = forms.CharField(max_length=253)
    value = forms.CharField(max_length=253, required=False)
    effect = forms.ChoiceField(choices=TaintEffect.choices, initial=TaintEffect.NO_SCHEDULE)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class UntaintForm(forms.Form):
    key = forms.CharField(max_length=253)
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


class DeviceHealthForm(forms.Form):
    healthy = forms.TypedChoiceField(
        choices=[("1", "healthy: may be booked"), ("0", "unhealthy: keep off new bookings")],
        coerce=lambda v: v == "1",
        widget=forms.RadioSelect,
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))


@dataclass(frozen=True)
class NodeOperation:
    """One node action: its page title, its form and the service call."""

    title: str
    verb: str
    form: type[forms.Form]
    call: Callable[[Node, dict[str, Any], str], Any]
    danger: bool = False


def node_operations() -> dict[str, NodeOperation]:
    """Every node action by its URL name: its page's title, its message's verb, its form, its call."""
    # Imported when used: the services module is the one place node state is written.
    from operations import services as ops

    return {
        "cordon": NodeOperation(
            "Cordon nodes",
            "Cordoned",
            ReasonForm,
            lambda n, d, a: ops.node_cordon(node=n, reason=d["reason"], actor=a),
            danger=True,
        ),
        "uncordon": NodeOperation(
            "Uncordon nodes",
            "Uncordoned",
            OptionalReasonForm,
            lambda n, d, a: ops.node_uncordon(node=n, actor=a, reason=d["reason"]),
        ),
        "taint": NodeOperation(
            "Taint nodes",
            "Tainted",
            TaintForm,
            lambda n, d, a: ops.node_taint(
                node=n, key=d["key"], value=d["value"], effect=d["effect"], reason=d["reason"], actor=a
            ),
            danger=True,
        ),
        "untaint": NodeOperation(
            "Remove a taint",
            "Untainted",
            UntaintForm,
            lambda n, d, a: ops.node_untaint(node=n, key=d["key"], actor=a, reason=d["reason"]),
        ),
        "maintenance-on": NodeOperation(
            "Put nodes in maintenance",
            "Put in maintenance",
            ReasonForm,
            lambda n, d, a: ops.node_set_maintenance(node=n, on=True, reason=d["reason"], actor=a),
            danger=True,
        ),
        "maintenance-off": NodeOperation(
            "Take nodes out of maintenance",
            "Took out of maintenance",
            OptionalReasonForm,
            lambda n, d, a: ops.node_set_maintenance(node=n, on=False, reason=d["reason"], actor=a),
        ),
    }


OPERATION_LABELS = {
    "cordon": "Cordon",
    "uncordon": "Uncordon",
    "taint": "Taint",
    "untaint": "Untaint",
    "maintenance-on": "Maintenance on",
    "maintenance-off": "Maintenance off",
}
