"""A scrape of `GET /metrics` through the test client, parsed as Prometheus parses it."""

from __future__ import annotations

from typing import Any

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families


def scrape(client: Client | None = None, **extra: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of one scrape, by sample name: (labels, value)."""
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels` (0 when none matches, as a counter unseen)."""
    found = [v for have, v in samples.get(name, []) if all(have.get(k) == want for k, want in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0.0
