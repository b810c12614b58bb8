"""Links into the Markdown docs resolve, and docs/benchmarks.md stays short.

Every citation of the form ``docs/<name>.md#<anchor>``,
``(<name>.md#<anchor>)`` or ``(#<anchor>)`` in README.md, docs/*.md, the Makefile and the
.py/.pyx/.pxi/.pxd files under gemma_cy/, reference/, scripts/ and tests/
must name a file that exists and a heading whose GitHub anchor is
``<anchor>`` (or an HTML anchor, ``<a id="<anchor>">``). GitHub's rule: the heading's text lower-cased, every character
that is not a letter, digit, underscore, hyphen or space dropped, spaces
turned into hyphens; a repeated anchor gets -1, -2, ... in order. Headings
inside fenced code blocks do not count. Reads files only: no project
imports.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("gemma_cy", "reference", "scripts", "tests")
CODE_SUFFIXES = {".py", ".pyx", ".pxi", ".pxd"}

# A path ending in .md with an anchor, e.g. docs/benchmarks.md#history,
# (benchmarks.md#history), (../README.md#speed); the path must start a
# word (after a space, bracket, quote or line start), so that a URL's tail
# is not taken for one.
PATH_LINK = re.compile(r"(?:^|(?<=[\s(\[`'\"<]))((?:\.\./|\./)*(?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
# A Markdown link to a heading of the same file: [text](#anchor).
SAME_FILE_LINK = re.compile(r"\]\(#([\w-]+)\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def github_anchor(text):
    """The anchor GitHub gives a heading whose Markdown text is `text`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path):
    """Every heading anchor (and HTML anchor) of the Markdown file at `path`."""
    anchors, seen, fence = set(), {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if m:
            marker = m.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        anchors.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")
    return anchors


def citing_files():
    files = [ROOT / "README.md", ROOT / "Makefile"]
    files += sorted((ROOT / "docs").glob("*.md"))
    for d in CODE_DIRS:
        files += sorted(p for p in (ROOT / d).rglob("*")
                        if p.suffix in CODE_SUFFIXES and p.is_file())
    return [f for f in files if f.exists()]


def resolve(citing, target):
    """The Markdown file `target` names, seen from `citing`: relative to the
    citing file's folder, else to the repository root, else to docs/."""
    for base in (citing.parent, ROOT, ROOT / "docs"):
        candidate = (base / target).resolve()
        if candidate.is_file():
            return candidate
    return None


def find_links():
    """(citing file, line number, target text, resolved path or None,
    anchor) for every citation."""
    links = []
    for f in citing_files():
        markdown = f.suffix == ".md"
        for lineno, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in PATH_LINK.finditer(line):
                target, anchor = m.group(1), m.group(2)
                links.append((f, lineno, target, resolve(f, target), anchor))
            if markdown:
                for m in SAME_FILE_LINK.finditer(line):
                    links.append((f, lineno, f.name, f, m.group(1)))
    return links


def test_github_anchor_rule():
    assert github_anchor("Block layouts: per-block cost") == "block-layouts-per-block-cost"
    assert github_anchor("How to benchmark") == "how-to-benchmark"
    assert github_anchor("`--activations q8`: int8 (opt-in)") == "--activations-q8-int8-opt-in"
    assert github_anchor("Q4_K as stored") == "q4_k-as-stored"
    assert github_anchor("See [the docs](x.md)") == "see-the-docs"


def test_doc_anchor_links_resolve():
    links = find_links()
    assert any(t.endswith("benchmarks.md") for _, _, t, _, _ in links)
    cache, misses = {}, []
    for f, lineno, target, path, anchor in links:
        where = f"{f.relative_to(ROOT)}:{lineno}: {target}#{anchor}"
        if path is None:
            misses.append(where + " (no such file)")
            continue
        if path not in cache:
            cache[path] = anchors_of(path)
        if anchor not in cache[path]:
            misses.append(where + " (no such heading)")
    assert not misses, f"{len(misses)} link(s) do not resolve:\n" + "\n".join(misses)


def test_benchmarks_doc_is_short_and_answers_first():
    lines = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 500, f"docs/benchmarks.md has {len(lines)} lines"
    top = "\n".join(lines[:40])
    assert re.search(r"\d[\d,.]*\s*tok/s", top), "no tok/s figure in the first 40 lines"
    assert "make bench-peers" in top, "`make bench-peers` not in the first 40 lines"
