"""The fleet-scale benchmark: `make bench` (`python -m bench`); see `bench.run`."""
