"""Helpers for migrations that move a model between apps without touching its table."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

from django.db import migrations
from django.db.migrations.operations.base import Operation


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


def state_only(*operations: Operation) -> migrations.SeparateDatabaseAndState:
    """Change Django's idea of the models without touching the database (a model moving between apps)."""
    return migrations.SeparateDatabaseAndState(state_operations=list(operations))


def taken_over(app_label: str, migration_name: str) -> list[Operation]:
    """The operations of another app's migration, for an app that takes its models over as they are.

    One definition of the moved models' fields and constraints, not a second
    copy that could drift from the tables that migration created.
    """
    module = importlib.import_module(f"{app_label}.migrations.{migration_name}")
    return copy.deepcopy(list(module.Migration.operations))
