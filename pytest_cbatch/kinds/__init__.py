"""The built-in implementation kinds: one module per transport, each registered in the
entry-point group ``pytest_cbatch.kinds`` (see ``pyproject.toml`` and ``docs/kinds.md``).

* :mod:`.live` — ``http://`` and ``https://`` servers (imports ``pytest_cbatch.live`` only to build one);
* :mod:`.command` — ``exec:COMMAND``, a process speaking JSON (``docs/exec-protocol.md``);
* :mod:`.python` — files, ``module:attr``, folders, entry-point names and modules, run in process.

Nothing here is imported by the resolver (:mod:`pytest_cbatch.impls`) except through its entry point.
"""
