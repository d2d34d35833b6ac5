"""`better-compute`: the tenant's command line over the capacity API.

It speaks HTTP only (`requests`) and never imports the server's Django apps, so
it runs anywhere the API is reachable. `better_compute.cli.main` is the entry
point (`better-compute`, or `python -m better_compute`).
"""

__version__ = "0.1.0"
