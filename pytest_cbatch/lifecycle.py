"""KV lifecycle conformance: Hypothesis state machines run against an independent oracle.

Each factory takes an implementation namespace ``impl`` (a module or any object)
that exposes some of ``PagedKV``, ``RecomputeRequest`` and ``TransferManager``
with the constructors and methods of ``pytest_cbatch.reference.scheduler_faults``.
It returns a ``RuleBasedStateMachine`` subclass that drives the implementation
and an oracle side by side and checks every clause of ``LIFECYCLE_CLAUSES``
after each step. The oracle below is written from the lifecycle contract
alone; it must never import or mirror the reference, so that the two can
disagree. It observes implementations only through their public API: the
capacity it constructed the pool with, ``pool.free`` and ``pool.read``, plus
the request and transfer methods and attributes the contract names.

Implementations are held to the reference's conventions where the contract
needs a shape: ``append``/``resume``/``sample``/``complete``/``abort``/
``acknowledge_drained`` return bools, ``begin`` returns a key or None,
``read`` of an unpublished transfer raises, request ``state`` strings are
queued/active/preempted/cancelled, and emissions are ``events`` dicts.

Every step records a line of runnable Python with ``hypothesis.note``, so a
falsifying example prints as a replayable snippet, and every failure raises
``LifecycleViolation`` whose message starts with the clause id::

    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(allocator_machine(my_impl), settings=lifecycle_settings())
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import note
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

__all__ = [
    "ABORT_REASONS",
    "LIFECYCLE_CLAUSES",
    "MACHINES",
    "MIN_STEPS",
    "PARTS",
    "LifecycleViolation",
    "allocator_machine",
    "lifecycle_settings",
    "missing_parts",
    "recompute_machine",
    "transfer_machine",
]

LIFECYCLE_CLAUSES: dict[str, str] = {
    "lifecycle.page_conservation": (
        "Every page is free or held by an owner or pin, never both or neither: len(pool.free) equals "
        "capacity minus the pages in use, and the free list has no duplicates."
    ),
    "lifecycle.read_matches_history": (
        "pool.read(owner) returns exactly the rows appended to that owner and the prefix it forked."
    ),
    "lifecycle.append_atomic": (
        "append() writes every row and returns True, or returns False and changes nothing, exactly when "
        "the free pages (copy-on-write page included) cannot cover it."
    ),
    "lifecycle.fork_shares": (
        "fork() gives the new owner the source's rows, partial tail included, without allocating a page."
    ),
    "lifecycle.cow_isolation": (
        "Appending into a shared or pinned partial tail copies it first: no other owner's rows change."
    ),
    "lifecycle.pin_retains": (
        "pin() allocates nothing; pinned pages stay allocated after every owner releases them and are "
        "freed by the last unpin()."
    ),
    "lifecycle.owner_names": (
        "create() accepts a name that is not live and raises ValueError for a live one; append/read/"
        "fork/pin/release accept live owners and raise KeyError for unknown ones; a refused call changes "
        "nothing."
    ),
    "lifecycle.teardown_frees_all": (
        "After every request is cancelled, every transfer released or drained and every owner and pin "
        "dropped, all pages are free."
    ),
    "lifecycle.request_state": (
        "A request is queued until its first resume, active while it owns pages, preempted after "
        "preempt(), cancelled for good after cancel()."
    ),
    "lifecycle.active_rows": "While a request is active, pool.read(owner) == prompt + outputs[:-1].",
    "lifecycle.replay_no_refeed": (
        "resume() rebuilds exactly prompt + outputs[:-1]: the pending sample is not fed again and no "
        "output is emitted again."
    ),
    "lifecycle.replay_atomic": (
        "resume() succeeds exactly when every page of the committed prefix can be allocated; a failed "
        "resume returns False, keeps the state, leaks no page and emits nothing."
    ),
    "lifecycle.decode_atomic": (
        "sample() commits the pending row before recording the new output; if that allocation fails it "
        "returns False, records and emits nothing and leaks no page."
    ),
    "lifecycle.outputs_append_only": (
        "outputs grow by exactly one token per successful sample() and never repeat, reorder or vanish."
    ),
    "lifecycle.emission_events": (
        "events holds one {'event': 'emit', 'index': i, 'token': outputs[i]} per output, in order; "
        "replay and failed calls add no emission."
    ),
    "lifecycle.preempt_keeps_history": (
        "preempt() frees the request's pages and keeps its prompt and outputs."
    ),
    "lifecycle.recompute_count": (
        "recomputed_rows grows by len(prompt + outputs[:-1]) on each successful resume after a "
        "preemption and by nothing else."
    ),
    "lifecycle.cancel_idempotent": (
        "cancel() frees the request's pages; repeating it neither raises nor changes anything, and a "
        "cancelled request never resumes."
    ),
    "lifecycle.snapshot_published": (
        "After complete(key), read(key) returns the source's rows as they were at begin(), whatever "
        "happened to the source since."
    ),
    "lifecycle.unpublished_unreadable": (
        "read(key) raises for every key that is not published: in flight, aborted, drained, released, "
        "rejected or unknown."
    ),
    "lifecycle.begin_rollback": (
        "begin() returns None when its room is busy or the destination cannot be reserved, and then "
        "leaves no pin or page behind."
    ),
    "lifecycle.key_monotonic": (
        "Each key begin() returns exceeds every earlier key by at least one plus the number of failed "
        "reservations in between."
    ),
    "lifecycle.room_exclusive": (
        "A room holds at most one live transfer; it is reusable once that transfer is drained or its "
        "output released."
    ),
    "lifecycle.abort_retains": (
        "abort() of an in-flight transfer returns True and keeps its source and destination pages "
        "allocated until acknowledge_drained(key)."
    ),
    "lifecycle.drain_frees": (
        "acknowledge_drained() of an aborted transfer and release_output() of a published one free the "
        "pages nothing else holds (and acknowledge_drained returns True)."
    ),
    "lifecycle.callback_fencing": (
        "complete/abort need an in-flight key, acknowledge_drained an aborted one, release_output a "
        "published one; a duplicate, stale, lost-race or unknown key changes nothing, and complete, abort "
        "and acknowledge_drained return False for it (True when they apply)."
    ),
    "lifecycle.abort_reason": (
        "abort() accepts exactly cancelled, timeout, producer_failure and consumer_failure; any other "
        "reason raises ValueError and changes nothing."
    ),
}

PARTS: dict[str, str] = {
    "allocator": "PagedKV",
    "recompute": "RecomputeRequest",
    "transfer": "TransferManager",
}

ABORT_REASONS = ("cancelled", "timeout", "producer_failure", "consumer_failure")

MIN_STEPS = 80
"""Floor for ``stateful_step_count``: replay and drain bugs need long histories, and Hypothesis
ends a share of its runs early, so a profile's usual 50 steps would leave the machines thin."""

_UNKNOWN_KEY = 10**9
_CHOICE_RANGE = 8
_TOKENS = st.lists(st.integers(0, 99), min_size=1, max_size=5)


class LifecycleViolation(AssertionError):
    """A lifecycle clause failed; ``clause`` is its id and the message starts with ``[clause]``."""

    def __init__(self, clause: str, message: str) -> None:
        super().__init__(f"[{clause}] {message}")
        self.clause = clause


def missing_parts(impl: object) -> dict[str, str]:
    """Map each part of PARTS that ``impl`` cannot run to the reason; every part needs PagedKV."""
    missing = {}
    for part, name in PARTS.items():
        absent = [n for n in dict.fromkeys(("PagedKV", name)) if not callable(getattr(impl, n, None))]
        if absent:
            missing[part] = f"the implementation exposes no {' or '.join(absent)}"
    return missing


def lifecycle_settings(base: Settings | None = None) -> Settings:
    """Return ``base`` (default: the active profile) with no deadline and at least MIN_STEPS steps.

    ``max_examples``, derandomization and the database are left to the profile.
    One step is added because Hypothesis spends the first step of each run on
    the ``@initialize`` rule, so the count is the number of operations.
    """
    base = Settings() if base is None else base
    return Settings(base, deadline=None, stateful_step_count=max(base.stateful_step_count, MIN_STEPS) + 1)


# --------------------------------------------------------------------- oracle


class _PageOracle:
    """Which pages exist and what they hold, derived from the contract only.

    Pages are ids minted by the oracle. A page is in use while any table or pin
    lists it, so the free count is recomputed from scratch instead of being
    maintained by refcounts.
    """

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}
        self.pins: dict[int, tuple[int, ...]] = {}
        self.rows: dict[int, tuple[int, ...]] = {}
        self._mint = itertools.count()

    def free(self) -> int:
        used = set(itertools.chain(*self.tables.values(), *self.pins.values()))
        return self.capacity - len(used)

    def history(self, owner: str) -> list[int]:
        return [token for page in self.tables[owner] for token in self.rows[page]]

    def create(self, owner: str) -> None:
        self.tables[owner] = []

    def release(self, owner: str) -> None:
        del self.tables[owner]

    def fork(self, src: str, dst: str) -> None:
        self.tables[dst] = list(self.tables[src])

    def pin(self, owner: str) -> int:
        handle = next(self._mint)
        self.pins[handle] = tuple(self.tables[owner])
        return handle

    def unpin(self, handle: int) -> None:
        del self.pins[handle]

    def append(self, owner: str, tokens: list[int]) -> bool:
        """Re-chunk the partial tail plus ``tokens``; only a tail nobody else sees is rewritten in place."""
        table = self.tables[owner]
        if not tokens:
            return True
        tail = table[-1] if table and len(self.rows[table[-1]]) < self.block_size else None
        kept = table[:-1] if tail is not None else table
        merged = [*(self.rows[tail] if tail is not None else ()), *tokens]
        chunks = [tuple(merged[i : i + self.block_size]) for i in range(0, len(merged), self.block_size)]
        in_place = tail is not None and self._private(tail)
        if len(chunks) - in_place > self.free():
            return False
        pages = [tail if in_place and i == 0 else next(self._mint) for i in range(len(chunks))]
        self.rows.update(zip(pages, chunks))
        self.tables[owner] = [*kept, *pages]
        return True

    def _private(self, page: int) -> bool:
        holders = sum(table.count(page) for table in self.tables.values())
        return holders == 1 and not any(page in pinned for pinned in self.pins.values())


# ---------------------------------------------------------- shared machinery


class _LifecycleMachine(RuleBasedStateMachine):
    """Step helpers shared by the three machines; ``impl`` is bound by the factories."""

    impl: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.pool: Any = None
        self.oracle: _PageOracle | None = None
        self.owners: set[str] = set()  # pool owners the machine created and compares

    # Every failure sets ``failed`` so that teardown cannot mask it with cleanup errors.
    def violation(self, clause: str, message: str) -> LifecycleViolation:
        assert clause in LIFECYCLE_CLAUSES, clause
        self.failed = True
        return LifecycleViolation(clause, message)

    def expect(self, condition: bool, clause: str, message: str) -> None:
        if not condition:
            raise self.violation(clause, message)

    def call(self, clause: str, snippet: str, fn: Callable[..., Any], *args: Any, show: bool = True) -> Any:
        """Run one implementation call, noting ``snippet`` and its result; an exception violates ``clause``."""
        try:
            result = fn(*args)
        except Exception as exc:
            note(f"{snippet}  # raised {type(exc).__name__}: {exc}")
            raise self.violation(clause, f"{snippet} raised {type(exc).__name__}: {exc}") from exc
        if show:
            note(f"{snippet}  # -> {result!r}")
        return result

    def construct(self, clause: str, snippet: str, factory: Callable[..., Any], *args: Any) -> Any:
        """Like ``call`` for an assignment whose result repr would only add noise."""
        result = self.call(clause, snippet, factory, *args, show=False)
        note(snippet)
        return result

    def attribute(self, clause: str, variable: str, obj: Any, name: str) -> Any:
        return self.call(clause, f"{variable}.{name}", getattr, obj, name, show=False)

    def call_raises(self, clause: str, snippet: str, fn: Callable[..., Any], *args: Any,
                    expected: type[Exception] = Exception) -> None:
        """Run one implementation call that must raise ``expected``."""
        try:
            result = fn(*args)
        except expected as exc:
            note(f"{snippet}  # raises {type(exc).__name__}")
            return
        except Exception as exc:
            raise self.violation(
                clause, f"{snippet} raised {type(exc).__name__}: {exc}, expected {expected.__name__}"
            ) from exc
        note(f"{snippet}  # -> {result!r}")
        raise self.violation(clause, f"{snippet} returned {result!r}, expected {expected.__name__}")

    def start_pool(self, capacity: int, block_size: int) -> None:
        note("# PagedKV, RecomputeRequest and TransferManager come from the implementation under test")
        self.pool = self.construct("lifecycle.page_conservation", f"pool = PagedKV({capacity}, {block_size})",
                                   self.impl.PagedKV, capacity, block_size)
        self.oracle = _PageOracle(capacity, block_size)

    def expect_free(self, clause: str, context: str) -> None:
        free = self.call(clause, "list(pool.free)", lambda: list(self.pool.free), show=False)
        self.expect(len(set(free)) == len(free), "lifecycle.page_conservation",
                    f"after {context}: pool.free lists a page twice: {free}")
        want = self.oracle.free()
        self.expect(len(free) == want, clause,
                    f"after {context}: len(pool.free) == {len(free)}, expected {want} of {self.oracle.capacity}")

    def expect_rows(self, clause: str, owner: str, context: str) -> None:
        got = self.call(clause, f"pool.read({owner!r})", self.pool.read, owner, show=False)
        want = self.oracle.history(owner)
        self.expect(got == want, clause, f"after {context}: pool.read({owner!r}) == {got!r}, expected {want!r}")

    def pool_create(self, owner: str) -> None:
        self.call("lifecycle.owner_names", f"pool.create({owner!r})", self.pool.create, owner)
        self.oracle.create(owner)
        self.owners.add(owner)

    def pool_release(self, owner: str, clause: str) -> None:
        self.call(clause, f"pool.release({owner!r})", self.pool.release, owner)
        self.oracle.release(owner)
        self.owners.discard(owner)
        self.expect_free(clause, f"pool.release({owner!r})")

    def pool_append(self, owner: str, tokens: list[int]) -> bool:
        """Append on both sides; check the result, every owner's rows and the free count at once."""
        snippet = f"pool.append({owner!r}, {tokens!r})"
        free_before = self.oracle.free()
        want = self.oracle.append(owner, tokens)
        got = self.call("lifecycle.append_atomic", snippet, self.pool.append, owner, tokens)
        self.expect(got == want, "lifecycle.append_atomic",
                    f"{snippet} returned {got!r}, expected {want!r} with {free_before} free pages before it")
        self.expect_rows("lifecycle.append_atomic", owner, snippet)
        for other in sorted(self.owners - {owner}):
            self.expect_rows("lifecycle.cow_isolation", other, snippet)
        self.expect_free("lifecycle.append_atomic", snippet)
        return want

    def pool_pin(self, owner: str, variable: str) -> tuple[int, Any]:
        """Pin on both sides; return (oracle handle, implementation pin id)."""
        snippet = f"{variable} = pool.pin({owner!r})"
        pin_id = self.call("lifecycle.pin_retains", snippet, self.pool.pin, owner)
        handle = self.oracle.pin(owner)
        self.expect_free("lifecycle.pin_retains", snippet)
        return handle, pin_id

    def pool_unpin(self, handle: int, pin_id: Any, variable: str, clause: str) -> None:
        self.call(clause, f"pool.unpin({variable})", self.pool.unpin, pin_id)
        self.oracle.unpin(handle)
        self.expect_free(clause, f"pool.unpin({variable})")

    @invariant()
    def pages_conserved(self) -> None:
        if self.oracle is not None:
            self.expect_free("lifecycle.page_conservation", "the last step")

    @invariant()
    def histories_match(self) -> None:
        for owner in sorted(self.owners):
            self.expect_rows("lifecycle.read_matches_history", owner, "the last step")

    def cleanup(self) -> None:
        """Drop everything the run still holds, through the implementation and the oracle."""
        for owner in sorted(self.owners):
            self.pool_release(owner, "lifecycle.teardown_frees_all")

    def teardown(self) -> None:
        if self.failed or self.oracle is None:
            return
        note("# teardown")
        self.cleanup()
        assert self.oracle.free() == self.oracle.capacity, "oracle bug: cleanup left pages in use"
        self.expect_free("lifecycle.teardown_frees_all", "teardown")


def _choose(data: st.DataObject, candidates: list[Any], label: str) -> Any:
    """Pick a candidate with a draw whose shape does not depend on how many there are.

    When the shrinker deletes an earlier step, later steps may see a different
    number of candidates; a fixed-range index keeps their draws aligned.
    """
    return candidates[data.draw(st.integers(0, _CHOICE_RANGE - 1), label=label) % len(candidates)]


def _bind(base: type[_LifecycleMachine], name: str, impl: object) -> type[RuleBasedStateMachine]:
    return type(name, (base,), {"impl": impl, "__doc__": base.__doc__})


# ------------------------------------------------------------------ allocator

_OWNERS = ("a", "b", "c", "d")


class _AllocatorMachine(_LifecycleMachine):
    """create/append/fork/pin/unpin/release on one small pool, compared with the page oracle."""

    def __init__(self) -> None:
        super().__init__()
        self.pins: dict[int, tuple[Any, str]] = {}  # oracle handle -> (implementation pin id, variable)
        self.pin_names = itertools.count()

    @initialize(capacity=st.integers(1, 8), block_size=st.integers(1, 3))
    def setup(self, capacity: int, block_size: int) -> None:
        self.start_pool(capacity, block_size)

    @rule(owner=st.sampled_from(_OWNERS))
    def create(self, owner: str) -> None:
        if owner in self.owners:
            snippet = f"pool.create({owner!r})"
            self.call_raises("lifecycle.owner_names", snippet, self.pool.create, owner, expected=ValueError)
            self.expect_rows("lifecycle.owner_names", owner, snippet)
        else:
            self.pool_create(owner)

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), tokens=_TOKENS)
    def append(self, data: st.DataObject, tokens: list[int]) -> None:
        self.pool_append(_choose(data, sorted(self.owners), "owner"), tokens)

    @precondition(lambda self: self.owners and len(self.owners) < len(_OWNERS))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        src = _choose(data, sorted(self.owners), "src")
        dst = _choose(data, sorted(set(_OWNERS) - self.owners), "dst")
        snippet = f"pool.fork({src!r}, {dst!r})"
        self.call("lifecycle.fork_shares", snippet, self.pool.fork, src, dst)
        self.oracle.fork(src, dst)
        self.owners.add(dst)
        self.expect_rows("lifecycle.fork_shares", dst, snippet)
        self.expect_free("lifecycle.fork_shares", snippet)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        variable = f"pin{next(self.pin_names)}"
        handle, pin_id = self.pool_pin(_choose(data, sorted(self.owners), "owner"), variable)
        self.pins[handle] = (pin_id, variable)

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        handle = _choose(data, sorted(self.pins), "pin")
        self.pool_unpin(handle, *self.pins.pop(handle), "lifecycle.pin_retains")

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.pool_release(_choose(data, sorted(self.owners), "owner"), "lifecycle.pin_retains")

    @precondition(lambda self: len(self.owners) < len(_OWNERS))
    @rule(data=st.data(), operation=st.sampled_from(("append", "read", "release", "pin", "fork")))
    def unknown_owner(self, data: st.DataObject, operation: str) -> None:
        owner = _choose(data, sorted(set(_OWNERS) - self.owners), "unknown")
        extra = {"append": ([1],), "fork": (f"{owner}-fork",)}.get(operation, ())
        snippet = f"pool.{operation}({', '.join(map(repr, (owner, *extra)))})"
        self.call_raises("lifecycle.owner_names", snippet, getattr(self.pool, operation), owner, *extra,
                         expected=KeyError)
        self.expect_free("lifecycle.owner_names", snippet)

    def cleanup(self) -> None:
        super().cleanup()
        for handle in sorted(self.pins):
            self.pool_unpin(handle, *self.pins.pop(handle), "lifecycle.teardown_frees_all")


def allocator_machine(impl: object) -> type[RuleBasedStateMachine]:
    """State machine for ``impl.PagedKV``: allocation, sharing, pins, copy-on-write, atomicity."""
    return _bind(_AllocatorMachine, "AllocatorLifecycle", impl)


# ------------------------------------------------------------------ recompute


@dataclass
class _RequestModel:
    variable: str
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)
    state: str = "queued"
    recomputed: int = 0

    @property
    def owner(self) -> str:
        return self.variable

    def committed(self) -> list[int]:
        return [*self.prompt, *self.outputs[:-1]]


_PROMPTS = st.lists(st.integers(0, 9), min_size=1, max_size=6)
_MAX_LIVE_REQUESTS = 3
_ACTIVE_ACTIONS = ("sample", "sample", "sample", "preempt")  # repeats weight the draw
_MAX_COMPETITORS = 2


class _RecomputeMachine(_LifecycleMachine):
    """Requests resumed, sampled and preempted while the environment cancels, admits and squeezes.

    Two rules: ``advance`` drives one request through its cycle and ``churn`` is
    everything around it. Hypothesis's swarm testing switches whole rules off
    for a run; with a rule per operation most runs could not complete a
    sample/preempt/replay cycle, while two rules still shrink well.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[_RequestModel] = []
        self.handles: dict[str, Any] = {}  # request variable -> implementation request
        self.pins: dict[int, tuple[Any, str]] = {}  # oracle handle -> (pin id, pinned owner)
        self.competitors = itertools.count()
        self.tokens = itertools.count(100)  # unique outputs make a repeated emission visible

    @initialize(capacity=st.integers(2, 12), block_size=st.integers(1, 3),
                prompts=st.lists(_PROMPTS, min_size=1, max_size=_MAX_LIVE_REQUESTS))
    def setup(self, capacity: int, block_size: int, prompts: list[list[int]]) -> None:
        self.start_pool(capacity, block_size)
        for prompt in prompts:
            self.admit(prompt)

    def admit(self, prompt: list[int]) -> None:
        model = _RequestModel(f"r{len(self.requests)}", prompt)
        snippet = f"{model.variable} = RecomputeRequest(pool, {model.owner!r}, {prompt!r})"
        self.handles[model.variable] = self.construct(
            "lifecycle.request_state", snippet, self.impl.RecomputeRequest, self.pool, model.owner, list(prompt)
        )
        self.requests.append(model)

    def with_state(self, *states: str) -> list[_RequestModel]:
        return [r for r in self.requests if r.state in states]

    def pick(self, data: st.DataObject, candidates: list[_RequestModel]) -> tuple[_RequestModel, Any]:
        model = _choose(data, candidates, "request")
        return model, self.handles[model.variable]

    def expect_request(self, clause: str, model: _RequestModel, request: Any, context: str) -> None:
        outputs = list(self.attribute(clause, model.variable, request, "outputs"))
        self.expect(outputs == model.outputs, clause,
                    f"after {context}: {model.variable}.outputs == {outputs}, expected {model.outputs}")
        state = self.attribute(clause, model.variable, request, "state")
        self.expect(state == model.state, clause,
                    f"after {context}: {model.variable}.state == {state!r}, expected {model.state!r}")
        self.expect_free(clause, context)

    @precondition(lambda self: self.with_state("queued", "preempted", "active"))
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        """Move one request on: resume it when it is not resident, else mostly sample, sometimes preempt."""
        live = self.with_state("queued", "preempted", "active")
        active = self.with_state("active")
        prefer_active = data.draw(st.booleans(), label="prefer active")
        model, request = self.pick(data, active if prefer_active and active else live)
        action = data.draw(st.sampled_from(_ACTIVE_ACTIONS), label="action")
        self.act(action if model.state == "active" else "resume", model, request)

    def act(self, call: str, model: _RequestModel, request: Any) -> None:
        handlers = {"resume": self.resume_request, "sample": self.sample_request,
                    "preempt": self.preempt_request, "cancel": self.cancel_request}
        handlers[call](model, request)

    def resume_request(self, model: _RequestModel, request: Any) -> None:
        snippet = f"{model.variable}.resume()"
        want = model.state == "active"
        if model.state in ("queued", "preempted"):
            rows = model.committed()
            self.oracle.create(model.owner)
            want = self.oracle.append(model.owner, rows)
            if not want:
                self.oracle.release(model.owner)
            else:
                model.recomputed += len(rows) if model.state == "preempted" else 0
                model.state = "active"
        got = self.call("lifecycle.replay_atomic", snippet, request.resume)
        if model.state == "cancelled":
            self.expect(not got, "lifecycle.cancel_idempotent", f"{snippet} returned {got!r} after cancel()")
        self.expect(bool(got) == want, "lifecycle.replay_atomic",
                    f"{snippet} returned {got!r}, expected {want!r}: {len(model.committed())} rows in blocks "
                    f"of {self.oracle.block_size}, {self.oracle.free()} free pages")
        if want:
            self.expect_rows("lifecycle.replay_no_refeed", model.owner, snippet)
        self.expect_request("lifecycle.replay_atomic", model, request, snippet)

    def sample_request(self, model: _RequestModel, request: Any) -> None:
        token = next(self.tokens)
        snippet = f"{model.variable}.sample({token})"
        want = not model.outputs or self.oracle.append(model.owner, model.outputs[-1:])
        got = self.call("lifecycle.decode_atomic", snippet, request.sample, token)
        self.expect(bool(got) == want, "lifecycle.decode_atomic",
                    f"{snippet} returned {got!r}, expected {want!r} with {self.oracle.free()} free pages")
        if want:
            model.outputs.append(token)
        self.expect_request("lifecycle.outputs_append_only" if want else "lifecycle.decode_atomic",
                            model, request, snippet)

    def preempt_request(self, model: _RequestModel, request: Any) -> None:
        if model.state == "active":
            self.oracle.release(model.owner)
            model.state = "preempted"
        snippet = f"{model.variable}.preempt()"
        self.call("lifecycle.preempt_keeps_history", snippet, request.preempt)
        self.expect_request("lifecycle.preempt_keeps_history", model, request, snippet)

    def cancel_request(self, model: _RequestModel, request: Any) -> None:
        if model.state == "active":
            self.oracle.release(model.owner)
        model.state = "cancelled"
        snippet = f"{model.variable}.cancel()"
        self.call("lifecycle.cancel_idempotent", snippet, request.cancel)
        self.expect_request("lifecycle.cancel_idempotent", model, request, snippet)

    @rule(data=st.data())
    def churn(self, data: st.DataObject) -> None:
        """The rest of the world: admissions, cancellations, no-op calls and competing residents."""
        live = self.with_state("queued", "preempted", "active")
        unpinned = sorted(self.owners - {owner for _, owner in self.pins.values()})
        enabled = {
            "admit": len(live) < _MAX_LIVE_REQUESTS,
            "cancel": live,
            "poke": True,  # any call on any request, including no-op resumes and preempts
            "occupy": len(self.owners) < _MAX_COMPETITORS,
            "pin": unpinned,
            "unpin": self.pins,
            "vacate": self.owners,
        }
        action = data.draw(st.sampled_from(tuple(enabled)), label="churn")
        action = action if enabled[action] else "poke"
        if action == "admit":
            self.admit(data.draw(_PROMPTS, label="prompt"))
        elif action == "cancel":
            self.cancel_request(*self.pick(data, live))
        elif action == "poke":
            call = data.draw(st.sampled_from(("cancel", "preempt", "resume")), label="call")
            self.act(call, *self.pick(data, self.requests))
        elif action == "occupy":
            owner = f"x{next(self.competitors)}"
            self.pool_create(owner)
            if not self.pool_append(owner, data.draw(_PROMPTS, label="rows")):
                self.pool_release(owner, "lifecycle.page_conservation")
        elif action == "pin":
            owner = _choose(data, unpinned, "owner")
            handle, pin_id = self.pool_pin(owner, f"pin_{owner}")
            self.pins[handle] = (pin_id, owner)
        elif action == "unpin":
            self.unpin(_choose(data, sorted(self.pins), "pin"), "lifecycle.pin_retains")
        else:
            self.pool_release(_choose(data, sorted(self.owners), "owner"), "lifecycle.pin_retains")

    def unpin(self, handle: int, clause: str) -> None:
        pin_id, owner = self.pins.pop(handle)
        self.pool_unpin(handle, pin_id, f"pin_{owner}", clause)

    @invariant()
    def requests_match(self) -> None:
        for model in self.requests:
            request, variable = self.handles[model.variable], model.variable
            state = self.attribute("lifecycle.request_state", variable, request, "state")
            self.expect(state == model.state, "lifecycle.request_state",
                        f"{variable}.state == {state!r}, expected {model.state!r}")
            outputs = list(self.attribute("lifecycle.outputs_append_only", variable, request, "outputs"))
            self.expect(outputs == model.outputs, "lifecycle.outputs_append_only",
                        f"{variable}.outputs == {outputs}, expected {model.outputs}")
            if model.state == "active":
                rows = self.call("lifecycle.active_rows", f"pool.read({model.owner!r})",
                                 self.pool.read, model.owner, show=False)
                self.expect(rows == model.committed(), "lifecycle.active_rows",
                            f"pool.read({model.owner!r}) == {rows}, expected prompt + outputs[:-1] "
                            f"== {model.committed()}")
            recomputed = self.attribute("lifecycle.recompute_count", variable, request, "recomputed_rows")
            self.expect(recomputed == model.recomputed, "lifecycle.recompute_count",
                        f"{variable}.recomputed_rows == {recomputed}, expected {model.recomputed}")
            emitted = self.call("lifecycle.emission_events", f"{variable}.events", _emissions, request, show=False)
            self.expect(emitted == list(enumerate(model.outputs)), "lifecycle.emission_events",
                        f"{variable}.events emit (index, token) {emitted}, expected {list(enumerate(model.outputs))}")

    def cleanup(self) -> None:
        for model in self.requests:
            self.cancel_request(model, self.handles[model.variable])
        super().cleanup()
        for handle in sorted(self.pins):
            self.unpin(handle, "lifecycle.teardown_frees_all")


def _emissions(request: Any) -> list[tuple[Any, Any]]:
    return [(event["index"], event["token"]) for event in request.events if event["event"] == "emit"]


def recompute_machine(impl: object) -> type[RuleBasedStateMachine]:
    """State machine for ``impl.RecomputeRequest`` on ``impl.PagedKV``: preemption and full replay."""
    return _bind(_RecomputeMachine, "RecomputeLifecycle", impl)


# ------------------------------------------------------------------- transfer


@dataclass
class _TransferModel:
    variable: str
    key: Any
    source: str
    room: str
    snapshot: list[int]
    destination: str
    pins: tuple[int, ...] = ()  # oracle handles of the source and destination pins
    state: str = "in_flight"


_SOURCES = ("s0", "s1")
_SOURCE_ROWS = st.lists(st.integers(0, 99), min_size=1, max_size=3)
_ROOMS = ("room-0", "room-1")
_LIVE = ("in_flight", "ready", "aborted")
# callback -> (state it needs, state it leads to)
_CALLBACKS = {
    "complete": ("in_flight", "ready"),
    "abort": ("in_flight", "aborted"),
    "acknowledge_drained": ("aborted", "drained"),
    "release_output": ("ready", "released"),
}


class _TransferMachine(_LifecycleMachine):
    """Transfers begun, completed, aborted, drained and released while their sources keep changing."""

    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[_TransferModel] = []
        self.attempts = 0
        self.last_key: Any = None
        self.failed_reservations = 0

    @initialize(capacity=st.integers(2, 12), block_size=st.integers(1, 3))
    def setup(self, capacity: int, block_size: int) -> None:
        self.start_pool(capacity, block_size)
        self.manager = self.construct("lifecycle.page_conservation", "manager = TransferManager(pool)",
                                      self.impl.TransferManager, self.pool)

    @rule(data=st.data())
    def source(self, data: st.DataObject) -> None:
        """Create, grow or drop a source; transfers of it must not notice. Sources are never empty."""
        source = data.draw(st.sampled_from(_SOURCES), label="source")
        if source in self.owners and data.draw(st.booleans(), label="release"):
            self.pool_release(source, "lifecycle.page_conservation")
            return
        created = source not in self.owners
        if created:
            self.pool_create(source)
        if not self.pool_append(source, data.draw(_SOURCE_ROWS, label="rows")) and created:
            self.pool_release(source, "lifecycle.page_conservation")

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), room=st.sampled_from(_ROOMS))
    def begin(self, data: st.DataObject, room: str) -> None:
        source = _choose(data, sorted(self.owners), "source")
        self.attempts += 1
        variable = f"t{self.attempts}"
        snippet = f"{variable} = manager.begin({source!r}, {room!r})"
        model = _TransferModel(variable, None, source, room, self.oracle.history(source), f"<{variable}>")
        busy = any(t.room == room and t.state in _LIVE for t in self.transfers)
        if not busy:
            source_pin = self.oracle.pin(source)
            self.oracle.create(model.destination)
            if self.oracle.append(model.destination, model.snapshot):
                model.pins = (source_pin, self.oracle.pin(model.destination))
            else:
                self.oracle.release(model.destination)
                self.oracle.unpin(source_pin)
        key = self.call("lifecycle.begin_rollback", snippet, self.manager.begin, source, room)
        if busy:
            self.expect(key is None, "lifecycle.room_exclusive",
                        f"{snippet} returned {key!r} while {room!r} holds a live transfer")
        elif not model.pins:
            self.failed_reservations += 1
            self.expect(key is None, "lifecycle.begin_rollback",
                        f"{snippet} returned {key!r}, but {len(model.snapshot)} rows do not fit in "
                        f"{self.oracle.free()} free pages")
        else:
            self.expect(key is not None, "lifecycle.begin_rollback",
                        f"{snippet} returned None with {room!r} idle and pages to spare")
            if self.last_key is not None:
                self.expect(key >= self.last_key + 1 + self.failed_reservations, "lifecycle.key_monotonic",
                            f"{snippet} returned {key!r} after key {self.last_key!r} and "
                            f"{self.failed_reservations} failed reservations")
            self.last_key, self.failed_reservations = key, 0
            model.key = key
            self.transfers.append(model)
        self.expect_free("lifecycle.begin_rollback", snippet)

    @precondition(lambda self: self.transfers)
    @rule(data=st.data(), method=st.sampled_from(tuple(_CALLBACKS)))
    def callback(self, data: st.DataObject, method: str) -> None:
        """complete, abort (now and then with an invalid reason), acknowledge_drained or release_output."""
        if method != "abort":
            self.deliver(data, method)
            return
        reason = data.draw(st.sampled_from((*ABORT_REASONS, "reboot")), label="reason")
        if reason in ABORT_REASONS:
            self.deliver(data, method, reason)
            return
        _, key, variable = self.pick(data)
        snippet = f"manager.abort({variable}, {reason!r})"
        self.call_raises("lifecycle.abort_reason", snippet, self.manager.abort, key, reason, expected=ValueError)
        self.expect_free("lifecycle.abort_reason", snippet)

    @precondition(lambda self: self.transfers)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        self.check_read(*self.pick(data, "ready"), show=True)

    def pick(self, data: st.DataObject, fitting: str | None = None) -> tuple[_TransferModel | None, Any, str]:
        """Usually a transfer in state ``fitting`` when there is one, else any transfer or an unknown key."""
        candidates = [t for t in self.transfers if t.state == fitting]
        if not (data.draw(st.booleans(), label="any key") and candidates):
            candidates = [*self.transfers, None]
        model = _choose(data, candidates, "transfer")
        if model is None:
            return None, _UNKNOWN_KEY, str(_UNKNOWN_KEY)
        return model, model.key, model.variable

    def deliver(self, data: st.DataObject, method: str, *extra: Any) -> None:
        """Send one callback; it must apply exactly when the transfer is in the state it needs."""
        needs = _CALLBACKS[method][0]
        model, key, variable = self.pick(data, needs)
        snippet = f"manager.{method}({', '.join([variable, *map(repr, extra)])})"
        applies = model is not None and model.state == needs
        got = self.call("lifecycle.callback_fencing", snippet, getattr(self.manager, method), key, *extra)
        if method != "release_output":  # its return value is not part of the contract
            self.expect(got is applies, "lifecycle.callback_fencing",
                        f"{snippet} returned {got!r} for a {model.state if model else 'unknown'} transfer, "
                        f"expected {applies}")
        if not applies:
            self.expect_free("lifecycle.callback_fencing", snippet)
            return
        self.settle(model, method)
        clause = {"complete": "lifecycle.snapshot_published", "abort": "lifecycle.abort_retains"}
        self.expect_free(clause.get(method, "lifecycle.drain_frees"), snippet)

    def settle(self, model: _TransferModel, method: str) -> None:
        """Apply a callback that took effect to the model and the page oracle."""
        model.state = _CALLBACKS[method][1]
        if method in ("complete", "acknowledge_drained"):
            for handle in model.pins:
                self.oracle.unpin(handle)
        else:
            self.oracle.release(model.destination)

    def check_read(self, model: _TransferModel | None, key: Any, variable: str, show: bool) -> None:
        snippet = f"manager.read({variable})"
        if model is not None and model.state == "ready":
            rows = list(self.call("lifecycle.snapshot_published", snippet, self.manager.read, key, show=show))
            self.expect(rows == model.snapshot, "lifecycle.snapshot_published",
                        f"{snippet} == {rows!r}, expected the rows at begin(): {model.snapshot!r}")
        elif show:
            self.call_raises("lifecycle.unpublished_unreadable", snippet, self.manager.read, key)
        else:
            try:
                rows = self.manager.read(key)
            except Exception:
                return
            raise self.violation("lifecycle.unpublished_unreadable",
                                 f"{snippet} returned {rows!r} for a {model.state if model else 'unknown'} transfer")

    @invariant()
    def transfers_match(self) -> None:
        for model in self.transfers:
            self.check_read(model, model.key, model.variable, show=False)

    def cleanup(self) -> None:
        for model in self.transfers:
            for method, extra in (("abort", ("cancelled",)), ("acknowledge_drained", ()), ("release_output", ())):
                if model.state == _CALLBACKS[method][0]:
                    snippet = f"manager.{method}({', '.join([model.variable, *map(repr, extra)])})"
                    self.call("lifecycle.teardown_frees_all", snippet, getattr(self.manager, method), model.key, *extra)
                    self.settle(model, method)
        super().cleanup()


def transfer_machine(impl: object) -> type[RuleBasedStateMachine]:
    """State machine for ``impl.TransferManager`` on ``impl.PagedKV``: publication, aborts, drains, rooms."""
    return _bind(_TransferMachine, "TransferLifecycle", impl)


MACHINES: dict[str, Callable[[object], type[RuleBasedStateMachine]]] = {
    "allocator": allocator_machine,
    "recompute": recompute_machine,
    "transfer": transfer_machine,
}
"""Machine factory for each part of PARTS."""
