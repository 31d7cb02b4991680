"""What an implementation supports: settings it declares, and the kit's probe for those it did not.

Support is a property of settings, never of a trace.  An implementation names
what it does not support as *settings*: ``"key"`` (every workload whose config
names that key) or ``"key=value"`` (one value of it; the value is written as in
``setting_text``: ``admission=optimistic``, ``release_delay=3``).  It declares
them up front (``CBATCH_UNSUPPORTED`` on the callable or module, ``unsupported``
in a program submission's ``cbatch.toml``), and a workload whose config
matches one is skipped without a run.  One that declines a workload it did not
declare (``NotImplementedError``, exit 3) is probed: the kit runs its own small
trace, ``PROBE_TRACE``, once per distinct config, with exactly the workload's
settings.  Declined there too, the settings are unsupported; run there, the
decline was of the trace, and the workload fails ``completes``.  The rubric's
``[grading] optional`` uses the same setting strings (``matching``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["MAX_SETTINGS", "PROBE_TRACE", "matching", "parse_settings", "setting_text", "settings_key",
           "distinct_settings"]

MAX_SETTINGS = 64
"""The most setting strings one declaration (or the rubric's ``optional``) may name."""
_MAX_TEXT = 200

PROBE_TRACE: tuple[dict[str, Any], ...] = (
    {"time": 0, "event": "arrival", "id": "probe", "prompt_tokens": 1, "output_tokens": 1},
)
"""The kit's probe: one one-token request, valid under every valid config (rejected where it cannot fit)."""


def setting_text(key: str, value: Any) -> str:
    """``key=value`` as declarations write it: a string as is, anything else as JSON (``true``, ``3``)."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)}"


def parse_settings(value: Any, where: str) -> tuple[str, ...]:
    """``value`` as a tuple of setting strings; ValueError (naming ``where``) unless it is a list or tuple of
    at most ``MAX_SETTINGS`` non-empty one-line strings ``key`` or ``key=value``."""
    example = '["admission=optimistic", "release_delay"]'
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} must be a list of settings, \"key\" or \"key=value\" (e.g. {example}), "
                         f"got {type(value).__name__} {value!r:.80}")
    if len(value) > MAX_SETTINGS:
        raise ValueError(f"{where} names {len(value)} settings; at most {MAX_SETTINGS}")
    out = []
    for item in value:
        key, eq, text = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not key.isidentifier() or (eq and not text) or len(item) > _MAX_TEXT \
                or any(ch in item for ch in "\0\n\r"):
            raise ValueError(f"{where}: each setting is \"key\" or \"key=value\", a config key and maybe one "
                             f"value of it (one line, at most {_MAX_TEXT} characters, e.g. {example}), "
                             f"got {item!r:.80}")
        out.append(item)
    return tuple(dict.fromkeys(out))


def matching(config: Mapping[str, Any], settings: tuple[str, ...]) -> list[str]:
    """The strings of ``settings`` that ``config`` asks for: a ``key`` it names, or a ``key=value`` it sets."""
    asked = set(config) | {setting_text(k, v) for k, v in config.items()}
    return [s for s in settings if s in asked]


def distinct_settings(config: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """The settings of ``config`` that are not ``base``'s (``key=value``): what sets it apart, for messages."""
    return [setting_text(k, v) for k, v in config.items() if k not in base or base[k] != v]


def settings_key(config: Mapping[str, Any]) -> str:
    """One string per distinct config (key order aside): the probe's cache key."""
    return json.dumps(config, sort_keys=True, default=str)
