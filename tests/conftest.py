"""Shared pytest configuration for the pytest-cbatch test suite."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

# Tests that share a module-scoped fixture run on one xdist worker.
from xdist_groups import pytest_collection_modifyitems, pytest_configure, pytest_configure_node  # noqa: F401

BRIEF_PROFILE = """
from hypothesis import settings

settings.register_profile("brief", max_examples=5, derandomize=True, database=None, deadline=None)
"""


UNSHRUNK_PROFILE = """
from hypothesis import HealthCheck, Phase, settings

settings.register_profile("ci-unshrunk", max_examples=100, derandomize=True, database=None, deadline=None,
                          stateful_step_count=50, phases=(Phase.explicit, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
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


@pytest.fixture
def unshrunk_profile(request: pytest.FixtureRequest) -> list[str]:
    """Arguments that give a pytester run the kit's ci profile without its shrink phase.

    For a test that asks whether a derandomized search finds a bug, not how small its example gets: the
    examples drawn, and so whether and where the search fails, are the ci profile's, and the failure names
    the same clause; shrinking it took tens of seconds.  With --run-slow the run keeps the ci profile.
    """
    if request.config.getoption("--run-slow"):
        return []
    pytester = request.getfixturevalue("pytester")
    pytester.makepyfile(cbatch_unshrunk=UNSHRUNK_PROFILE)  # a plugin (-p): also where no conftest is collected
    return ["-p", "cbatch_unshrunk", "--hypothesis-profile=ci-unshrunk"]


@pytest.fixture(scope="session", autouse=True)
def _subprocess_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Let the Python processes the tests start share their caches for the whole run, outside the source tree.

    Many tests run pytest in a subprocess (pytester), each importing pytest's plugins, hypothesis and the
    kit, and some torch.  Where PYTHONDONTWRITEBYTECODE is set, every one of them compiles, and
    assertion-rewrites, all of that again (about a second each); a PYTHONPYCACHEPREFIX in this run's
    temporary folder (shared by xdist workers) compiles it once and writes nothing next to any source.
    Likewise each fresh project folder would make hypothesis parse the kit's modules for constants
    again; one HYPOTHESIS_STORAGE_DIRECTORY keeps that cache (the runs that execute hypothesis tests use
    the kit's ci profile or the brief one, neither of which keeps an example database, so no example
    found in one test is replayed in another).  This process keeps its own settings; only the
    environment its children inherit changes.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPYCACHEPREFIX", str(root / "pycache"))
        patch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        patch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(root / "hypothesis"))
        yield

