"""Capacity owns no tables: it reads the ledger's counters and the bookings below it."""
