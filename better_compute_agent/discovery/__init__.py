"""Host discovery: what a GPU host has (a snapshot), and the node report the service takes from it.

`nvml.NvmlSource` reads a live host through NVML, /proc and /sys; `snapshot.SnapshotSource`
reads a snapshot file, for hosts without NVML and for tests; `report` turns either into
the node report and into the device map that container device injection needs.
"""
