"""Live servers: replay traces over HTTP, an embedded OpenAI-compatible server, load and invariance sweeps.

Modules (one concept each): ``sse`` (data frames and token counting),
``client`` (one streamed request), ``metrics`` (vLLM ``bench serve``
formulas), ``replay`` (the ``http://`` implementation), ``load``,
``invariance``, ``engine`` (the reference ``Scheduler`` in wall-clock
ticks), ``backends`` and ``tiny`` (token producers), ``prometheus``,
``server``, ``local_server`` (an engine's server started for a test or a job), ``plot`` and ``cli``.

Importing this package imports nothing beyond the standard library; the
modules that need aiohttp or matplotlib import them through :func:`require`,
which turns a missing extra into one clear :class:`MissingExtra` error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtra", "require", "LiveError"]

_EXTRAS = {"aiohttp": "live", "matplotlib": "plot", "torch": "gpu"}


class MissingExtra(ImportError):
    """An optional dependency of a live feature is not installed; the message names the pip command."""


class LiveError(Exception):
    """A live server could not be used: unreachable, an HTTP error, or a body that is not what was asked.

    The message always names the URL and what was wrong.
    """


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise MissingExtra naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], "live")
        raise MissingExtra(f"{feature} needs {module.split('.')[0]} ({exc}); "
                           f"install it with: pip install 'pytest-cbatch[{extra}]'") from None
