"""Every relative link in the repository's Markdown resolves: the file exists and, for ``file.md#anchor`` or
``#anchor``, the target page has a heading with that anchor (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens, ``-1``, ``-2`` ... for repeats)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", "build", ".git", "node_modules", ".whl"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _pages() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md") if not (set(p.relative_to(ROOT).parts) & SKIP))


def _slug(text: str) -> str:
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", text)  # inline code / emphasis markers
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = _slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    return out


def _links(page: Path) -> list[str]:
    text, fenced, keep = page.read_text(encoding="utf-8"), False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            keep.append(re.sub(r"`[^`]*`", "", line))
    return LINK.findall("\n".join(keep))


def test_slug_follows_githubs_rule():
    assert _slug("Threads: one torch thread is the default (2026-11-27)") == \
        "threads-one-torch-thread-is-the-default-2026-11-27"
    assert _slug("The rule") == "the-rule"
    assert _slug("`seqmem sweep` — specs") == "seqmem-sweep--specs"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    bad = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = page if not path else (page.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)
