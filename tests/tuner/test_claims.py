"""Key claims: one holder at a time, stale and dead holders taken over, races on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from kerneltune import storage
from kerneltune.tuner import claims


@pytest.fixture
def engine(sqlite_url):
    engine = storage.make_engine(sqlite_url)
    claims.create_claims_table(engine)
    yield engine
    engine.dispose()


def test_one_holder_until_released(engine):
    assert claims.try_claim(engine, "k", "a", ttl_s=60)
    assert claims.try_claim(engine, "k", "a", ttl_s=60)  # re-entrant for its owner
    assert not claims.try_claim(engine, "k", "b", ttl_s=60)
    assert claims.holder(engine, "k") == "a"
    claims.release(engine, "k", "b")  # not b's to release
    assert claims.holder(engine, "k") == "a"
    claims.release(engine, "k", "a")
    assert claims.holder(engine, "k") is None
    assert claims.try_claim(engine, "k", "b", ttl_s=60)


def test_stale_claim_is_taken_over_and_heartbeats_keep_it(engine):
    assert claims.try_claim(engine, "k", "a", ttl_s=0.3)
    time.sleep(0.2)
    assert claims.heartbeat(engine, ["a"]) == 1
    time.sleep(0.2)
    assert not claims.try_claim(engine, "k", "b", ttl_s=0.3)  # a beat 0.2 s ago
    time.sleep(0.4)
    assert claims.try_claim(engine, "k", "b", ttl_s=0.3)
    assert claims.holder(engine, "k") == "b"
    assert claims.heartbeat(engine, ["a"]) == 0


def test_claim_of_a_dead_process_on_this_host_is_taken_at_once(engine):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    host_owner = claims.process_owner()
    dead_owner = host_owner.replace(host_owner.split(":")[1], dead.stdout.strip(), 1) + "/0"
    assert claims.owner_died_here(dead_owner)
    assert not claims.owner_died_here(host_owner + "/0")  # this very process
    assert not claims.owner_died_here("elsewhere:1:abc/0")
    assert claims.try_claim(engine, "k", dead_owner, ttl_s=3600)
    assert claims.claim(engine, "k", "me/0", ttl_s=3600)
    assert claims.holder(engine, "k") == "me/0"


@pytest.mark.postgres
def test_concurrent_claims_on_postgres_have_one_winner(pg_url):
    engine = storage.make_engine(pg_url, pool_size=16)
    try:
        claims.create_claims_table(engine)
        for key in range(5):
            barrier, won = threading.Barrier(8), []

            def contend(i: int, key: int = key, barrier=barrier, won=won) -> None:
                barrier.wait()
                if claims.try_claim(engine, f"key{key}", f"owner{i}", ttl_s=60):
                    won.append(i)

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(won) == 1
            assert claims.holder(engine, f"key{key}") == f"owner{won[0]}"
    finally:
        engine.dispose()
