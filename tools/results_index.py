"""docs/results/README.md's index of results, generated from a metadata header on each entry.

    python3 tools/results_index.py            # print the index
    python3 tools/results_index.py --write    # rewrite docs/results/README.md's block between the markers
    python3 tools/results_index.py --check    # exit 1 when an entry has no header or the index is stale

An *entry* is every top-level file or folder of docs/results/ other than README.md. Each one is covered by
a *header*: YAML front matter at the very top of a loose ``.md`` page or of a folder's ``README.md``::

    ---
    title: What was measured, in one line
    date: 2026-11-27            # the page's first commit: git log --format=%ad --date=short -- <path> | tail -1
    machine: 2-core AMD EPYC: AVX2 + AVX512 F/BW/VL + AVX512-VNNI + AVX512-BF16; no AMX
    command: sparserl compare default --arms ... --seeds 6 --out ...
    files: [bench_rollout_L256.json, bench_2026-11-24c]   # optional: other entries the page describes
    ---

A loose ``.json`` / ``.png`` / ``.txt`` file, or a folder without a README.md, is covered when some header
lists it under ``files:``. An entry covered by nothing is an error, so a new result cannot land without
saying what it is, when and where it ran, and how to run it again.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
INDEX = RESULTS / "README.md"
BEGIN = "<!-- results-index:begin (python3 tools/results_index.py --write; do not edit by hand) -->"
END = "<!-- results-index:end -->"
REQUIRED = ("title", "date", "machine", "command")


class HeaderError(ValueError):
    """An entry without a header, or a header that lacks a key or names a missing file."""


@dataclass(frozen=True)
class Header:
    entry: str  # the entry the header sits on, relative to docs/results/
    page: str  # the page that holds it (the entry itself, or the folder's README.md)
    title: str
    date: str
    machine: str
    command: str
    files: list[str] = field(default_factory=list)


def front_matter(text: str) -> dict | None:
    """The YAML between a leading ``---`` line and the next ``---`` line, or None when the page has none."""
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---\n", 3)
    if end < 0:
        raise HeaderError("front matter opened with '---' but never closed")
    data = yaml.safe_load(text[4:end]) or {}
    if not isinstance(data, dict):
        raise HeaderError("front matter is not a mapping of keys")
    return data


def entries(results: Path | None = None) -> list[str]:
    """Every top-level file and folder of docs/results/ but its README.md, sorted."""
    results = results or RESULTS
    return sorted(p.name for p in results.iterdir() if p.name != "README.md" and not p.name.startswith("."))


def header_page(results: Path, entry: str) -> Path | None:
    """Where an entry's own header would sit: a loose page, or a folder's README.md."""
    path = results / entry
    if path.is_dir():
        return path / "README.md" if (path / "README.md").is_file() else None
    return path if path.suffix == ".md" else None


def read_header(results: Path, entry: str) -> Header | None:
    page = header_page(results, entry)
    if page is None:
        return None
    where = str(page.relative_to(results))
    try:
        data = front_matter(page.read_text())
    except (HeaderError, yaml.YAMLError) as e:
        raise HeaderError(f"{where}: {e}") from None
    if data is None:
        return None
    missing = [k for k in REQUIRED if not str(data.get(k, "")).strip()]
    if missing:
        raise HeaderError(f"{where}: the header lacks {', '.join(missing)}")
    files = data.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise HeaderError(f"{where}: files must be a list of paths relative to docs/results/")
    absent = [f for f in files if not (results / f).exists()]
    if absent:
        raise HeaderError(f"{where}: files names what docs/results/ does not hold: {', '.join(absent)}")
    return Header(
        entry,
        where,
        str(data["title"]).strip(),
        str(data["date"]).strip(),
        str(data["machine"]).strip(),
        str(data["command"]).strip(),
        list(files),
    )


def collect(results: Path | None = None) -> list[Header]:
    """Every entry's header; raises HeaderError naming each entry that nothing covers."""
    results = results or RESULTS
    names = entries(results)
    headers = [h for h in (read_header(results, e) for e in names) if h is not None]
    covered = {h.entry for h in headers} | {f.split("/")[0] for h in headers for f in h.files}
    bare = [e for e in names if e not in covered]
    if bare:
        raise HeaderError(
            "docs/results/ entries without a metadata header (front matter with "
            f"{', '.join(REQUIRED)} on the page, or listed under another page's files:): {', '.join(bare)}"
        )
    return headers


def link(entry: str, page: str) -> str:
    return f"[`{entry}`]({page})"


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_index(results: Path | None = None) -> str:
    """The index as a markdown table, newest first."""
    headers = sorted(collect(results), key=lambda h: (h.date, h.entry), reverse=True)
    lines = ["| entry | what | date | machine | command | also covers |", "|---|---|---|---|---|---|"]
    for h in headers:
        also = ", ".join(f"`{f}`" for f in h.files) or "\u2013"
        lines.append(
            f"| {link(h.entry, h.page)} | {one_line(h.title)} | {h.date} | {one_line(h.machine)} | "
            f"`{one_line(h.command)}` | {also} |"
        )
    return "\n".join(lines) + "\n"


def index_block(text: str) -> str:
    """What the index page holds between the markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise HeaderError(f"docs/results/README.md must hold one {BEGIN!r} ... {END!r} block")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n") + "\n"


def with_index(text: str, table: str) -> str:
    index_block(text)
    return text[: text.index(BEGIN) + len(BEGIN)] + "\n" + table + text[text.index(END) :]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite docs/results/README.md's index block")
    g.add_argument("--check", action="store_true", help="exit 1 when an entry has no header or the block is stale")
    args = p.parse_args(argv)
    try:
        table = render_index()
        if args.write:
            text = INDEX.read_text()
            new = with_index(text, table)
            if new != text:
                INDEX.write_text(new)
        elif args.check:
            block = index_block(INDEX.read_text())
            if block != table:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        block.splitlines(True), table.splitlines(True), "docs/results/README.md (index)", "regenerated"
                    )
                )
                return 1
        else:
            sys.stdout.write(table)
    except HeaderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
