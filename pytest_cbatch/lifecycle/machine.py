"""What the three lifecycle state machines share: judged calls, the replay script, the pool checks.

Every call on the implementation goes through ``call``/``must_raise``/
``observe``, so anything the implementation does wrong (a wrong result, an
unexpected exception, a missing attribute) becomes a ``LifecycleViolation`` of
one named clause.  Each step appends its Python line to ``script``; a
violation carries the script plus a last line that fails on the implementation.
A clause listed in ``disabled`` (see ``verdicts``) does not fail: it halts the
run, and the rest of that run is not judged.

A clause is *judged* on a run when one of its checks ran to its end and held
there: a judged call (``call``, ``must_raise``) answered as the clause
requires, a read (``observe``) gave plain data (an object fetched to be used,
such as a constructed pool, judges nothing by itself), the implementation's
own ``check()`` returned, or a comparison (``expect``) held.  Each machine class collects the clauses judged on any of its runs in
``held``; a clause none of whose checks a run reached (the run failed or
halted on an earlier step) is not in it.

Shrinking is where a failing part spends its time: Hypothesis tries thousands
of candidate runs, and each one that does not fail used to run every step with
every check.  A machine class therefore remembers the shortest failing script
it has produced (``Shortest``); a later run whose script grows past it halts
there, since it could only yield a
longer replay.  Passing implementations
never fail, so their runs are untouched.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import os
import re
import traceback
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant

from ..bounded import CallTimedOut, implementation_frames
from ..explain import stack_lines
from ..plain import NotPlain, describe, exception_text, plain
from .clauses import LIFECYCLE_CLAUSES, PART_CLAUSES, PARTS, LifecycleViolation, StoppedViolation
from .oracle import PoolOracle

__all__ = ["ANY", "PICK", "LifecycleMachine", "bind", "choose", "final_run", "import_lines", "judged", "surface_names"]

PC = "lifecycle.page_conservation"
PV = "lifecycle.pool_views"
_Fn = TypeVar("_Fn", bound=Callable[..., Any])


class _Halted(Exception):
    """A disabled clause failed: the rest of this run is not judged."""


class Shortest:
    """The length of the shortest failing script of one machine class (None before any failure)."""

    def __init__(self) -> None:
        self.lines: int | None = None

    def note(self, lines: int) -> None:
        self.lines = lines if self.lines is None else min(self.lines, lines)

    def exceeded(self, lines: int) -> bool:
        return self.lines is not None and lines > self.lines


def final_run() -> bool:
    """Whether Hypothesis is running the failing example it will report (the last run of a search)."""
    from hypothesis.control import current_build_context, currently_in_test_context

    return currently_in_test_context() and bool(getattr(current_build_context(), "is_final", False))


def judged(fn: _Fn) -> _Fn:
    """Wrap a rule or invariant: skip it once the run halted, and halt on a disabled clause
    or once the script is longer than the shortest failing one (except in Hypothesis's final
    run: the example it reports is the least by its own order, which may have the longer
    script).  Hypothesis calls it with keyword arguments only; ``before_step`` hears of each
    call it runs."""

    @functools.wraps(fn)
    def run(self: LifecycleMachine, **kwargs: Any) -> Any:
        if not self.halted and self.shortest.exceeded(len(self.script)) and not final_run():
            self.halted = True
        if self.halted:
            return None
        self.before_step(fn.__name__, kwargs)
        try:
            return fn(self, **kwargs)
        except _Halted:
            self.halted = True
            return None

    return run  # type: ignore[return-value]


PICK = st.integers(0, 7)
"""A rule argument that ``choose`` turns into one of the candidates."""


def choose(pick: int, candidates: list[Any]) -> Any:
    """The candidate a ``PICK`` draw names, whatever the number of candidates.

    When the shrinker deletes an earlier step, later steps may see a different
    number of candidates; a fixed-range index keeps their draws aligned.
    """
    return candidates[pick % len(candidates)]


ANY = object()
"""``must_raise(..., returns=ANY)``: the call may also return anything, as long as it changes nothing."""

# An attribute after a dot, or a string key looked up on an event (``e['index']``) or a record (``...]['room']``);
# owner and pin names in ``pool.tables['a']`` are data, not published names.
_SURFACE = re.compile(r"\.([A-Za-z_]\w*)|(?:\be|\])\['([A-Za-z_]\w*)'\]")
_MAPPING_METHODS = frozenset({"get", "items", "keys", "values"})


def surface_names(expr: str) -> set[str]:
    """The published names (attributes, record and event fields) a read written as ``expr`` touches."""
    return {a or k for a, k in _SURFACE.findall(expr)} - _MAPPING_METHODS


def field_of(obj: Any, name: str) -> Any:
    """A field of plain data whose form the published text leaves open: a mapping's key or an attribute."""
    return obj[name] if issubclass(type(obj), Mapping) else getattr(obj, name)


def field_expr(variable: str, obj: Any, name: str) -> str:
    """How ``field_of(obj, name)`` reads in a replay script."""
    return f"{variable}[{name!r}]" if issubclass(type(obj), Mapping) else f"{variable}.{name}"  # type(): no code of obj


def _exception_name(exc: type[BaseException]) -> str:
    return exc.__name__ if getattr(builtins, exc.__name__, None) is exc else "Exception"


def _names(types: tuple[type[BaseException], ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def import_lines(impl: object) -> list[str]:
    """The replay script's header: where PagedKV, RecomputeRequest and TransferManager come from."""
    names = ", ".join(n for n in dict.fromkeys(("PagedKV", *PARTS.values())) if hasattr(impl, n))
    lines = ["from contextlib import suppress"]
    name, path = getattr(impl, "__name__", None), getattr(impl, "__file__", None)
    if inspect.ismodule(impl) and isinstance(name, str) and not name.startswith("cbatch_impl_"):
        lines.append(f"from {name} import {names}")
    elif inspect.ismodule(impl) and isinstance(path, str):
        stem = os.path.splitext(os.path.basename(path))[0]
        lines += ["import sys", f"sys.path.insert(0, {os.path.dirname(os.path.abspath(path))!r})",
                  f"from {stem} import {names}"]
    else:
        lines.append(f"# {names}: the classes of the implementation under test")
    return lines


class LifecycleMachine(RuleBasedStateMachine):
    """Judged calls, the script, and the pool checks; ``impl``, ``part`` and ``disabled`` are bound by ``bind``."""

    impl: Any = None
    part = ""
    disabled: frozenset[str] = frozenset()
    header: tuple[str, ...] = ()
    read_log: set[tuple[str, str]] | None = None  # when a set: every (clause, published name) a check reads
    shortest = Shortest()  # each class made by ``bind`` gets its own
    stops: list[BaseException] = []  # likewise: what ended its search early (``stop_if_timed_out``, a CallStopped)
    held: set[str] = set()  # likewise: the clauses judged (a check ran to its end and held) on any run

    def __init__(self) -> None:
        super().__init__()
        self.halted = False
        self.failed = False
        self.script: list[str] = list(self.header)
        self.after: list[PoolOracle | None] = [None] * max(len(self.header) - 1, 0)  # see ``record``
        self.pool: Any = None
        self.oracle = PoolOracle(1, 1)  # replaced by start_pool
        self.started = False
        self.binding: dict[int, Any] = {}  # oracle page -> the implementation's page id

    def before_step(self, name: str, kwargs: dict[str, Any]) -> None:
        """Called as a judged rule or invariant ``name`` starts, with its arguments (plain data); nothing here.

        A machine whose implementation lives elsewhere overrides it to match
        the step with that implementation's own run of it (``sandbox.search``);
        the step's body, and so every check, then runs here as usual.
        """

    # ------------------------------------------------------------- verdicts

    def fail(self, clause: str, message: str, *replay: str) -> None:
        """Raise the violation of ``clause`` (or halt if it is disabled); ``replay`` ends the script."""
        assert clause in PART_CLAUSES[self.part], f"{clause} is not a clause of the {self.part} part"
        if clause in self.disabled:
            raise _Halted(clause)
        self.failed = True
        self.shortest.note(len(self.script))
        raise self.violation(clause, message, replay)

    def violation(self, clause: str, message: str, replay: tuple[str, ...]) -> LifecycleViolation:
        """The violation of ``clause``: its replay is the script so far, then ``replay``; with the oracle's
        pool after each line (the lines from the script's last on see the pool as it is now)."""
        lines = "\n".join([*self.script, *replay]).splitlines()
        now = self.oracle.copy() if self.started else None
        pools = [*self.after, *[now] * (len(lines) - len(self.after))][: len(lines)]
        return LifecycleViolation(clause, message, "\n".join(lines), tuple(pools))

    def hold(self, clause: str) -> None:
        """Note that a check of ``clause`` ran to its end and held on this run (see ``held``)."""
        self.held.add(clause)

    def stop_if_timed_out(self, clause: str, code: str, exc: Exception) -> None:
        """End the search if ``exc`` says the call ``code`` did not return in time (``StoppedViolation``)."""
        if isinstance(exc, CallTimedOut):
            self.failed = True
            stack = getattr(exc, "stack", "")  # a sandbox child's stack shortly before the limit, if it sent one
            where = ("\n  its stack when it was stopped (most recent call last):\n"
                     + "\n".join("  " + line for line in stack.rstrip().splitlines())) if stack else ""
            stop = StoppedViolation(self.violation(clause, f"{code} did not return: {exc}{where}", (code,)))
            self.stops.append(stop)  # should Hypothesis report its own error for the example this cuts short
            raise stop

    def record(self, line: str) -> None:
        """Append ``line`` to the script.  Every step brings the oracle up to date before the next line is
        recorded, so the oracle now is the pool after the line before: ``after`` keeps a copy of it (None
        while there is no pool) for every line but the last."""
        if self.script:
            self.after.extend([self.oracle.copy() if self.started else None] * (1 + self.script[-1].count("\n")))
        self.script.append(line)

    def observe(self, clause: str, expr: str, fn: Callable[[], Any], *, data: bool = True) -> Any:
        """Evaluate a read of the implementation's state; an exception violates ``clause``.  With ``data``
        (a value the checks compare and print, not an object to call) it is taken through the trust boundary
        (``plain``): what is not plain data violates ``clause`` too."""
        if self.read_log is not None:
            self.reading(clause, *surface_names(expr))
        try:
            value = fn()
        except Exception as exc:
            self.stop_if_timed_out(clause, expr, exc)
            self.fail(clause, f"{expr} raised {exception_text(exc)}", expr)
        return self.checked(clause, expr, value) if data else value

    def self_check(self, expr: str, fn: Callable[[], Any]) -> None:
        """Run one of the implementation's own ``check()`` methods: raising violates ``lifecycle.self_check``;
        returning judges it (it is the whole check)."""
        self.observe("lifecycle.self_check", expr, fn, data=False)
        self.hold("lifecycle.self_check")

    def checked(self, clause: str, expr: str, value: Any) -> Any:
        """``value``, which ``expr`` gave, as plain data (``plain(..., lifecycle=True)``); else a violation of
        ``clause`` naming where it is not."""
        try:
            value = plain(value, lifecycle=True)
        except NotPlain as exc:
            self.fail(clause, f"{expr} gave {exc.problem}" + (f" at {exc.path}" if exc.path else ""), expr)
        self.hold(clause)
        return value

    def reading(self, clause: str, *names: str) -> None:
        """Log the published names a check of ``clause`` reads (see ``read_log``)."""
        if self.read_log is not None:
            self.read_log.update((clause, name) for name in names)

    def call(self, clause: str, code: str, fn: Callable[..., Any], *args: Any, why: str = "",
             capture: bool = False) -> Any:
        """Run a call that must not raise; record it (as ``_ = code`` with ``capture``) and return its result."""
        try:
            result = fn(*args)
        except Exception as exc:
            self.stop_if_timed_out(clause, code, exc)
            self.fail(clause, f"{code} raised {exception_text(exc)}{why and f' ({why})'}{_crash(exc)}", code)
        self.record(f"_ = {code}" if capture else code)
        if not capture:
            self.hold(clause)
            return result
        return self.checked(clause, code, result)

    def must_raise(self, clause: str, code: str, fn: Callable[..., Any], *args: Any,
                   expected: tuple[type[BaseException], ...], returns: Any = (), why: str = "") -> Any:
        """Run a call that must raise one of ``expected`` (or return one of ``returns``, by identity; any value
        when ``returns`` is ``ANY``)."""
        try:
            result = fn(*args)
        except expected as exc:
            self.record(f"with suppress({_exception_name(type(exc))}): {code}")
            self.hold(clause)
            return exc
        except Exception as exc:
            self.stop_if_timed_out(clause, code, exc)
            allowed = _names(expected) + (" or return" if returns is ANY else
                                          "".join(f" or return {value!r}" for value in returns))
            self.fail(clause, f"{code} raised {exception_text(exc)}; expected {allowed}{why and f' ({why})'}"
                              f"{_crash(exc)}", code)
        if returns is ANY or any(result is value for value in returns):
            self.record(code)
            self.hold(clause)
            return result
        allowed = _names(expected) + "".join(f" or return {value!r}" for value in returns)
        self.fail(clause, f"{code} returned {_shown(result)}; expected it to raise {allowed}{why and f' ({why})'}",
                  f"try: _ = {code}", f"except ({', '.join(_exception_name(t) for t in expected)},): pass",
                  f"else: raise AssertionError(f'returned {{_!r}}, expected {allowed}')")
        return None

    def expect(self, ok: bool, clause: str, message: str, replay: str) -> None:
        if not ok:
            self.fail(clause, message, replay)
        self.hold(clause)

    def expect_result(self, clause: str, code: str, got: Any, want: Any, why: str = "") -> None:
        """Judge the result of the last ``call(..., capture=True)``: ``got is want``."""
        self.expect(got is want, clause, f"{code} returned {got!r}, expected {want!r}{why and f' ({why})'}",
                    f"assert _ is {want!r}, _")

    def attribute(self, clause: str, variable: str, obj: Any, name: str, *, data: bool = True) -> Any:
        return self.observe(clause, f"{variable}.{name}", lambda: getattr(obj, name), data=data)

    def member(self, clause: str, variable: str, obj: Any, name: str) -> Any:
        """A field of plain data the published text shows in neither form: a mapping's key or an attribute."""
        return self.observe(clause, field_expr(variable, obj, name), lambda: field_of(obj, name))

    # ------------------------------------------------------------------ pool

    def start_pool(self, capacity: int, block_size: int) -> None:
        code = f"pool = PagedKV({capacity}, {block_size})"
        self.pool = self.observe(PC, code, lambda: self.impl.PagedKV(capacity, block_size), data=False)
        self.record(code)
        self.oracle = PoolOracle(capacity, block_size)
        self.started = True

    def readable(self) -> list[Hashable]:
        """Owners whose rows the oracle knows (every owner but an unpublished transfer destination)."""
        return [owner for owner in self.oracle.tables if not self.oracle.has_placeholders(owner)]

    def expect_free(self, clause: str, context: str) -> None:
        got = self.observe(clause, "len(pool.free)", lambda: len(self.pool.free))
        want = self.oracle.free()
        self.expect(got == want, clause,
                    f"after {context}: len(pool.free) == {got}, expected {want} of {self.oracle.capacity}",
                    f"assert len(pool.free) == {want}, len(pool.free)")

    def expect_rows(self, clause: str, owner: Hashable, context: str) -> None:
        got = self.observe(clause, f"pool.read({owner!r})", lambda: self.pool.read(owner))
        want = self.oracle.history(owner)
        self.expect(got == want, clause, f"after {context}: pool.read({owner!r}) == {got!r}, expected {want!r}",
                    f"assert pool.read({owner!r}) == {want!r}, pool.read({owner!r})")

    def expect_owners(self, clause: str, context: str) -> None:
        """pool.tables and pool.transfers name exactly the oracle's owners and pins."""
        for attr, want in (("tables", set(self.oracle.tables)), ("transfers", set(self.oracle.pins))):
            got = self.observe(clause, f"set(pool.{attr})", lambda attr=attr: set(getattr(self.pool, attr)))
            self.expect(got == want, clause, f"after {context}: set(pool.{attr}) == {got!r}, expected {want!r}",
                        f"assert set(pool.{attr}) == {want!r}, set(pool.{attr})")

    def expect_frozen_pins(self, clause: str, context: str) -> None:
        """Every pin's pages still read the rows the oracle says they hold (but an unpublished transfer
        destination's: its rows are open until complete() copies the snapshot)."""
        known = [name for name in self.oracle.pins if None not in self.oracle.pinned_rows(name)]
        if not known:
            return
        probe = next(iter(self.observe(clause, "pool.pages", lambda: list(self.pool.pages.values()), data=False)), None)
        for name in known:
            expr = f"[t for p in pool.transfers[{name!r}] for t in {field_expr('pool.pages[p]', probe, 'tokens')}]"
            got = self.observe(clause, expr, lambda name=name: [
                t for p in self.pool.transfers[name] for t in field_of(self.pool.pages[p], "tokens")])
            want = self.oracle.pinned_rows(name)
            self.expect(got == want, clause, f"after {context}: pin {name!r} reads {got!r}, expected {want!r}",
                        f"assert {expr} == {want!r}")

    def pool_create(self, owner: Hashable, clause: str = "lifecycle.owner_names") -> None:
        self.call(clause, f"pool.create({owner!r})", self.pool.create, owner)
        self.oracle.create(owner)

    def pool_release(self, owner: Hashable, clause: str) -> None:
        code = f"pool.release({owner!r})"
        self.call(clause, code, self.pool.release, owner)
        self.oracle.release(owner)
        self.expect_free(clause, code)

    def pool_append(self, owner: Hashable, token: int, others: str = "lifecycle.cow_isolation") -> bool:
        """Append one row on both sides; judge the outcome, every readable owner, every pin and the free count."""
        code = f"pool.append({owner!r}, {token!r})"
        free = self.oracle.free()
        needs, copies = self.oracle.needs_page(owner), self.oracle.copies_tail(owner)
        why = (f"{'copying the shared or pinned partial tail' if copies else 'a new page' if needs else 'no page'} "
               f"needed, {free} free")
        clause = "lifecycle.append_atomic"
        if needs and not free:
            self.must_raise(clause, code, self.pool.append, owner, token, expected=(MemoryError,), why=why)
        else:
            self.call(clause, code, self.pool.append, owner, token, why=why)
            self.oracle.append(owner, token)
        self.expect_rows(clause, owner, code)
        for other in self.readable():
            if other != owner:
                self.expect_rows(others, other, code)
        self.expect_frozen_pins(others, code)
        self.expect_free(clause, code)
        return not (needs and not free)

    def pool_append_all(self, owner: Hashable, tokens: list[int]) -> int:
        """Append rows one by one until the first MemoryError; return how many were written."""
        for written, token in enumerate(tokens):
            if not self.pool_append(owner, token):
                return written
        return len(tokens)

    def pool_pin(self, owner: Hashable, name: Hashable) -> None:
        code = f"pool.pin({owner!r}, {name!r})"
        clause = "lifecycle.pin_retains"
        got = self.call(clause, code, self.pool.pin, owner, name, capture=True)
        want = self.observe(clause, f"pool.tables[{owner!r}]", lambda: tuple(self.pool.tables[owner]))
        ok = isinstance(got, (tuple, list)) and tuple(got) == want
        self.expect(ok, clause,
                    f"{code} returned {got!r}, expected the owner's page ids {want!r}",
                    f"assert tuple(_) == tuple(pool.tables[{owner!r}]), _")
        self.oracle.pin(owner, name)
        self.expect_free(clause, code)

    def pool_unpin(self, name: Hashable, clause: str = "lifecycle.pin_retains") -> None:
        code = f"pool.unpin({name!r})"
        self.call(clause, code, self.pool.unpin, name)
        self.oracle.unpin(name)
        self.expect_free(clause, code)

    # ------------------------------------------------------------ invariants

    def check_views(self, context: str) -> None:
        """The published views against the oracle, up to the choice of page ids."""
        pool, oracle = self.pool, self.oracle
        free = self.observe(PC, "list(pool.free)", lambda: list(pool.free))
        self.expect(len(set(free)) == len(free), PC, f"after {context}: pool.free lists a page twice: {free!r}",
                    "assert len(set(pool.free)) == len(pool.free), pool.free")
        pages = self.observe(PC, "dict(pool.pages)", lambda: dict(pool.pages), data=False)  # page records
        self.checked(PC, "set(pool.pages)", set(pages))
        both = sorted(set(free) & set(pages), key=repr)
        self.expect(not both, PC, f"after {context}: pages {both!r} are in pool.free and in pool.pages",
                    "assert not set(pool.free) & set(pool.pages)")
        self.expect_free(PC, context)
        self.expect_owners(PV, context)
        live = set(oracle.rows)
        self.binding = {page: pid for page, pid in self.binding.items() if page in live}
        taken = {pid: page for page, pid in self.binding.items()}
        views = [(f"pool.tables[{owner!r}]", table, "tables", owner) for owner, table in oracle.tables.items()]
        views += [(f"pool.transfers[{name!r}]", held, "transfers", name) for name, held in oracle.pins.items()]
        for expr, want, attr, name in views:
            got = self.observe(PV, expr, lambda attr=attr, name=name: list(getattr(pool, attr)[name]))
            self.expect(len(got) == len(want), PV, f"after {context}: {expr} == {got!r}, expected {len(want)} pages",
                        f"assert len({expr}) == {len(want)}, {expr}")
            for index, (page, pid) in enumerate(zip(want, got)):
                known = self.binding.get(page)
                if known is None:
                    self.expect(pid not in taken, PV,
                                f"after {context}: {expr}[{index}] is page {pid!r}, which holds other rows",
                                f"assert {expr}[{index}] != {pid!r}")
                    self.binding[page], taken[pid] = pid, page
                else:
                    self.expect(pid == known, PV,
                                f"after {context}: {expr}[{index}] is page {pid!r}, expected the shared page {known!r}",
                                f"assert {expr}[{index}] == {known!r}, {expr}")
        held = set(taken)
        self.expect(set(pages) == held, PC,
                    f"after {context}: pool.pages holds {sorted(pages, key=repr)!r}, expected the held pages "
                    f"{sorted(held, key=repr)!r}", f"assert set(pool.pages) == {held!r}, set(pool.pages)")
        for page, pid in self.binding.items():
            for name, want in (("owners", oracle.owners_of(page)), ("pins", oracle.pins_of(page))):
                expr = field_expr(f"pool.pages[{pid!r}]", pages[pid], name)
                got = self.observe(PV, expr, lambda pid=pid, name=name: set(field_of(pages[pid], name)))
                self.expect(got == want, PV, f"after {context}: {expr} == {got!r}, expected {want!r}",
                            f"assert set({expr}) == {want!r}, {expr}")
            if None in oracle.rows[page]:
                continue  # a transfer destination complete() has not published: any rows, or none yet
            expr = field_expr(f"pool.pages[{pid!r}]", pages[pid], "tokens")
            got = self.observe(PV, expr, lambda pid=pid: list(field_of(pages[pid], "tokens")))
            self.expect(got == oracle.rows[page], PV,
                        f"after {context}: {expr} == {got!r}, expected {oracle.rows[page]!r}",
                        f"assert list({expr}) == {oracle.rows[page]!r}, {expr}")

    @invariant()
    @judged
    def pool_consistent(self) -> None:
        if not self.started:
            return
        self.check_views("the last step")
        for owner in self.readable():
            self.expect_rows("lifecycle.read_matches_history", owner, "the last step")
        self.self_check("pool.check()", self.pool.check)

    # -------------------------------------------------------------- teardown

    def cleanup(self) -> None:
        """Drop what the run still holds, through the implementation and the oracle (subclasses extend it)."""

    def teardown(self) -> None:
        if self.failed or self.halted or not self.started:
            return
        try:
            self.record("# teardown")
            self.cleanup()
            assert not self.oracle.rows, "oracle bug: cleanup left pages in use"
            self.expect_free("lifecycle.teardown_frees_all", "teardown")
            self.expect_owners("lifecycle.teardown_frees_all", "teardown")
            pages = self.observe("lifecycle.teardown_frees_all", "pool.pages", lambda: len(self.pool.pages))
            self.expect(pages == 0, "lifecycle.teardown_frees_all", f"after teardown pool.pages holds {pages} pages",
                        "assert not pool.pages, pool.pages")
        except _Halted:
            self.halted = True


def bind(base: type[LifecycleMachine], part: str, impl: object,
         disabled: frozenset[str] = frozenset()) -> type[RuleBasedStateMachine]:
    """A machine class for ``part`` bound to ``impl``; violations of ``disabled`` clauses halt a run instead."""
    unknown = disabled - set(LIFECYCLE_CLAUSES)
    if unknown:
        raise ValueError(f"unknown lifecycle clauses {sorted(unknown)}")
    attrs = {"impl": impl, "part": part, "disabled": frozenset(disabled), "header": tuple(import_lines(impl)),
             "shortest": Shortest(), "stops": [], "held": set(), "__doc__": base.__doc__, "__module__": base.__module__}
    return type(f"{part.capitalize()}Lifecycle", (base,), attrs)


def _shown(value: Any) -> str:
    """``repr`` of a value the implementation returned, once it is plain data; else what it is."""
    try:
        return repr(plain(value, lifecycle=True))
    except NotPlain:
        return describe(value)


def _crash(exc: BaseException) -> str:
    """The implementation's own frames of an unexpected exception (file and line), as lines to append to a
    violation's message; nothing when every frame is the kit's (a remote object's proxy, for one)."""
    frames = implementation_frames(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return ""
    text = "".join(frames.format()) + "".join(traceback.format_exception_only(type(exc), exc))
    return "\n" + "\n".join(stack_lines(text, stopped=False))
