"""Settings for the test suite: the real settings with a fixed development key."""

import os

os.environ.setdefault("SECRET_KEY", "test-only-secret-key")

from config.settings import *  # noqa: F403
