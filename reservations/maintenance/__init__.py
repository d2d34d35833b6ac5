"""Maintenance windows: planned downtime held as bookings, its dry run, and the worker's switch.

`services` (schedule, update, cancel), `selectors` (the dry run `maintenance_plan`,
`maintenance_list`, `maintenance_get`), `toggle` (nodes into maintenance at the start,
out at the end) and `windows` (the reads the placer and BookingRepair name windows with).
"""
