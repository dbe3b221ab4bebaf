"""Times the cyclic garbage collector's passes into a Prometheus histogram.

A full pass (generation 2) walks every object the collector tracks and stops
the event loop for as long: every request or message that arrives meanwhile
waits for it. Both kinds of process freeze what start-up made
(``gc.freeze()``), so that full passes walk only what came since.
"""

import gc
import time

from prometheus_client import Histogram

BUCKETS = (.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1)


def watch(pauses: Histogram) -> None:
    """``pauses`` has one label, the generation."""
    by_generation = [pauses.labels(str(g)) for g in range(3)]
    started = 0.0

    def on_gc(phase: str, info: dict) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started)

    gc.callbacks.append(on_gc)
