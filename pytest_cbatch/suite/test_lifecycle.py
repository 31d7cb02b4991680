"""Conformance: the KV lifecycle (allocator, preemption with recomputation, transfers).

One test per part, ids ``test_lifecycle[allocator|recompute|transfer]``. Each
judges every clause of the part (``pytest_cbatch.lifecycle.lifecycle_verdicts``, through
``pytest_cbatch.sandbox.lifecycle_verdicts_of``)
against the ``PagedKV``/``RecomputeRequest``/``TransferManager`` of the
namespace the implementation points at, and skips a part the namespace does
not provide.  Example counts come from the active Hypothesis profile.  A
failure lists every failing ``lifecycle.*`` clause (one bug does not hide the
next), each with its operations as runnable Python, and every clause no run
reached (not judged, naming the failing clause that stopped the runs first);
a part whose clauses all held where judged but some were never reached is a
skip that names them.  The clauses not judged travel with the report
(``cbatch_unjudged``) to the end-of-run summary.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from pytest_cbatch.bounded import CallStopped
from pytest_cbatch.lifecycle import LIFECYCLE_CLAUSES, PART_CLAUSES, PARTS, missing_parts
from pytest_cbatch.plugin import CbatchState, picture_line
from pytest_cbatch.sandbox import lifecycle_verdicts_of


@pytest.mark.parametrize("part", list(PARTS), ids=list(PARTS))
def test_lifecycle(part: str, cbatch_impl: Any, cbatch_state: CbatchState, request: pytest.FixtureRequest) -> None:
    request.node.user_properties += [("cbatch_clause", f"lifecycle.{part}"), ("cbatch_workload", part)]
    namespace = cbatch_impl.namespace
    reason = missing_parts(namespace).get(part)
    if reason is not None:
        pytest.skip(f"lifecycle {part}: {reason}")
    # Under --cbatch-isolate the sandbox child runs each search first (pytest_cbatch.sandbox.search).
    try:
        verdicts, note = lifecycle_verdicts_of(cbatch_impl, part, bounds=cbatch_impl.bounds)
    except CallStopped:  # a stuck example ends the part at once, unjudged; the test fails saying where it stuck
        request.node.user_properties.append(("cbatch_unjudged", ",".join(PART_CLAUSES[part])))
        raise
    if note:
        warnings.warn(note, stacklevel=1)
    failed = {cid: verdict for cid, verdict in verdicts.items() if verdict.status != "pass"}
    if not failed:
        return
    unjudged = [cid for cid, verdict in failed.items() if verdict.status == "skip"]
    request.node.user_properties.append(("cbatch_unjudged", ",".join(unjudged)))
    if len(unjudged) == len(failed):
        pytest.skip(f"lifecycle {part}: {len(unjudged)} of {len(verdicts)} clauses not judged with "
                    f"--cbatch-impl={cbatch_impl.spec} (no failure; every other clause held): "
                    + "; ".join(f"{cid}: {failed[cid].message}" for cid in unjudged))
    lines = []
    for cid, verdict in failed.items():  # each message starts with its clause id
        lines.append(verdict.message.rstrip() if verdict.status == "fail" else
                     f"[{cid}] {verdict.status}: {verdict.message}\n  clause: {LIFECYCLE_CLAUSES[cid]}")
    broken = [cid for cid in failed if cid not in unjudged]
    lines.append(f"{len(broken)} of {len(verdicts)} lifecycle {part} clauses do not hold for "
                 f"--cbatch-impl={cbatch_impl.spec}: {', '.join(broken)}"
                 + (f"; {len(unjudged)} more not judged (not passed): {', '.join(unjudged)}" if unjudged else ""))
    rerun = f"pytest --cbatch-impl={cbatch_impl.spec} -k 'test_lifecycle and {part}'"
    lines.append(f"rerun: {rerun}")

    def page() -> str:
        from pytest_cbatch.picture import lifecycle_page

        return lifecycle_page(heading=f"lifecycle {part}: {len(failed)} clause(s) fail with {cbatch_impl.spec}",
                              failures=[(cid, v.message, v.steps) for cid, v in failed.items()], rerun=rerun)

    lines.append(picture_line(cbatch_state, f"lifecycle-{part}.html", page))
    pytest.fail("\n".join(lines), pytrace=False)
