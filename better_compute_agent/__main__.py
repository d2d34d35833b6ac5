"""`python -m better_compute_agent`: the same as `better-compute-agent`."""

import sys

from better_compute_agent.cli import main

sys.exit(main())
