"""Which model a live server is asked for: the one ``/v1/models`` lists, or the one the user names
(``--cbatch-model``, ini ``cbatch_model``, ``--model``); a server that lists none or several is
never judged on a guess.

The loopback servers here serve one model but list another set, as real ones do:
``transformers serve MODEL_PATH`` lists none for a model given by path, and a server with adapters
lists the base model and each adapter.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
from aiohttp import web

from pytest_cbatch.cli import main
from pytest_cbatch.impls import resolve_impl
from pytest_cbatch.live import LiveError
from pytest_cbatch.live.client import choose_model
from pytest_cbatch.live.server import OpenAIServer
from pytest_cbatch.reference.scheduler_sim import demo_trace
from pytest_cbatch.workloads import BASE_CONFIG

PATH_MODEL = "/models/tiny-llama"          # served, listed by no one
ADAPTERS = ("base", "base-lora-sql")       # listed; the server serves the second


def lists(ids: Sequence[str]) -> type[OpenAIServer]:
    """An embedded server whose /v1/models lists ``ids`` (whatever it serves)."""

    class Listing(OpenAIServer):
        async def models(self, request: Any) -> Any:
            return web.json_response({"object": "list", "data": [
                {"id": name, "object": "model", "max_model_len": 2048} for name in ids]})

    return Listing


@pytest.fixture
def lists_none(serve: Callable[..., str]) -> str:
    return serve(model=PATH_MODEL, server_class=lists(()))


@pytest.fixture
def lists_several(serve: Callable[..., str]) -> str:
    return serve(model=ADAPTERS[1], server_class=lists(ADAPTERS))


def test_a_server_that_lists_no_model_says_how_to_name_one(lists_none: str) -> None:
    out = resolve_impl(lists_none, timeout=20).run(demo_trace(), BASE_CONFIG)
    assert out.report is None and out.refused, out
    assert f"{lists_none}/v1/models lists no model" in out.refused
    assert "--cbatch-model NAME (ini cbatch_model; cbatch check, load and invariance: --model NAME)" in out.refused
    assert "the path the server was started with" in out.refused


def test_a_server_that_lists_several_models_names_them_and_takes_none(lists_several: str) -> None:
    out = resolve_impl(lists_several, timeout=20).run(demo_trace(), BASE_CONFIG)
    assert out.report is None and out.refused, out
    assert "lists 2 models ('base', 'base-lora-sql'): name the one to judge with --cbatch-model NAME" in out.refused


@pytest.mark.parametrize("server, model", [("lists_none", PATH_MODEL), ("lists_several", ADAPTERS[1])])
def test_the_named_model_is_asked_for_and_recorded(request: pytest.FixtureRequest, server: str, model: str) -> None:
    impl = resolve_impl(request.getfixturevalue(server), timeout=20, model=model)
    assert f"model {model!r}" in impl.describe()
    report = impl.run(demo_trace(), BASE_CONFIG).report
    assert report is not None and report["server"]["model"] == model
    assert {row["status"] for row in report["requests"].values()} <= {"finished", "cancelled"}
    assert sum(row["status"] == "finished" for row in report["requests"].values()) >= 2


def test_a_named_model_the_server_does_not_serve_is_its_refusal(lists_several: str) -> None:
    out = resolve_impl(lists_several, timeout=20, model=ADAPTERS[0]).run(demo_trace(), BASE_CONFIG)
    assert out.report is None and "The model `base` does not exist" in out.refused, out


def test_a_listing_is_untrusted_bounded_data() -> None:
    many = [{"id": f"m{i}-" + "x" * 200} for i in range(20)] + [{"id": 7}, "junk", {"name": "no id"}]
    valid = [entry for entry in many if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
    with pytest.raises(LiveError) as info:
        choose_model(valid, None, "http://h/v1/models")
    text = str(info.value)
    assert "lists 20 models ('m0-" in text and "and 12 more" in text and len(text) < 1200, text
    assert choose_model([{"id": "a", "max_model_len": 9}], None, "u") == {"id": "a", "max_model_len": 9}
    assert choose_model([{"id": "a", "max_model_len": 9}], "a", "u")["max_model_len"] == 9
    assert choose_model([{"id": "a"}], "/path/b", "u") == {"id": "/path/b"}


def test_pytest_takes_the_model_from_the_option_or_the_ini(pytester: pytest.Pytester, lists_several: str) -> None:
    pytester.makeini(f"[pytest]\ncbatch_model = {ADAPTERS[1]}\n")
    args = (f"--cbatch-impl={lists_several}", "-p", "no:cacheprovider", "-k", "test_contract and completes-demo and not serial")
    named = pytester.runpytest_subprocess(*args).parseoutcomes()   # (numerics skip as a module without torch)
    assert named.get("passed") == 1 and not named.get("failed"), named
    wrong = pytester.runpytest_subprocess(*args, f"--cbatch-model={ADAPTERS[0]}")   # the option wins over the ini
    assert wrong.parseoutcomes().get("failed") == 1 and not wrong.parseoutcomes().get("passed")
    wrong.stdout.fnmatch_lines(["*The model `base` does not exist*"])


def test_cbatch_check_and_load_take_model(lists_several: str, capsys: pytest.CaptureFixture[str]) -> None:
    check = ["check", "--impl", lists_several, "--clause", "completes", "--timeout", "20"]
    assert main(check) == 1
    assert "lists 2 models ('base', 'base-lora-sql')" in capsys.readouterr().out
    assert main([*check, "--model", ADAPTERS[1]]) == 0, capsys.readouterr()
    load = ["load", "--base-url", lists_several, "--concurrency", "1", "--requests-per-level", "1", "--warmup", "0",
            "--output-len", "2"]
    assert main(load) == 2
    assert "name the one to judge with --model NAME" in capsys.readouterr().err
    assert main([*load, "--model", ADAPTERS[1]]) == 0, capsys.readouterr()
