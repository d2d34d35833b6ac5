"""What the tests share, one definition each: factories, the API helpers, bookings and rollup readers,
clock constants, threads with their own connections, node reports, commands (in-process and as a child
process), the parsers' property checks, and the torture machinery.

Fixtures stay in the `conftest.py` files; this package holds plain functions and classes.
"""
