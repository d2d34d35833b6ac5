"""Helpers for migrations: moving a model between apps without touching its table, and trigger SQL.

The SQL builders return text that applied migrations have run: they must not
change, and a trigger of another shape gets a builder of its own.
"""

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


def model_created_by(app_label: str, migration_name: str, model_name: str) -> migrations.CreateModel:
    """A copy of the `CreateModel` of `model_name` in another app's migration: a model moving in as made."""
    for operation in taken_over(app_label, migration_name):
        if isinstance(operation, migrations.CreateModel) and operation.name == model_name:
            return operation
    raise LookupError(f"{app_label}.{migration_name} creates no model {model_name}")


def statement_triggers(function: str, table: str) -> str:
    """SQL: insert, update and delete triggers running `function` once a statement, with transition tables."""
    return f"""CREATE TRIGGER {function}_insert AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}();
CREATE TRIGGER {function}_update AFTER UPDATE ON {table}
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
CREATE TRIGGER {function}_delete AFTER DELETE ON {table}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}();"""


def row_trigger_on_change(trigger: str, table: str, column: str, function: str) -> str:
    """SQL: a row trigger that runs `function` after an update of `table` gives `column` another value."""
    return f"""CREATE TRIGGER {trigger} AFTER UPDATE OF {column} ON {table}
    FOR EACH ROW WHEN (OLD.{column} IS DISTINCT FROM NEW.{column})
    EXECUTE FUNCTION {function}();"""
