"""Every entry of docs/results/ carries a metadata header (title, date, machine, command), and
docs/results/README.md's index is the one tools/results_index.py generates from those headers."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("results_index", ROOT / "tools" / "results_index.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["results_index"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ri = _script()


def _page(fm: str, body: str = "# A result\n\nbody\n") -> str:
    return f"---\n{fm}---\n\n{body}"


HEADER = "title: t\ndate: '2026-11-28'\nmachine: 2-core AMD EPYC, AVX2\ncommand: sparserl train\n"


def test_every_entry_has_a_header_and_the_index_is_current():
    headers = ri.collect()  # raises, naming the entries, when one is covered by nothing
    assert len(headers) > 40
    block = ri.index_block(ri.INDEX.read_text())
    assert block == ri.render_index(), "docs/results/README.md's index is stale: python3 tools/results_index.py --write"
    assert ri.main(["--check"]) == 0


def test_the_index_links_every_header_page():
    block = ri.index_block(ri.INDEX.read_text())
    for h in ri.collect():
        assert f"]({h.page})" in block
        assert (ri.RESULTS / h.page).is_file()


def test_a_new_entry_without_a_header_fails(tmp_path):
    (tmp_path / "old.md").write_text(_page(HEADER + "files: [old.json]\n"))
    (tmp_path / "old.json").write_text("{}")
    assert [h.entry for h in ri.collect(tmp_path)] == ["old.md"]
    (tmp_path / "new_run").mkdir()
    (tmp_path / "new_run" / "README.md").write_text("# A new run\n")
    with pytest.raises(ri.HeaderError, match="new_run"):
        ri.collect(tmp_path)
    (tmp_path / "new_run" / "README.md").write_text(_page(HEADER))
    assert {h.entry for h in ri.collect(tmp_path)} == {"old.md", "new_run"}
    (tmp_path / "loose.png").write_bytes(b"")
    with pytest.raises(ri.HeaderError, match="loose.png"):
        ri.collect(tmp_path)


def test_a_header_without_a_required_key_or_with_a_missing_file_fails(tmp_path):
    (tmp_path / "a.md").write_text(_page("title: t\ndate: '2026-11-28'\ncommand: x\n"))
    with pytest.raises(ri.HeaderError, match="machine"):
        ri.collect(tmp_path)
    (tmp_path / "a.md").write_text(_page(HEADER + "files: [absent.json]\n"))
    with pytest.raises(ri.HeaderError, match="absent.json"):
        ri.collect(tmp_path)


def test_check_fails_on_a_stale_index(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.md").write_text(_page(HEADER))
    index = results / "README.md"
    index.write_text("# Results\n\n" + ri.BEGIN + "\n| stale |\n" + ri.END + "\n")
    monkeypatch.setattr(ri, "RESULTS", results)
    monkeypatch.setattr(ri, "INDEX", index)
    assert ri.main(["--check"]) == 1
    assert ri.main(["--write"]) == 0 and ri.main(["--check"]) == 0
    assert "[`a.md`](a.md)" in index.read_text()


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git history")
def test_dates_are_the_first_commit_of_each_entry():
    wrong = []
    for h in ri.collect():
        out = subprocess.run(
            ["git", "log", "--format=%ad", "--date=short", "--", f"docs/results/{h.entry}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split()
        if out and out[-1] != h.date:
            wrong.append(f"{h.page}: header {h.date}, first commit {out[-1]}")
    assert not wrong
