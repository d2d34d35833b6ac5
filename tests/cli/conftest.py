"""The CLI tests' fixtures: a pool with one eight-H100 node, and the CLI configured for its owner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.services import token_issue
from inventory.models import Node, Pool
from reservations.rollups.recount import rollup_rebuild
from tests.cli.runner import Cli


@pytest.fixture
def pool(gpu_node: Node) -> Pool:
    """`h100-east` with one schedulable eight-H100 node, its rollup counted."""
    rollup_rebuild(pool_id=gpu_node.pool_id)
    return gpu_node.pool


@pytest.fixture
def cli(pool: Pool, live_server: Any, tmp_path: Path) -> Cli:
    _, secret = token_issue(tenant_id="acme", role="member", name="cli test")
    return Cli(tmp_path, live_server.url, secret, "acme")
