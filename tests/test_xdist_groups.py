"""The kit's own ``-n 2`` runs build each module-scoped fixture once (xdist_groups.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def test_a_module_fixture_is_built_once_under_two_workers(pytester: pytest.Pytester, monkeypatch) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest(
        "from xdist_groups import pytest_collection_modifyitems, pytest_configure, pytest_configure_node\n"
    )
    # Eight tests share the fixture, eight do not: plain ``load`` sends the first four to two workers.
    shared = "\n".join(f"def test_shared_{i}(built):\n    pass\n" for i in range(8))
    alone = "\n".join(f"def test_alone_{i}():\n    pass\n" for i in range(8))
    pytester.makepyfile(
        test_groups=f"""
import os
import pytest

@pytest.fixture(scope="module")
def built():
    with open({str(pytester.path / "built.txt")!r}, "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

{shared}
{alone}
"""
    )
    result = pytester.runpytest_subprocess("-n", "2", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    assert len((pytester.path / "built.txt").read_text().split()) == 1
    result.stdout.fnmatch_lines(["*PASSED test_groups.py::test_shared_0@test_groups.py*"])
    # The tests without the fixture join no group: xdist spreads them one by one.
    assert not [line for line in result.stdout.lines if "::test_alone_" in line and "@" in line]
