"""The recompute machine: requests resumed, sampled, preempted and cancelled while the pool is squeezed."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from .machine import PICK, LifecycleMachine, bind, choose, judged
from .oracle import pages_for

__all__ = ["recompute_machine"]

_PROMPTS = st.lists(st.integers(0, 9), min_size=1, max_size=6)
_MAX_LIVE = 3
_MAX_COMPETITORS = 2
_ACTIONS = ("sample", "sample", "sample", "preempt")  # repeats weight the draw
_KNOWN = ("resumed", "resume_blocked", "preempted", "cancelled")  # the non-emit events the contract names
# Fields an event must carry whose value the contract leaves open (the course text never defines retained_tokens).
_OPEN_FIELDS = {"preempted": ("retained_tokens",)}
_WRONG = "lifecycle.wrong_state_refused"


@dataclass
class _Request:
    """What the contract says one request holds."""

    variable: str
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)
    state: str = "queued"
    recomputed: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)  # expected non-emit events, in order

    @property
    def owner(self) -> str:
        return self.variable

    def committed(self) -> list[int]:
        return [*self.prompt, *self.outputs[:-1]]


class _RecomputeMachine(LifecycleMachine):
    """Two rules: ``advance`` moves one request through its cycle, ``churn`` is the world around it.

    Hypothesis's swarm testing switches whole rules off for a run; with a rule
    per operation most runs could not complete a sample/preempt/replay cycle.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[_Request] = []
        self.handles: dict[str, Any] = {}
        self.competitors = itertools.count()
        self.pin_names = itertools.count()
        self.tokens = itertools.count(100)  # unique outputs make a repeated emission visible
        self.emit_base: int | None = None  # 0 or 1, fixed by the first emission
        self.blocked: set[str] = set()  # requests whose last sample() found no page: preempted next, not retried

    @initialize(capacity=st.integers(2, 12), block_size=st.integers(1, 3),
                prompts=st.lists(_PROMPTS, min_size=1, max_size=_MAX_LIVE))
    @judged
    def setup(self, capacity: int, block_size: int, prompts: list[list[int]]) -> None:
        self.start_pool(capacity, block_size)
        for prompt in prompts:
            self.admit(prompt)

    def admit(self, prompt: list[int]) -> None:
        model = _Request(f"r{len(self.requests)}", list(prompt))
        code = f"{model.variable} = RecomputeRequest(pool, {model.owner!r}, {prompt!r})"
        self.handles[model.variable] = self.observe(
            "lifecycle.request_arguments", code,
            lambda: self.impl.RecomputeRequest(self.pool, model.owner, list(prompt)), data=False)
        self.record(code)
        self.requests.append(model)

    def with_state(self, *states: str) -> list[_Request]:
        return [r for r in self.requests if r.state in states]

    def competitor_names(self) -> list[str]:
        return sorted(o for o in self.oracle.tables if isinstance(o, str) and o.startswith("x"))

    # ----------------------------------------------------------------- rules

    @precondition(lambda self: self.with_state("queued", "preempted", "active"))
    @rule(pick=PICK, prefer_active=st.booleans(), action=st.sampled_from(_ACTIONS))
    @judged
    def advance(self, pick: int, prefer_active: bool, action: str) -> None:
        """Resume a request that is not resident; else mostly sample it, sometimes preempt it."""
        live, active = self.with_state("queued", "preempted", "active"), self.with_state("active")
        model = choose(pick, active if prefer_active and active else live)
        if model.state != "active":
            self.resume(model)
        elif action == "sample" and model.variable not in self.blocked:
            self.sample(model)
        else:
            self.preempt(model)

    @rule(pick=PICK, rows=_PROMPTS, action=st.sampled_from(
        ("admit", "cancel", "misuse", "occupy", "pin", "unpin", "vacate", "squat", "bad_request", "bad_token")),
        call=st.sampled_from(("resume", "sample", "preempt")))
    @judged
    def churn(self, pick: int, rows: list[int], action: str, call: str) -> None:
        """Admissions, cancellations, calls in the wrong state, competing owners, pins and bad arguments."""
        live = self.with_state("queued", "preempted", "active")
        suspended, active = self.with_state("queued", "preempted"), self.with_state("active")
        if action == "admit" and len(live) < _MAX_LIVE:
            self.admit(rows)
        elif action == "cancel" and self.requests:
            self.cancel(choose(pick, self.requests))
        elif action == "misuse" and self.requests:
            self.misuse(choose(pick, self.requests), call)
        elif action == "occupy" and len(self.competitor_names()) < _MAX_COMPETITORS:
            owner = f"x{next(self.competitors)}"
            self.pool_create(owner)
            self.pool_append_all(owner, rows)
        elif action == "pin" and self.oracle.tables:
            self.pool_pin(choose(pick, sorted(self.oracle.tables)), f"p{next(self.pin_names)}")
        elif action == "unpin" and self.oracle.pins:
            self.pool_unpin(choose(pick, sorted(self.oracle.pins)))
        elif action == "vacate" and self.competitor_names():
            self.pool_release(choose(pick, self.competitor_names()), "lifecycle.pin_retains")
        elif action == "squat" and suspended:
            self.squat(choose(pick, suspended))
        elif action == "bad_request":
            self.bad_request(pick)
        elif action == "bad_token" and active:
            self.refused("lifecycle.request_arguments", choose(pick, active), "sample", "'7'", "7",
                         why="a token must be an int", returns=())

    # ------------------------------------------------------------ operations

    def resume(self, model: _Request) -> None:
        request, code = self.handles[model.variable], f"{model.variable}.resume()"
        rows = model.committed()
        fits = pages_for(len(rows), self.oracle.block_size) <= self.oracle.free()
        why = f"{len(rows)} committed rows need {pages_for(len(rows), self.oracle.block_size)} pages, " \
              f"{self.oracle.free()} free"
        got = self.call("lifecycle.replay_atomic", code, request.resume, why=why, capture=True)
        self.expect_result("lifecycle.replay_atomic", code, got, fits, why)
        if fits:
            self.oracle.create(model.owner)
            for row in rows:
                self.oracle.append(model.owner, row)
            replayed = len(rows) if model.state == "preempted" else 0
            model.recomputed += replayed
            model.state = "active"
            model.events.append({"event": "resumed", "recomputed_rows": replayed})
        else:
            model.events.append({"event": "resume_blocked", "rows": len(rows)})
        self.expect_state("lifecycle.request_state", model, code)
        if fits:
            self.expect_rows("lifecycle.replay_no_refeed", model.owner, code)
        self.expect_free("lifecycle.replay_atomic", code)
        self.expect_owners("lifecycle.replay_atomic", code)
        self.expect_request(model, code)

    def sample(self, model: _Request) -> None:
        request, token = self.handles[model.variable], next(self.tokens)
        code = f"{model.variable}.sample({token})"
        blocked = bool(model.outputs) and self.oracle.needs_page(model.owner) and not self.oracle.free()
        clause = "lifecycle.decode_atomic"
        (self.blocked.add if blocked else self.blocked.discard)(model.variable)
        if blocked:
            self.must_raise(clause, code, request.sample, token, expected=(MemoryError,),
                            why="feeding the pending output needs a page and none is free")
        else:
            self.call(clause, code, request.sample, token, why=f"{self.oracle.free()} free pages")
            if model.outputs:
                self.oracle.append(model.owner, model.outputs[-1])
            model.outputs.append(token)
        self.expect_outputs(clause if blocked else "lifecycle.outputs_append_only", model, code)
        self.expect_emissions(clause if blocked else "lifecycle.emission_events", model, code)
        self.expect_rows(clause if blocked else "lifecycle.active_rows", model.owner, code)
        self.expect_free(clause, code)

    def preempt(self, model: _Request) -> None:
        code, clause = f"{model.variable}.preempt()", "lifecycle.preempt_keeps_history"
        self.blocked.discard(model.variable)
        self.call(clause, code, self.handles[model.variable].preempt)
        self.oracle.release(model.owner)
        model.state = "preempted"
        model.events.append({"event": "preempted"})  # its retained_tokens: present, any value (_OPEN_FIELDS)
        self.expect_state("lifecycle.request_state", model, code)
        self.expect_outputs(clause, model, code)
        prompt = self.attribute(clause, model.variable, self.handles[model.variable], "prompt")
        self.expect(list(prompt) == model.prompt, clause, f"after {code}: {model.variable}.prompt == {prompt!r}, "
                    f"expected {model.prompt!r}", f"assert list({model.variable}.prompt) == {model.prompt!r}")
        self.expect_owners(clause, code)
        self.expect_free(clause, code)

    def cancel(self, model: _Request) -> None:
        code, clause = f"{model.variable}.cancel()", "lifecycle.cancel_idempotent"
        self.call(clause, code, self.handles[model.variable].cancel)
        if model.state != "cancelled":
            if model.state == "active":
                self.oracle.release(model.owner)
            model.state = "cancelled"
            model.events.append({"event": "cancelled"})
        self.expect_state(clause, model, code)
        self.expect_owners(clause, code)
        self.expect_free(clause, code)
        self.expect_events(clause, model, code, kinds_only=True)
        # the invariant judges check() of live requests only; a cancelled one is a reachable state too
        self.self_check(f"{model.variable}.check()", self.handles[model.variable].check)

    def misuse(self, model: _Request, method: str) -> None:
        """A call the request's state does not allow: ValueError or False, and no change."""
        allowed = {"resume": ("queued", "preempted"), "sample": ("active",), "preempt": ("active",)}[method]
        if model.state in allowed:
            {"resume": self.resume, "sample": self.sample, "preempt": self.preempt}[method](model)
            return
        clause = "lifecycle.cancel_idempotent" if model.state == "cancelled" and method == "resume" else _WRONG
        token = str(next(self.tokens)) if method == "sample" else ""
        self.refused(clause, model, method, token, *([int(token)] if token else []), why=f"it is {model.state}")

    def refused(self, clause: str, model: _Request, method: str, shown: str, *args: Any, why: str,
                returns: tuple[Any, ...] = (False,)) -> None:
        code = f"{model.variable}.{method}({shown})"
        fn = self.attribute(clause, model.variable, self.handles[model.variable], method, data=False)
        self.must_raise(clause, code, fn, *args, expected=(ValueError,), returns=returns, why=why)
        self.expect_state(clause, model, code)
        self.expect_outputs(clause, model, code)
        self.expect_emissions(clause, model, code)
        self.expect_owners(clause, code)
        self.expect_free(clause, code)

    def squat(self, model: _Request) -> None:
        """Another owner takes a suspended request's name: its resume() is refused until the name is free."""
        self.pool_create(model.owner, _WRONG)
        self.refused(_WRONG, model, "resume", "", why=f"owner {model.owner!r} has a table")
        self.pool_release(model.owner, _WRONG)

    def bad_request(self, pick: int) -> None:
        owners = sorted(self.oracle.tables)
        cases = [("", [1]), ("new", []), ("new", [1, 2.5])] + [(owner, [1]) for owner in owners[:1]]
        owner, prompt = choose(pick, cases)
        clause = "lifecycle.request_arguments"
        code = f"RecomputeRequest(pool, {owner!r}, {prompt!r})"
        self.must_raise(clause, code, self.impl.RecomputeRequest, self.pool, owner, prompt, expected=(ValueError,))
        self.expect_owners(clause, code)
        self.expect_free(clause, code)

    # --------------------------------------------------------------- checks

    def expect_state(self, clause: str, model: _Request, context: str) -> None:
        state = self.attribute(clause, model.variable, self.handles[model.variable], "state")
        self.expect(state == model.state, clause,
                    f"after {context}: {model.variable}.state == {state!r}, expected {model.state!r}",
                    f"assert {model.variable}.state == {model.state!r}, {model.variable}.state")

    def expect_outputs(self, clause: str, model: _Request, context: str) -> None:
        outputs = self.attribute(clause, model.variable, self.handles[model.variable], "outputs")
        self.expect(outputs == model.outputs, clause,
                    f"after {context}: {model.variable}.outputs == {outputs!r}, expected {model.outputs!r}",
                    f"assert {model.variable}.outputs == {model.outputs!r}, {model.variable}.outputs")

    def expect_emissions(self, clause: str, model: _Request, context: str) -> None:
        variable = model.variable
        events = self.attribute(clause, variable, self.handles[variable], "events")
        expr = f"[(e['index'], e['token']) for e in {variable}.events if e['event'] == 'emit']"
        got = self.observe(clause, expr, lambda: [(e["index"], e["token"]) for e in events if e["event"] == "emit"])
        if self.emit_base is None and got and got[0][0] in (0, 1):
            self.emit_base = got[0][0]
        base = 0 if self.emit_base is None else self.emit_base
        want = [(base + i, token) for i, token in enumerate(model.outputs)]
        self.expect(got == want, clause, f"after {context}: {variable}.events emit {got!r}, expected {want!r}"
                    f"{'' if self.emit_base is not None else ' (indices from 0 or 1)'}", f"assert {expr} == {want!r}")

    def expect_events(self, clause: str, model: _Request, context: str, kinds_only: bool = False) -> None:
        """The events besides emissions, in order: their kinds and the fields the contract fixes (with
        ``kinds_only``, as cancel_idempotent judges them, the kinds alone)."""
        variable = model.variable
        events = self.attribute(clause, variable, self.handles[variable], "events")
        expr = f"[e for e in {variable}.events if e['event'] in {_KNOWN!r}]"
        got = self.observe(clause, expr, lambda: [e for e in events if e["event"] in _KNOWN])
        want = [{"event": w["event"]} for w in model.events] if kinds_only else model.events
        self.reading(clause, *{k for w in want for k in w},
                     *(() if kinds_only else {k for ks in _OPEN_FIELDS.values() for k in ks}))
        projected = [{k: e.get(k) for k in w} for e, w in zip(got, want)]
        carried = kinds_only or all(k in e for e in got for k in _OPEN_FIELDS.get(e["event"], ()))
        shown = want if kinds_only else [{**w, **dict.fromkeys(_OPEN_FIELDS.get(w["event"], ()), "...")} for w in want]
        self.expect(len(got) == len(want) and projected == want and carried, clause,
                    f"after {context}: {variable}.events (besides emissions) {got!r}, expected {shown!r} "
                    f"(further fields are free; '...' is any value)",
                    f"assert [{{k: e.get(k) for k in w}} for e, w in zip({expr}, {want!r})] == {want!r} and "
                    f"len({expr}) == {len(want)}" + ("" if kinds_only else "".join(
                        f" and all({k!r} in e for e in {expr} if e['event'] == {kind!r})"
                        for kind, keys in _OPEN_FIELDS.items() for k in keys)))

    def expect_request(self, model: _Request, context: str) -> None:
        """Every history of the request, each under its own clause."""
        request, variable = self.handles[model.variable], model.variable
        self.expect_outputs("lifecycle.outputs_append_only", model, context)
        committed = self.attribute("lifecycle.active_rows", variable, request, "committed")
        self.expect(list(committed) == model.committed(), "lifecycle.active_rows",
                    f"after {context}: {variable}.committed == {committed!r}, expected {model.committed()!r}",
                    f"assert list({variable}.committed) == {model.committed()!r}, {variable}.committed")
        recomputed = self.attribute("lifecycle.recompute_count", variable, request, "recomputed_rows")
        self.expect(recomputed == model.recomputed, "lifecycle.recompute_count",
                    f"after {context}: {variable}.recomputed_rows == {recomputed!r}, expected {model.recomputed}",
                    f"assert {variable}.recomputed_rows == {model.recomputed}, {variable}.recomputed_rows")
        self.expect_emissions("lifecycle.emission_events", model, context)
        self.expect_events("lifecycle.request_events", model, context)

    @invariant()
    @judged
    def requests_consistent(self) -> None:
        for model in self.with_state("queued", "preempted", "active"):  # cancel() already judged the others
            self.expect_state("lifecycle.request_state", model, "the last step")
            if model.state == "active":
                self.expect_rows("lifecycle.active_rows", model.owner, "the last step")
            self.expect_request(model, "the last step")
            self.self_check(f"{model.variable}.check()", self.handles[model.variable].check)

    def cleanup(self) -> None:
        for model in self.requests:
            self.cancel(model)
        for name in sorted(self.oracle.pins):
            self.pool_unpin(name, "lifecycle.teardown_frees_all")
        for owner in self.competitor_names():
            self.pool_release(owner, "lifecycle.teardown_frees_all")


def recompute_machine(impl: object, disabled: frozenset[str] = frozenset()) -> type[RuleBasedStateMachine]:
    """State machine for ``impl.RecomputeRequest`` on ``impl.PagedKV``: preemption and full replay."""
    return bind(_RecomputeMachine, "recompute", impl, disabled)
