#!/usr/bin/env python3
"""The shortest-job-first scheduler behind the kit's ``exec:`` protocol.

Check it from the repository root, with nothing installed but the kit::

    pytest --cbatch-impl="exec:python examples/exec_scheduler.py"

The protocol, for a scheduler written in any language, in short (the whole of it, every
statement pinned by a test, is ``docs/exec-protocol.md``):

* **Input.**  One JSON object on stdin: ``{"trace": [...], "config": {...}}``.
  ``trace`` is the list of trace lines (``{"time", "event": "arrival", "id",
  "prompt_tokens", "output_tokens"}`` and ``{"time", "event": "cancel",
  "id"}``; see ``reference/scheduler_sim.py``).  ``config`` holds the settings
  of the run: ``capacity``, ``block_size``, ``token_budget``, ``max_active``,
  ``prefill_chunk``, ``release_delay``, ``policy`` and, for some workloads,
  ``admission``.  A setting that is absent takes the scheduler's default.
* **Exit 0.**  The report, one JSON document, on stdout and nothing else there
  (diagnostics go to stderr).  Its shape is ``schemas/report.schema.json``;
  its meaning is the contract (the ``pytest_cbatch.contract`` package).  The report's
  ``config`` must record every setting that was asked for, with its value.
* **Exit 3.**  A setting this scheduler does not support (here: any setting
  but the seven above, or ``admission`` other than ``"reserve"``); the last
  line of stderr says which.  The kit skips that workload.
* **Any other non-zero exit** (here 2).  The input is invalid: a malformed
  trace or config, or stdin that is not such a JSON object.  The last line of
  stderr is the message.  Invalid input must never produce a report.

The same input must always give the same output.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for the sibling sjf_scheduler.py

from sjf_scheduler import simulate  # noqa: E402  (needs the path above)

EXIT_REFUSED = 2
EXIT_UNSUPPORTED = 3

SETTINGS = frozenset(inspect.signature(simulate).parameters) - {"trace"}


class UnsupportedSetting(Exception):
    """The run asks for a setting this scheduler does not implement."""


def read_request(text: str) -> tuple[Any, dict[str, Any]]:
    """Split the stdin document into (trace, config); ValueError if it is not one."""
    try:
        request = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stdin: not JSON: {exc}") from None
    if not isinstance(request, dict) or set(request) != {"trace", "config"}:
        raise ValueError('stdin: expected a JSON object with exactly the keys "trace" and "config"')
    if not isinstance(request["config"], dict):
        raise ValueError(f"config: expected a JSON object, got {type(request['config']).__name__}")
    return request["trace"], request["config"]


def supported_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``simulate``; UnsupportedSetting for anything it cannot honour.

    ``admission: "reserve"`` is accepted and dropped: reserving every page up
    front is what this scheduler always does.
    """
    extra = sorted(set(config) - SETTINGS - {"admission"})
    if extra:
        raise UnsupportedSetting(f"setting {extra[0]!r} is not supported (supported: {', '.join(sorted(SETTINGS))})")
    if config.get("admission", "reserve") != "reserve":
        raise UnsupportedSetting(f"admission {config['admission']!r} is not supported, only 'reserve'")
    return {key: value for key, value in config.items() if key != "admission"}


def main() -> int:
    """Run one request from stdin; return the exit status."""
    try:
        trace, config = read_request(sys.stdin.read())
        report = simulate(trace, **supported_settings(config))
    except UnsupportedSetting as exc:
        print(f"unsupported: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if "admission" in config:
        report["config"]["admission"] = config["admission"]
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
