"""Shared pytest configuration for the pytest-cbatch test suite."""


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="run the heavier tests and multiply randomized example counts by 10",
    )
