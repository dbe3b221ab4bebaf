"""A Prometheus histogram for the event loop's hot path, without locks.

``prometheus_client.Histogram.observe`` takes a lock twice per call (the sum
and the bucket): 0.8 us, against 0.13 us here. The daemon observes every
frame it writes, so at 50,000 messages/s that lock was a twentieth of its CPU
(loadtest/replay.py), and the writer observes every message it stores. Only
the event loop's thread observes; the metrics
port's thread only reads, and a copy of the counts is taken whole under the
GIL, so a scrape never sees a bucket run ahead of the one above it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import REGISTRY, CollectorRegistry, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry | None = REGISTRY):
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] == float("inf"):
            bounds.pop()  # +Inf is always there
        if not bounds or bounds != sorted(set(bounds)):
            raise ValueError("buckets must be increasing")
        self.name, self.documentation = name, documentation
        self._bounds = bounds
        self._created = time.time()
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        if registry is not None:
            registry.register(self)

    def observe(self, seconds: float, count: int = 1) -> None:
        """``count`` observations of the same value (a batch's messages), at the cost of one."""
        # bucket i counts seconds <= bound i (Prometheus' "le"); bisect_left finds it
        self._counts[bisect_left(self._bounds, seconds)] += count
        self._sum += seconds * count

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total = list(self._counts), self._sum
        buckets, running = [], 0
        for bound, n in zip([*self._bounds, float("inf")], counts, strict=True):
            running += n
            buckets.append((floatToGoString(bound), running))
        family = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)
        family.samples.append(Sample(f"{self.name}_created", {}, self._created))
        yield family
