"""The shipped conformance suite, collected by `pytest --cbatch-impl=SPEC`."""
