"""The user documents (README.md, BENCHMARKS.md, docs/*.md) name only files a clone has: every relative Markdown
link resolves to a file in the repository, and no document points outside it (``../shared/...``) except the GSM8K
data folder, an external data set the Makefile's ``GSM8K_DIR`` names."""
from __future__ import annotations

import re
from pathlib import Path

from tests.paths import REPO

DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _relative_links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+://|mailto:", t)]


def test_every_relative_link_resolves_to_a_file_in_the_repository():
    broken = [f"{d.relative_to(REPO)} -> {t}" for d in DOCS for t in _relative_links(d)
              if not (d.parent / t).resolve().is_relative_to(REPO) or not (d.parent / t).exists()]
    assert broken == []
    # the README links the documents it moved its reference material to (a link that stopped resolving fails above)
    readme = set(_relative_links(REPO / "README.md"))
    assert {"docs/ARCHITECTURE.md", "docs/EXPERIMENTS.md", "docs/CLI.md", "docs/RESULTS.md", "docs/GUARANTEES.md",
            "BENCHMARKS.md"} <= readme


def test_no_document_points_outside_the_repository_but_the_gsm8k_data():
    outside = [f"{d.relative_to(REPO)}:{i}" for d in DOCS for i, line in enumerate(d.read_text().splitlines(), 1)
               if "../shared/" in line.replace("../shared/data/gsm8k", "")]
    assert outside == []
