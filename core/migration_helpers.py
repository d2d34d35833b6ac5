"""Helpers for migrations that move a model between apps without touching its table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def rename_content_type(old_app: str, new_app: str, *models: str) -> Callable[[Any, Any], None]:
    """A RunPython step: give the moved models' content types (and so their permissions) the new app label.

    Without it Django would create fresh content types under the new label and
    leave operators' model permissions pointing at the old ones.
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        content_type = apps.get_model("contenttypes", "ContentType")
        for model in models:
            if content_type.objects.filter(app_label=new_app, model=model).exists():
                continue
            content_type.objects.filter(app_label=old_app, model=model).update(app_label=new_app)

    return forward


def rename_content_type_back(old_app: str, new_app: str, *models: str) -> Callable[[Any, Any], None]:
    """The reverse of `rename_content_type`, so migrating backwards restores the old labels."""
    return rename_content_type(new_app, old_app, *models)
