"""Implementation kinds are registered, not imported: the resolver asks the entry-point group
``pytest_cbatch.kinds``, a third party adds a SPEC form without touching the kit, and every SPEC
form's usage error stays one clear line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_cbatch.impls import (KIND_GROUP, ImplementationError, PythonImplementation, available_impls, available_kinds,
                                 resolve_impl)
from pytest_cbatch.reference.scheduler_sim import demo_trace
from pytest_cbatch.workloads import BASE_CONFIG

THIRD_PARTY = '''
from pytest_cbatch.impls import ImplementationError, Kind, PythonImplementation
from pytest_cbatch.reference.scheduler_sim import simulate


def _build(request):
    if not request.spec.endswith("reference"):
        raise ImplementationError("echo: knows only echo:reference")
    return PythonImplementation(request.spec, simulate, "the echo kind", request.bounds)


KIND = Kind(order=ORDER, form="echo:NAME", claims=lambda request: request.spec.startswith(CLAIMS), build=_build)
'''


def install_kind(site: Path, entry: str = "thirdparty_kind:KIND", order: int = 150, claims: str | None = "echo:",
                 module: str = THIRD_PARTY) -> Path:
    """A distribution ``thirdparty-kind`` in ``site`` (a folder for sys.path): its module and a .dist-info
    declaring one entry point ``echo`` in the kinds group, as pip would install it."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "thirdparty_kind.py").write_text(module.replace("ORDER", str(order)).replace("CLAIMS", repr(claims)))
    info = site / "thirdparty_kind-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-kind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{KIND_GROUP}]\necho = {entry}\n")
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary site folder on sys.path, for a distribution the test installs there."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "thirdparty_kind", raising=False)
    return folder


def test_the_builtin_kinds_are_registered_in_the_documented_order() -> None:
    assert [name for name, _ in available_kinds()] == [
        "http", "exec", "file", "object", "folder", "name", "folder-name", "module"]


def test_a_third_party_kind_resolves_its_spec_and_judges_it(site: Path) -> None:
    install_kind(site)
    impl = resolve_impl("echo:reference")
    assert isinstance(impl, PythonImplementation) and impl.source == "the echo kind"
    outcome = impl.run(demo_trace(), BASE_CONFIG)
    assert outcome.report is not None and outcome.refused is None
    with pytest.raises(ImplementationError, match=r"^--cbatch-impl 'echo:other': echo: knows only echo:reference$"):
        resolve_impl("echo:other")
    assert "echo:NAME" in _unknown_spec_error()


def test_a_kind_with_a_lower_order_is_asked_before_the_builtin_ones(site: Path) -> None:
    install_kind(site, order=50, claims="reference")
    assert resolve_impl("reference").source == "the echo kind"  # the name kind (600) never asked


def test_a_kind_that_does_not_load_or_is_no_kind_is_one_error_naming_it(site: Path) -> None:
    install_kind(site, entry="thirdparty_kind:MISSING")
    with pytest.raises(ImplementationError, match=r"kind 'echo' \(thirdparty_kind:MISSING.*does not load"):
        resolve_impl("reference")
    install_kind(site, entry="thirdparty_kind:_build")
    with pytest.raises(ImplementationError, match=r"kind 'echo' \(thirdparty_kind:_build\) is not a"):
        resolve_impl("reference")


def test_a_kind_that_breaks_on_a_spec_is_one_error_naming_it(site: Path) -> None:
    install_kind(site, claims=None)  # startswith(None): a TypeError for every SPEC
    with pytest.raises(ImplementationError, match=r"^--cbatch-impl 'x': the implementation kind 'echo' failed to "
                                                  r"read it: TypeError: "):
        resolve_impl("x")


def test_a_name_the_import_system_cannot_look_up_is_no_module(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spec(name: str) -> None:
        raise ValueError(f"{name}.__spec__ is None")  # what find_spec says of a __main__ run as a script

    monkeypatch.setattr("importlib.util.find_spec", no_spec)
    with pytest.raises(ImplementationError, match=r"^--cbatch-impl 'lookup_fails': not an installed implementation"):
        resolve_impl("lookup_fails")


def test_cbatch_impls_lists_the_kinds_in_the_order_they_are_asked(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_cbatch.cli import main

    install_kind(site)
    assert main(["impls", "--kinds"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [" 100 http = pytest_cbatch.kinds.live:KIND  (http://HOST:PORT)",
                         " 150 echo = thirdparty_kind:KIND  (echo:NAME)",
                         " 200 exec = pytest_cbatch.kinds.command:KIND  (exec:COMMAND)"], lines
    assert lines[-1] == " 800 module = pytest_cbatch.kinds.python:MODULE" and len(lines) == 9, lines
    install_kind(site, entry="thirdparty_kind:MISSING")
    assert main(["impls", "--kinds"]) == 2
    assert "kind 'echo' (thirdparty_kind:MISSING" in capsys.readouterr().err


def test_a_third_party_kind_runs_the_suite_under_pytest(pytester: pytest.Pytester, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    site = install_kind(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = pytester.runpytest_subprocess("--cbatch-impl=echo:reference", "-p", "no:cacheprovider",
                                           "-k", "test_contract and completes and demo")
    outcomes = result.parseoutcomes()  # numerics skip as a module where torch is missing
    assert outcomes.get("passed") == 2 and not outcomes.get("failed"), outcomes  # the demo workload, its serial twin
    result.stdout.fnmatch_lines(["*echo:reference (the echo kind*"])


@pytest.mark.parametrize("spec, imports", [
    ("", []),
    ("reference", ["pytest_cbatch.kinds.python"]),
    ("exec:true", ["pytest_cbatch.kinds.command"]),
])
def test_the_resolver_imports_no_transport_until_one_is_asked_for(spec: str, imports: list[str]) -> None:
    code = textwrap.dedent(f"""
        import json, sys
        from pytest_cbatch.impls import resolve_impl
        if {spec!r}:
            resolve_impl({spec!r})
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("pytest_cbatch.kinds.", "pytest_cbatch.live",
                                                                        "pytest_cbatch.sandbox", "aiohttp")))))
    """)
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert not [m for m in loaded if m.startswith(("pytest_cbatch.live", "pytest_cbatch.sandbox", "aiohttp"))], loaded
    for module in imports:
        assert module in loaded, loaded


def _unknown_spec_error() -> str:
    with pytest.raises(ImplementationError) as info:
        resolve_impl("no_such_implementation_anywhere")
    return str(info.value)


def test_an_unknown_spec_lists_the_installed_names_and_every_form() -> None:
    assert "reference" in available_impls()
    assert _unknown_spec_error() == (
        "--cbatch-impl 'no_such_implementation_anywhere': not an installed implementation, a file, a folder or an "
        "importable module.\n"
        f"  installed (pytest_cbatch.impls entry points): {', '.join(sorted(available_impls()))}\n"
        "  or give one of: http://HOST:PORT | exec:COMMAND | path/to/file.py[:attr] | package.module[:attr] | "
        "path/to/folder/")


@pytest.mark.parametrize("spec, message", [
    ("  ", "--cbatch-impl is empty"),
    ("missing.py", "--cbatch-impl 'missing.py': no such file 'missing.py'"),
    ("missing.py:simulate", "--cbatch-impl 'missing.py:simulate': no such file 'missing.py'"),
    ("sub/notes.txt", "--cbatch-impl 'sub/notes.txt': 'sub/notes.txt' is a file but not a .py file; give a Python "
                      "file, a submission folder, or exec:COMMAND to run a program"),
    ("nowhere/", "--cbatch-impl 'nowhere/': no such folder 'nowhere/' (looked in ROOT)"),
    ("sub/", "--cbatch-impl 'sub/': the folder holds neither scheduler_sim.py nor scheduler_faults.py"),
    ("sub/mine.py:nothing", "--cbatch-impl 'sub/mine.py:nothing': file 'sub/mine.py' has no attribute 'nothing'"),
    ("json:nothing", "--cbatch-impl 'json:nothing': module 'json' has no attribute 'nothing'"),
    ("exec:", "--cbatch-impl 'exec:': exec: needs a command, e.g. exec:'./my-scheduler --json'"),
    ("http://", "--cbatch-impl 'http://': expected http://HOST:PORT[/v1]"),
    ("http://h:1/v2", "--cbatch-impl 'http://h:1/v2': the path must be empty, /v1, /v1/completions or "
                      "/v1/chat/completions, got '/v2'"),
    ("exec:'open", "--cbatch-impl \"exec:'open\": exec: cannot split the command \"'open\": No closing quotation"),
])
def test_each_spec_form_fails_with_one_clear_line(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("not python")
    (tmp_path / "sub" / "mine.py").write_text("x = 1\n")
    with pytest.raises(ImplementationError) as info:
        resolve_impl(spec, rootdir=str(tmp_path))
    assert str(info.value) == message.replace("ROOT", str(tmp_path))


def test_a_module_that_is_not_importable_names_the_import_error() -> None:
    """The first line names the import error (the lines after it: the hint, see the next test)."""
    with pytest.raises(ImplementationError, match=r"(?m)^--cbatch-impl 'no_such_pkg_x:run': cannot import "
                                                  r"'no_such_pkg_x': No module named 'no_such_pkg_x'$"):
        resolve_impl("no_such_pkg_x:run")


def test_a_package_that_is_not_found_says_to_install_the_project(tmp_path: Path, monkeypatch) -> None:
    """``No module named 'toyserve'`` for the SPEC's own package comes with the usual cause and the sys.path
    searched; a module of it that imports a missing dependency gets no such hint."""
    with pytest.raises(ImplementationError) as caught:
        resolve_impl("toyserve_not_installed.adapter:Impl")
    assert "No module named 'toyserve_not_installed'" in str(caught.value)
    assert "is the project installed? pip install -e ." in str(caught.value) and "sys.path: " in str(caught.value)
    (tmp_path / "needs_dep.py").write_text("import some_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationError) as caught:
        resolve_impl("needs_dep:simulate")
    assert "some_missing_dependency_xyz" in str(caught.value) and "installed?" not in str(caught.value)
