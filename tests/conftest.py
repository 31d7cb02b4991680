"""Shared pytest configuration for the pytest-cbatch test suite."""

from __future__ import annotations

import pytest

BRIEF_PROFILE = """
from hypothesis import settings

settings.register_profile("brief", max_examples=5, derandomize=True, database=None, deadline=None)
"""


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="run the heavier tests and multiply randomized example counts by 10",
    )


@pytest.fixture
def lifecycle_profile(request: pytest.FixtureRequest) -> list[str]:
    """Arguments that give a pytester run of the lifecycle suite a brief Hypothesis profile.

    The shipped ci profile runs 100 state-machine examples per part, twice
    (short and long runs); where a test checks what the plugin does rather
    than the machines, five are enough.  With --run-slow the run keeps the
    shipped profile and the project directory stays as the test made it.
    """
    if request.config.getoption("--run-slow"):
        return []
    pytester = request.getfixturevalue("pytester")
    pytester.makeconftest(BRIEF_PROFILE)
    return ["--hypothesis-profile=brief"]
