"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict` — every page in the
nav, no broken link or anchor — and its suite reference is what scripts/suite_reference.py writes from the
suite's JSON schema today."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strict_with_every_page_and_link(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert {f"{n}/index.html" for n in pages - {"index"}} | {"index.html"} <= built


def test_the_suite_reference_is_generated_from_the_schema_of_today():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_source_cites_only_documents_the_repository_has():
    """Docstrings cited a design document the repository never had; pages cited are in docs/, and
    each docs/*.md a source file names exists."""
    import re
    named = {m for p in (ROOT / "src").rglob("*.py") for m in re.findall(r"docs/([\w-]+\.md)", p.read_text())}
    assert named and all((ROOT / "docs" / n).is_file() for n in named), sorted(named)
    cited = [f"{p.relative_to(ROOT)}" for folder in ("src", "benchmarks", "scripts", "tests")
             for p in (ROOT / folder).rglob("*.py") if "DESIGN" + ".md" in p.read_text()]
    assert cited == []
