"""A per-client request budget for the routes anyone may call that write (runtimes' reports).

A token bucket per client address, in the worker's memory: `rate` requests a second on
average, bursts of up to `burst`. Each worker keeps its own, so N workers allow N times the
rate; the bound is on what one client can make the store write, not an exact quota.
"""

from __future__ import annotations

import math
import threading
import time


class RateLimit:
    """Token buckets by client; `take(client)` spends one token, or says how long to wait."""

    #: Clients remembered; past it the fullest buckets (idle clients) are forgotten.
    MAX_CLIENTS = 10_000

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, client: str) -> float:
        """0 when `client` may go on (a token spent), else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                self._forget_idle()
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1 - tokens) / self.rate

    def _forget_idle(self) -> None:
        if len(self._buckets) > self.MAX_CLIENTS:
            now = time.monotonic()
            self._buckets = {c: b for c, b in self._buckets.items()
                             if b[0] + (now - b[1]) * self.rate < self.burst}


def retry_after(seconds: float) -> str:
    """A `Retry-After` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
