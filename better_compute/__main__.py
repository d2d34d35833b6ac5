"""`python -m better_compute`: the same as the `better-compute` console script."""

import sys

from better_compute.cli import main

sys.exit(main())
