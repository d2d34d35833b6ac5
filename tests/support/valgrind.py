"""valgrind for the instruction counters' tests: its path, or the test skipped (failed where CI needs it)."""

from __future__ import annotations

import os

import pytest

from bench.instructions import valgrind_path


def valgrind_or_skip() -> str:
    path = valgrind_path()
    if path is None:
        if os.environ.get("REQUIRE_VALGRIND") == "1":
            pytest.fail("valgrind is not installed (apt-get install valgrind)")
        pytest.skip("valgrind is not installed (apt-get install valgrind); CI sets REQUIRE_VALGRIND=1")
    return path
