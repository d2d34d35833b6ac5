"""`GET /metrics`: the service as Prometheus sees it.

What the database holds (capacity, nodes, the worker, the outbox, waits,
audited events) is read at scrape time (`scrape`, `events`), so every gunicorn
worker and every replica answers the same numbers; what only a process sees
(request latency, create outcomes, the placer's time) is counted in
prometheus_client's multiprocess mode (`process`). The metrics write nothing.
"""
