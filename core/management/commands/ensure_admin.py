"""`ensure_admin`: the Django superuser `admin`, created once with a generated password."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils.crypto import get_random_string

ADMIN_USER = "admin"
ADMIN_URL = "http://127.0.0.1:8000/admin/"


def admin_login_path() -> Path:
    # Git-ignored; kept next to the project so `make run` prints the same login every time.
    return Path(settings.BASE_DIR) / ".admin-login"


class Command(BaseCommand):
    help = "Create the superuser 'admin' with a generated password if it does not exist; print the login."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--url", default=ADMIN_URL, help="Where the admin is served, for the message.")

    def handle(self, *args: Any, **options: Any) -> None:
        admin_url = options["url"]
        users = get_user_model()
        path = admin_login_path()
        if not users.objects.filter(username=ADMIN_USER).exists():
            password = get_random_string(24)
            users.objects.create_superuser(username=ADMIN_USER, email="", password=password)
            path.write_text(password + "\n")
            path.chmod(0o600)
        elif path.exists():
            password = path.read_text().strip()
        else:
            # The user exists but its password was set elsewhere: we do not reset it.
            self.stdout.write(
                f"Admin: {admin_url}  user: {ADMIN_USER}  password: (set elsewhere, not stored)"
            )
            return
        self.stdout.write(f"Admin: {admin_url}  user: {ADMIN_USER}  password: {password}")
