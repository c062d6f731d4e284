"""Prometheus text for a /metrics scrape, without the `_created` series.

prometheus_client gives every counter, histogram and summary a `<name>_created` sample (when
the series was first seen, a Unix timestamp). The classic text format has no use for it:
Prometheus stores it as one more series per label set, dashboards never read it, and it looks
like a count to a reader. It is dropped here, from what each render() serialises, rather than
with prometheus_client.disable_created_metrics(): that flips one switch for the whole process,
which would change every other registry in it (an application embedding kvgate, a library's
own), and must be called before the metrics exist.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# The families that carry a `_created` sample (gauges and info never do).
_WITH_CREATED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class _WithoutCreated(Collector):
    def __init__(self, source: Collector) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            if family.type in _WITH_CREATED:
                created = family.name + "_created"
                # A copy: a collector may hand out the same family object on every scrape.
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = [s for s in family.samples if s.name != created]
                family = copy
            yield family


def render_text(source: Collector) -> tuple[bytes, str]:
    """A registry (or any collector) in Prometheus's text format, and its content type."""
    return generate_latest(_WithoutCreated(source)), CONTENT_TYPE_LATEST
