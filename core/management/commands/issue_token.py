"""`issue_token --tenant T --role R [--name N] [--expires 30d]`; `--platform` for platform roles.

A node-agent token says which nodes it reports for: `--pool POOL_ID` (the
pool's nodes), `--node NODE_ID` (one node) or, on purpose, `--all-nodes`.
"""

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

NODE_SCOPE_FLAGS = "--pool, --node or --all-nodes"


class Command(BaseCommand):
    help = "Create an API token and print it once (only its SHA-256 is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        scope = parser.add_mutually_exclusive_group(required=True)
        scope.add_argument("--tenant", help="the tenant a viewer or member token acts for")
        scope.add_argument(
            "--platform",
            action="store_true",
            help="bind an operator, node-agent or metrics token to the platform",
        )
        parser.add_argument("--role", required=True, choices=Role.values)
        nodes = parser.add_mutually_exclusive_group()
        nodes.add_argument("--pool", metavar="POOL_ID", help="node-agent: report only for this pool's nodes")
        nodes.add_argument("--node", metavar="NODE_ID", help="node-agent: report only for this node")
        nodes.add_argument(
            "--all-nodes", action="store_true", help="node-agent: report for every node of the platform"
        )
        parser.add_argument("--name", default="", help="a label to tell tokens apart")
        parser.add_argument("--expires", help="lifetime such as 30d, 12h or P90D (default: never)")

    def handle(self, *args: Any, **options: Any) -> None:
        role: str = options["role"]
        tenant_id: str | None = options["tenant"]
        pool_id: str = options["pool"] or ""
        node_id: str = options["node"] or ""
        if options["platform"] and role not in PLATFORM_ROLES:
            raise CommandError(
                f"--platform is for operator, node-agent and metrics tokens; a {role} needs --tenant"
            )
        if tenant_id is not None and role in PLATFORM_ROLES:
            raise CommandError(f"a {role} token is bound to the platform: use --platform, not --tenant")
        narrowed = bool(pool_id or node_id or options["all_nodes"])
        if role == Role.NODE_AGENT and not narrowed:
            # An agent that can rewrite every node must be asked for, never the default.
            raise CommandError(f"a node-agent token needs {NODE_SCOPE_FLAGS}: the nodes it reports for")
        if role != Role.NODE_AGENT and narrowed:
            raise CommandError(f"{NODE_SCOPE_FLAGS} are for node-agent tokens, not a {role}")
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
                scope_pool_id=pool_id,
                scope_node_id=node_id,
            )
        except InvalidInput as exc:
            raise CommandError(exc.message) from exc
        scope = tenant_id or "platform"
        if role == Role.NODE_AGENT:
            scope += f", pool {pool_id}" if pool_id else f", node {node_id}" if node_id else ", every node"
        expiry = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "never expires"
        # The details go to stderr so `TOKEN=$(manage.py issue_token ...)` captures the token alone.
        self.stderr.write(f"{token.pk}: {role}@{scope}, {expiry}. Shown once; store it now.")
        self.stdout.write(secret)
