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


def test_readme_counts_of_workloads_are_current() -> None:
    import re

    from pytest_cbatch.workloads import INVALID_INPUTS, WORKLOADS

    fixed = {int(n) for n in re.findall(r"(\d+) fixed workloads", README)}
    assert fixed == {len(WORKLOADS)}, f"README.md says {sorted(fixed)} fixed workloads; there are {len(WORKLOADS)}"
    invalid = {int(n) for n in re.findall(r"(\d+) invalid inputs", README)}
    assert invalid == {len(INVALID_INPUTS)}, f"README.md says {sorted(invalid)} invalid inputs; there are {len(INVALID_INPUTS)}"


def test_readme_links_resolve() -> None:
    import re

    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", README, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    for target in re.findall(r"\]\(#([^)]+)\)", README):
        assert target in anchors, f"README.md links to #{target}, which is no heading"
    root = Path(__file__).parent.parent
    for target in re.findall(r"\]\(((?:docs|examples|gpu_checks)/[^)#]+)\)", README):
        assert (root / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_lifecycle_table_is_the_registry_verbatim() -> None:
    for cid, statement in LIFECYCLE_CLAUSES.items():
        row = f"| `{cid}` | {statement.replace('|', chr(92) + '|')} |"
        assert row in README, f"README.md's lifecycle table has a stale row for {cid}: it should read {row}"


def test_readme_counts_of_broken_implementations_are_current() -> None:
    import re

    from pytest_cbatch.examples import broken_lifecycle, broken_schedulers

    for pattern, count in ((r"holds (\d+) schedulers", len(broken_schedulers.BROKEN)),
                           (r"holds (\d+) lifecycle implementations", len(broken_lifecycle.BROKEN))):
        said = {int(n) for n in re.findall(pattern, README)}
        assert said == {count}, f"README.md says {sorted(said)} for {pattern!r}; there are {count}"
