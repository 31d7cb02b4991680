"""The README's clause tables and set-up commands stay true to the code."""

from __future__ import annotations

from pathlib import Path

from pytest_cbatch.cli import clause_table
from pytest_cbatch.lifecycle import LIFECYCLE_CLAUSES
from pytest_cbatch.runner import ALL_CLAUSES

README = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")


def test_every_clause_is_in_the_readme_table() -> None:
    missing = [cid for cid in (*ALL_CLAUSES, *LIFECYCLE_CLAUSES) if f"| `{cid}` |" not in README]
    assert not missing, f"clauses missing from README.md's tables: {missing}"


def test_the_clause_table_is_the_registry_verbatim() -> None:
    assert clause_table() in README, "regenerate the table in README.md with: cbatch clauses --markdown"


def test_readme_documents_every_event_field() -> None:
    from pytest_cbatch.schemas import load_schema

    defs = load_schema("report")["$defs"]
    for name, body in defs.items():
        if name.startswith("event."):
            for field in body.get("required", []):
                assert f"`{field}`" in README, f"event {name[6:]}: field {field!r} is not documented in README.md"


def test_readme_starts_with_the_two_setup_commands() -> None:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block == ["pip install -e '.[test]' && cbatch simulate --output continuous.json", "python -m pytest -n 2"]
    assert "python -m pytest -n 2" in (Path(__file__).parent.parent / ".ci" / "run").read_text(encoding="utf-8")
