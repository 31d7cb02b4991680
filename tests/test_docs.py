"""The README and the docs pages stay true to the code: clause tables, set-up commands, counts, links."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_cbatch.cli import clause_table
from pytest_cbatch.lifecycle import LIFECYCLE_CLAUSES
from pytest_cbatch.runner import ALL_CLAUSES

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONTRACT = (DOCS / "contract.md").read_text(encoding="utf-8")
PAGES = {path: path.read_text(encoding="utf-8") for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]}
# The mutation page reports a measured campaign, with the suite's counts at the time it ran.
CURRENT = "\n".join(text for path, text in PAGES.items() if path.name != "mutation.md")


def _said(pattern: str) -> set[int]:
    """Every number the README and the docs pages state with PATTERN about the kit as it is."""
    return {int(n) for n in re.findall(pattern, CURRENT)}


def test_every_clause_is_in_the_contract_page_tables() -> None:
    missing = [cid for cid in (*ALL_CLAUSES, *LIFECYCLE_CLAUSES) if f"| `{cid}` |" not in CONTRACT]
    assert not missing, f"clauses missing from docs/contract.md's tables: {missing}"


def test_the_clause_table_is_the_registry_verbatim() -> None:
    assert clause_table() in CONTRACT, "regenerate the table in docs/contract.md with: cbatch clauses --markdown"


def test_the_lifecycle_table_is_the_registry_verbatim() -> None:
    for cid, statement in LIFECYCLE_CLAUSES.items():
        row = f"| `{cid}` | {statement.replace('|', chr(92) + '|')} |"
        assert row in CONTRACT, f"docs/contract.md's lifecycle table has a stale row for {cid}: it should read {row}"


def test_the_report_format_documents_every_event_field() -> None:
    from pytest_cbatch.schemas import load_schema

    page = (DOCS / "adapters.md").read_text(encoding="utf-8")
    defs = load_schema("report")["$defs"]
    for name, body in defs.items():
        if name.startswith("event."):
            for field in body.get("required", []):
                assert f"`{field}`" in page, f"event {name[6:]}: field {field!r} is not documented in docs/adapters.md"


def test_readme_starts_with_the_two_setup_commands() -> None:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block == ["pip install -e '.[test]' && cbatch simulate --output continuous.json", "python -m pytest -n 2"]
    assert "python -m pytest -n 2" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_options_are_rows_of_the_full_table() -> None:
    rows = [line for line in README.splitlines() if line.startswith("| `--cbatch-")]
    assert rows, "README.md lists no option"
    untargeted = lambda text: re.sub(r"\]\([^)]*\)", "]()", text)  # the pages link from different folders
    running = untargeted((DOCS / "running.md").read_text(encoding="utf-8"))
    for row in rows:
        assert untargeted(row) in running, f"README.md's option row differs from docs/running.md's: {row}"


def test_counts_of_workloads_are_current() -> None:
    from pytest_cbatch.workloads import INVALID_INPUTS, WORKLOADS

    assert _said(r"(\d+) fixed workloads") == {len(WORKLOADS)}, f"the docs say otherwise: there are {len(WORKLOADS)} fixed workloads"
    assert _said(r"(\d+) invalid inputs") == {len(INVALID_INPUTS)}, f"the docs say otherwise: there are {len(INVALID_INPUTS)} invalid inputs"


def test_counts_of_broken_implementations_are_current() -> None:
    from pytest_cbatch.examples import broken_lifecycle, broken_schedulers

    for pattern, count in ((r"holds (\d+) schedulers", len(broken_schedulers.BROKEN)),
                           (r"holds (\d+) lifecycle implementations", len(broken_lifecycle.BROKEN))):
        assert _said(pattern) == {count}, f"the docs say {sorted(_said(pattern))} for {pattern!r}; there are {count}"


def _anchors(text: str) -> set[str]:
    """The anchors of a page's headings (outside code blocks), slugged as GitHub and MkDocs do."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", prose, flags=re.M)}


def _relative_links(text: str) -> list[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose) if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for path, text in PAGES.items():
        for link in _relative_links(text):
            target, _, anchor = link.partition("#")
            file = (path.parent / target).resolve() if target else path
            if not file.is_file():
                broken.append(f"{path.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and anchor not in _anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{path.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_finds_a_broken_file_and_heading() -> None:
    assert _relative_links("[a](x.md#y) `[b](z.md)` [c](https://e.org)") == ["x.md#y"]
    assert _anchors("# The `cbatch` command\n```\n# not a heading\n```\n") == {"the-cbatch-command"}


def test_readme_links_every_docs_page() -> None:
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _relative_links(README)}
    missing = [str(p.relative_to(ROOT)) for p in PAGES if p.parent != ROOT and p.name != "index.md" and p.resolve() not in linked]
    assert not missing, f"README.md's 'Where to go next' does not link: {missing}"


def test_every_suggestion_of_n_auto_says_when_it_is_slower() -> None:
    """`-n auto` is slower for a fast in-process scheduler: each page that suggests it says so."""
    suggesting = {path: " ".join(text.split()) for path, text in PAGES.items() if "reference -n auto" in text}
    assert suggesting
    silent = [path.name for path, text in suggesting.items() if "for a fast in-process scheduler" not in text]
    assert not silent, f"these pages suggest -n auto without saying it is slower for a fast scheduler: {silent}"


def test_the_ci_page_quotes_no_test_count() -> None:
    """The kit's test counts change every release; docs/ci.md points at the performance page instead."""
    assert not re.search(r"\d[\d,]* passed", PAGES[DOCS / "ci.md"]), "docs/ci.md quotes a test count"
