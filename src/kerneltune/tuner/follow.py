"""`kerneltune tune --follow URL`: a tuning worker for a fleet's config service.

Runtimes with `KERNELTUNE_REPORT=1` report the keys they ran untuned (`POST /api/v1/misses`).
A follower, on a machine with the fleet's GPU, closes the loop, round after round:

1. asks `GET {URL}/api/v1/misses/{gpu}` for the untuned keys, met by the most processes first;
2. tunes up to `ROUND_KEYS` of them it has not taken before (the tune job's machinery, in its
   own store, each key timed at the row counts its calls were reported with:
   `Job.rows`);
3. publishes the store's current entries for them with the write token
   (`POST {URL}/api/v1/results`), which runtimes then get through the table's ETag;

and, when nothing is queued, looks again after a pause. `once` tunes what is queued at its first
look, then returns. The token is checked before any tuning (an empty publication, which the
service refuses for its emptiness only once the token has passed). A service that is away is
said, one line, and looked for again after the pause (in `once`, it ends the run); entries it
could not take are published at the next round. A key that gets no entry (no candidate passed)
is not taken again by the same follower.

HTTP goes through the runtime's deadline-bounded client (`kerneltune.runtime.sources.send`).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kerneltune import storage
from kerneltune.kernels import REGISTRY, running_hashes
from kerneltune.runtime.sources import Reply, send
from kerneltune.storage import MissReport
from kerneltune.table import Table, table_to_dict

Key = tuple[str, str, int, int]  # kernel, dtype, N, M bucket

#: Keys tuned per round: each round ends by publishing, so the fleet gets the first keys'
#: entries while the rest wait their turn, and the next look sees what was reported since.
ROUND_KEYS = 8
#: Keys asked for at each look (the most-met first).
QUEUE_LIMIT = 100
#: Seconds one request to the service may take in all.
SERVICE_TIMEOUT_S = 30.0
#: Seconds between looks when nothing is queued (or the service is away).
PAUSE_S = 30.0


class FollowError(Exception):
    """The service did not do what was asked: away, or answering `status`. Its text is one
    line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TokenRefused(FollowError):
    """The service refused the write token, or takes no writes."""


@dataclass(frozen=True)
class Published:
    """What the service did with a publication: the keys it stored and those it kept."""

    stored: int
    kept: int


class Service:
    """The config service a follower works for, at `base` (its root URL)."""

    def __init__(self, base: str, token: str, timeout_s: float = SERVICE_TIMEOUT_S) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _away(self, reply: Reply) -> FollowError:
        return FollowError(f"service {self.base}: {reply.why}", reply.status)

    def queued(self, device: str, limit: int = QUEUE_LIMIT) -> list[MissReport]:
        """The device's untuned keys, the most-met first. FollowError where the service does
        not answer with them."""
        url = (f"{self.base}/api/v1/misses/{urllib.parse.quote(device, safe='')}"
               f"?untuned=true&limit={limit}")
        reply = send(url, timeout=self.timeout_s)
        if not reply.ok:
            raise self._away(reply)
        try:
            return [MissReport(str(k["kernel"]), str(k["dtype"]), int(k["n"]), int(k["m"]),
                           int(k["processes"]), tuple(int(r) for r in k["rows"]))
                    for k in json.loads(reply.body)["keys"]]
        except (ValueError, TypeError, KeyError) as e:
            raise FollowError(f"service {self.base}: answered something that is not a list of "
                              f"keys ({type(e).__name__}: {str(e)[:200]})") from None

    def _post_results(self, doc: dict[str, Any]) -> Reply:
        return send(f"{self.base}/api/v1/results", body=doc, token=self.token,
                    timeout=self.timeout_s)

    def _refusal(self, reply: Reply) -> TokenRefused | None:
        if reply.status == 401:
            return TokenRefused(f"service {self.base} refused the write token ({reply.why}): "
                                "give its token with --token or KERNELTUNE_WRITE_TOKEN", 401)
        if reply.status == 403:
            return TokenRefused(f"service {self.base} takes no results ({reply.why}): it has "
                                "no write token configured", 403)
        return None

    def check_token(self, device: str) -> None:
        """Raise TokenRefused unless the service would take results with this token (FollowError
        where it does not answer): an empty publication, refused for its emptiness (422) only
        once the token has passed, since the service authenticates before it reads a body."""
        reply = self._post_results({"device": device, "entries": []})
        if reply.status == 422:
            return
        refusal = self._refusal(reply)
        if refusal is not None:
            raise refusal
        if reply.ok:  # a service that stores nothing of an empty publication will do too
            return
        raise self._away(reply)

    def publish(self, table: Table) -> Published:
        """Post the entries of `table`. TokenRefused for the token, FollowError for the rest."""
        reply = self._post_results(table_to_dict(table))
        refusal = self._refusal(reply)
        if refusal is not None:
            raise refusal
        if not reply.ok:
            raise self._away(reply)
        try:
            answer = json.loads(reply.body)
            return Published(len(answer["stored"]), len(answer["kept"]))
        except (ValueError, TypeError, KeyError):
            return Published(len(table.entries), 0)


def current_entries_at(store_url: str | None, device: str, keys: Sequence[Key]) -> Table | None:
    """The store's table for `device`, its entries narrowed to those at `keys` measured on the
    running kernel code; None where it has none."""
    running = running_hashes()
    wanted = set(keys)
    engine = storage.make_engine(store_url)
    try:
        with storage.session_factory(engine)() as session:
            try:
                held = storage.export_table(session, device)
            except storage.UnknownDeviceError:
                return None
    finally:
        engine.dispose()
    held.entries = [e for e in held.entries
                    if e.key in wanted and running.get(e.kernel) == e.kernel_hash]
    return held if held.entries else None


#: Tunes the keys of a round in the store; says whether the job ran to its end (False: stopped).
Tune = Callable[[list[MissReport]], bool]


@dataclass
class Follower:
    """Tunes what the fleet met untuned on `device` and publishes it to `service` (see the
    module docstring); `tune` runs a round's job in the store at `store_url`, `say` shows a
    line, `stop` ends the pauses and the run."""

    service: Service
    device: str
    tune: Tune
    store_url: str | None
    say: Callable[[str], None]
    once: bool = False
    pause_s: float = PAUSE_S
    stop: threading.Event = field(default_factory=threading.Event)
    #: Keys this follower has tuned (or found unregistered): not taken again.
    taken: set[Key] = field(default_factory=set)
    #: Keys tuned whose entries the service has not taken yet.
    unpublished: set[Key] = field(default_factory=set)

    def run(self) -> None:
        """Work until stopped (or, `once`, until what was queued at the first look is done).
        FollowError where the token is refused, or, `once`, where the service is away."""
        self.service.check_token(self.device)
        self.say(f"following {self.service.base} for {self.device}"
                 + (": what is queued now" if self.once else ""))
        first: list[MissReport] | None = None
        idle = False  # said so: said again only after a round
        while not self.stop.is_set():
            if self.once and first is not None:
                queued: list[MissReport] | None = first
            else:
                queued = self._look()
                first = queued if first is None else first
            fresh = self._fresh(queued or [])
            if fresh:
                idle = False
                finished = self.tune(fresh)
                self.taken.update(q.key for q in fresh)
                self.unpublished.update(q.key for q in fresh)
                self._publish()
                if not finished:  # stopped (Ctrl-C, the time budget) or failed
                    self.stop.set()
                    return
                continue
            self._publish()  # what an earlier round could not
            if self.once:
                if not self.taken:
                    self.say(f"nothing queued for {self.device}")
                return
            if queued is not None and not idle:
                self.say(f"nothing new queued for {self.device}: looking again every "
                         f"{self.pause_s:g} s (Ctrl-C stops)")
                idle = True
            self.stop.wait(self.pause_s)

    def _look(self) -> list[MissReport] | None:
        """The service's queue; None, said, where the service is away (FollowError, `once`)."""
        try:
            return self.service.queued(self.device)
        except FollowError as e:
            if self.once:
                raise
            self.say(f"{e}; looking again in {self.pause_s:g} s")
            return None

    def _fresh(self, queued: list[MissReport]) -> list[MissReport]:
        """The round's keys: up to `ROUND_KEYS` of `queued` not taken before, of registered
        kernels (another is said once, and taken)."""
        fresh = []
        for q in queued:
            if q.key in self.taken:
                continue
            if q.kernel not in REGISTRY:
                self.say(f"skipping {q}: not a registered kernel here")
                self.taken.add(q.key)
                continue
            fresh.append(q)
        return fresh[:ROUND_KEYS]

    def _publish(self) -> None:
        """Post the store's entries for the unpublished keys. Where the service is away or
        busy they wait for the next round (`once`: FollowError); where it refuses them (a 4xx),
        they are said and dropped; TokenRefused goes up."""
        if not self.unpublished:
            return
        held = current_entries_at(self.store_url, self.device, sorted(self.unpublished))
        if held is None:
            self.unpublished.clear()
            return
        try:
            done = self.service.publish(held)
        except TokenRefused:
            raise
        except FollowError as e:
            if self.once:
                raise FollowError(f"{e}; the {len(held.entries)} entries stay in the store, "
                                  "and the next run publishes them", e.status) from None
            if e.status is not None and 400 <= e.status < 500 and e.status != 429:
                self.say(f"{e}; {len(held.entries)} entries not published")
                self.unpublished.clear()
            else:
                self.say(f"{e}; publishing {len(held.entries)} entries at the next round")
            return
        self.unpublished.clear()
        self.say(f"published {len(held.entries)} entries to {self.service.base}: {done.stored} "
                 f"stored, {done.kept} kept (the service had one as fast)")
