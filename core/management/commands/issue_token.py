"""`issue_token --tenant T --role R [--name N] [--expires 30d]`; `--platform` for operators and agents."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.durations import DurationError, parse_duration
from core.errors import InvalidInput
from core.models import Role
from core.services import PLATFORM_ROLES, token_issue

# Long-lived tokens for node agents and automation are normal; a decade is not.
MAX_EXPIRY_SECONDS = 5 * 366 * 86400


class Command(BaseCommand):
    help = "Create an API token and print it once (only its SHA-256 is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--tenant", help="the tenant a viewer or member token acts for")
        scope.add_argument(
            "--platform", action="store_true", help="bind an operator or node-agent token to the platform"
        )
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--name", default="", help="a label to tell tokens apart")
        parser.add_argument("--expires", help="lifetime such as 30d, 12h or P90D (default: never)")

    def handle(self, *args: Any, **options: Any) -> None:
        role: str = options["role"]
        tenant_id: str | None = options["tenant"]
        if options["platform"] and role not in PLATFORM_ROLES:
            raise CommandError(f"--platform is for operator and node-agent tokens; a {role} needs --tenant")
        if tenant_id is not None and role in PLATFORM_ROLES:
            raise CommandError(f"a {role} token is bound to the platform: use --platform, not --tenant")
        expires_in = None
        if options["expires"]:
            try:
                expires_in = parse_duration(options["expires"], maximum=MAX_EXPIRY_SECONDS)
            except DurationError as exc:
                raise CommandError(f"--expires: {exc}") from exc
        try:
            token, secret = token_issue(
                tenant_id=tenant_id,
                role=role,
                name=options["name"],
                expires_in_seconds=expires_in,
                actor=f"cli:{getpass.getuser()}",
            )
        except InvalidInput as exc:
            raise CommandError(exc.message) from exc
        scope = tenant_id or "platform"
        expiry = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "never expires"
        # The details go to stderr so `TOKEN=$(manage.py issue_token ...)` captures the token alone.
        self.stderr.write(f"{token.pk}: {role}@{scope}, {expiry}. Shown once; store it now.")
        self.stdout.write(secret)
