"""Settings for server processes started by the tests: the test settings, pointed at the test database."""

import os

from config.settings_test import *  # noqa: F403

DATABASES["default"]["NAME"] = os.environ["TORTURE_DB_NAME"]  # noqa: F405
# A fresh connection per request: a server killed or a database restarted mid-run
# must not leave the next request on a dead persistent connection.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
