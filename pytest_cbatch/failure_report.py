"""A failing conformance test's report: the explained, replayable violation, its trace file and its picture."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

from .run_state import CbatchState


def fail_clause(
    state: CbatchState,
    clause: str,
    workload: str,
    trace: list[dict[str, Any]],
    config: dict[str, Any],
    result: Any,
    *,
    shrink: bool = True,
) -> None:
    """Fail the current test with the explained, replayable violation of ``clause``."""
    from .explain import explain_failure, trace_jsonl
    from .runner import shrink_trace

    original = len(trace)
    if shrink and not result.stopped:
        smaller = shrink_trace(state.judge, clause, trace, config)
        if len(smaller) < len(trace):
            retry = state.judge.judge(clause, smaller, config)
            if retry.status == "fail":
                trace, result = smaller, retry
    path = _write_artifact(state.artifacts, f"{clause}-{workload}.jsonl", trace_jsonl(trace))
    text = explain_failure(spec=state.spec, replay_spec=state.impl.replay(), clause=clause, workload=workload,
                           violations=result.violations, trace=trace, config=config, report=result.report,
                           trace_path=path, shrunk_from=original, stack=result.stack, stopped=result.stopped)
    text += "\n" + _write_picture(state, clause, workload, trace, config, result, path, text)
    if result.stopped:
        raise RunawayFailure(text)
    pytest.fail(text, pytrace=False)


def _write_picture(state: CbatchState, clause: str, workload: str, trace: list[dict[str, Any]],
                   config: dict[str, Any], result: Any, trace_path: str, text: str) -> str:
    """Write the failure's page (``pytest_cbatch.picture``) beside its replay file; the line naming it."""
    from .explain import replay_command

    def page() -> str:
        from .picture import failure_page

        return failure_page(spec=state.spec, clause=clause, workload=workload, violations=result.violations,
                            trace=trace, report=result.report, text=text,
                            replay=replay_command(state.impl.replay(), trace_path, config, clause))

    return picture_line(state, f"{clause}-{workload}.html", page)


def picture_line(state: CbatchState, name: str, page: Callable[[], str]) -> str:
    """Write the page ``page()`` draws as ``name`` in the artifacts folder; the failure text's line naming it."""
    try:
        html = page()
    except Exception as exc:  # a picture never hides the verdict it illustrates
        return f"picture: not drawn ({type(exc).__name__}: {exc})"
    return f"picture: {_write_artifact(state.artifacts, name, html)} (open it in a browser)"


class RunawayFailure(BaseException):
    """A test's failure because the implementation was stopped for a limit.

    A BaseException, so Hypothesis does not shrink on it (each shrink step would
    wait out the limit again): the test ends at once with the trace that was
    stopped, and the plugin reports the text as an ordinary failure.
    """


def _write_artifact(folder: Path, name: str, text: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / safe
        tmp = folder / (safe + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        return f"<could not write {folder / safe}: {exc}>"
    return str(path.resolve())  # absolute: the replay command works from any directory
