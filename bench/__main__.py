"""`python -m bench` (what `make bench` runs)."""

from bench.run import main

main()
