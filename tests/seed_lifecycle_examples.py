"""The seed's two printed lifecycle examples, verbatim (they import from a bare ``scheduler_faults``)."""

SEED_EXAMPLES = {
    "recompute": """\
from scheduler_faults import PagedKV, RecomputeRequest

pool = PagedKV(capacity=4, block_size=2)
request = RecomputeRequest(pool, "r", [10, 11, 12])
assert request.resume()
request.sample(20)
request.sample(21)
request.preempt()
assert len(pool.free) == 4
assert request.resume()
assert request.recomputed_rows == 4
assert pool.read("r") == [10, 11, 12, 20]
request.sample(22)
assert request.outputs == [20, 21, 22]
request.cancel()
assert len(pool.free) == 4
""",
    "ledger": """\
from scheduler_faults import PagedKV, RecomputeRequest, TransferManager

pool = PagedKV(4, 2)
request = RecomputeRequest(pool, "r", [1, 2, 3])
assert request.resume()
manager = TransferManager(pool)
old = manager.begin("r", "room-a")
request.preempt()
assert manager.abort(old, "consumer_failure")
assert len(pool.free) == 0
assert not request.resume()
assert not manager.complete(old)
assert manager.acknowledge_drained(old)
assert len(pool.free) == 4
assert request.resume()
new = manager.begin("r", "room-a")
assert new != old
assert not manager.complete(old)
assert manager.complete(new)
assert manager.read(new) == [1, 2, 3]
manager.release_output(new)
request.cancel()
assert len(pool.free) == 4
""",
}
