"""Record the corpus of published-format reports: ``python tests/reference/corpus/record.py``.

Each case is a fixed trace and config chosen to exercise one rule of the
published semantics (the name says which); ``cases.json`` stores the trace,
the config and the full report.  The tests replay every case through the
reference and through an independent naive model, and pin the hand-checked
facts of each case separately (tests/reference/test_scheduler_sim.py), so a
re-recording cannot silently bless a regression.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def a(t: int, rid: str, prompt: int, output: int) -> dict[str, Any]:
    return {"time": t, "event": "arrival", "id": rid, "prompt_tokens": prompt, "output_tokens": output}


def c(t: int, rid: str) -> dict[str, Any]:
    return {"time": t, "event": "cancel", "id": rid}


CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "builtin": ([a(0, "long", 8, 4), a(0, "short", 2, 2), a(1, "cancel-me", 6, 4), c(2, "cancel-me"),
                 a(2, "late", 3, 2)], {}),
    "builtin_serial": ([a(0, "long", 8, 4), a(0, "short", 2, 2), a(1, "cancel-me", 6, 4), c(2, "cancel-me"),
                        a(2, "late", 3, 2)], {"policy": "serial"}),
    "unsorted_trace_cancel_listed_first": ([c(1, "b"), a(1, "b", 1, 1), a(0, "a", 2, 1)], {}),
    "late_start_initial_snapshot": ([a(5, "x", 1, 1)], {}),
    "decode_rotation_offset": ([a(0, "a", 1, 1), a(0, "b", 1, 4), a(0, "c", 1, 4), a(0, "d", 1, 2)],
                               {"token_budget": 2}),
    "prefill_rotation": ([a(0, "p", 5, 1), a(0, "q", 5, 1), a(0, "r", 5, 1)], {"token_budget": 3}),
    "lowest_free_page_reuse": ([a(0, "a", 4, 1), a(0, "b", 4, 1), a(1, "c", 8, 1)],
                               {"capacity": 4, "release_delay": 0, "token_budget": 8, "prefill_chunk": 4}),
    "admission_blocked_every_tick": ([a(0, "big", 1, 8), a(0, "small", 1, 1)], {"capacity": 2}),
    "impossible_rejected_at_head": ([a(0, "first", 2, 2), a(0, "huge", 40, 1), a(0, "next", 1, 1)],
                                    {"policy": "serial"}),
    "impossible_cancelled_before_head": ([a(0, "first", 2, 2), a(0, "huge", 40, 1), c(1, "huge")],
                                         {"policy": "serial"}),
    "release_order_by_time_then_id": ([a(0, "b", 1, 1), a(0, "a", 1, 1)], {"release_delay": 2}),
    "cancel_ignored_after_finish": ([a(0, "r", 1, 1), c(1, "r"), c(1, "r")], {}),
    "cancel_queued_no_release": ([a(0, "a", 4, 4), a(0, "b", 2, 1), c(1, "b")], {"max_active": 1}),
}


def record() -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parents[2] / "reference"))
    from scheduler_sim import DEFAULT_CONFIG, simulate

    out = {}
    for name, (trace, overrides) in CASES.items():
        config = {k: v for k, v in {**DEFAULT_CONFIG, **overrides}.items() if k != "admission"}
        out[name] = {"trace": trace, "config": config, "report": simulate(trace, **config)}
    return out


if __name__ == "__main__":
    (HERE / "cases.json").write_text(json.dumps(record(), indent=1) + "\n", encoding="utf-8")
    print(f"recorded {len(CASES)} cases -> {HERE / 'cases.json'}")
