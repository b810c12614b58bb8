"""The repository explains itself (docs/architecture.md): every citation of a
document in the code points into docs/ and resolves; imports point down the
layers only; no Python module of the package grows past ~600 lines."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CODE_DIRS = ("gemma_cy", "reference", "tests", "scripts")
CODE_SUFFIXES = {".py", ".pyx", ".pxd", ".pxi", ".sh"}
LINK = re.compile(r"docs/([\w-]+\.md)(#[\w-]+)?")
MAX_MODULE_LINES = 600


def code_files():
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.name != "test_layout.py":
                yield p
    yield ROOT / "setup.py"
    yield ROOT / "Makefile"


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a markdown file: one per heading (lowercased,
    punctuation but hyphens and underscores dropped, spaces to hyphens),
    plus every explicit <a id="...">."""
    text = doc.read_text(encoding="utf-8")
    found = set(re.findall(r'<a id="([\w-]+)"', text))
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


def test_every_docs_link_resolves():
    bad = []
    cache: dict[str, set[str]] = {}
    sources = [*code_files(), *DOCS.glob("*.md"), ROOT / "README.md"]
    for path in sources:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name, anchor in LINK.findall(line):
                doc = DOCS / name
                if not doc.is_file():
                    bad.append(f"{path.relative_to(ROOT)}:{n}: no such file docs/{name}")
                    continue
                if anchor and anchor[1:] not in cache.setdefault(name, anchors(doc)):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: docs/{name} has no anchor {anchor}")
    assert not bad, "\n".join(bad)


def test_relative_links_between_docs_resolve():
    bad = []
    for doc in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?(#[\w-]+)?\)", doc.read_text(encoding="utf-8")):
            file = (doc.parent / target) if target else doc
            if not file.is_file():
                bad.append(f"{doc.name}: link to missing {target}")
            elif anchor and anchor[1:] not in anchors(file):
                bad.append(f"{doc.name}: {target or doc.name} has no anchor {anchor}")
    assert not bad, "\n".join(bad)


def test_no_citation_points_outside_the_repository():
    outside = re.compile(r"\bSPEC\b(?! ?=)|BAD_INPUTS|DESIGN\.md|STYLE\.md|/work/shared|\.\./shared")
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
           for p in code_files()
           for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if outside.search(line)]
    assert not bad, "\n".join(bad)


# Layers, high to low (docs/architecture.md#packages-and-which-may-import-which):
# a module may import its own package and any package of a lower rank.
RANK = {
    "gemma_cy.commands": 9, "gemma_cy.server": 8, "gemma_cy.api": 8, "gemma_cy": 8, "gemma_cy.generation": 7,
    "gemma_cy.fast": 6, "gemma_cy_reference": 6, "gemma_cy.loading": 5, "gemma_cy.tokenizers": 4,
    "gemma_cy.formats": 3, "gemma_cy.model": 2, "gemma_cy.quant": 1, "gemma_cy.errors": 0,
}


def package_of(module: str) -> str:
    for name in sorted(RANK, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"module {module} belongs to no layer of docs/architecture.md")


def imports_of(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base[:len(base) - node.level + 1] + ([node.module] if node.module else [])
                target = ".".join(parts)
            else:
                target = node.module or ""
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            found += names
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [t for t in found if t.split(".")[0] in ("gemma_cy", "gemma_cy_reference")]


def package_modules():
    for path in sorted((ROOT / "gemma_cy").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        yield path, ".".join(rel.parts)
    for path in sorted((ROOT / "reference").glob("*.py")):
        yield path, "gemma_cy_reference." + path.stem


def test_imports_point_down_only():
    bad = []
    for path, module in package_modules():
        module = module.removesuffix(".__init__")
        if module in ("gemma_cy", "gemma_cy.__main__"):
            continue  # the package's face: lazily re-exports the public names
        mine = package_of(module)
        for target in imports_of(path, module):
            theirs = package_of(target)
            if theirs != mine and RANK[theirs] >= RANK[mine]:
                bad.append(f"{path.relative_to(ROOT)}: {mine} imports {target} ({theirs}, not below it)")
    assert not bad, "\n".join(bad)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of gemma_cy and gemma_cy_reference it imports,
    at its top or inside a function (a package is its __init__)."""
    paths = {module.removesuffix(".__init__"): path for path, module in package_modules()}

    def module_of(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    return {module: {m for target in imports_of(path, module) if (m := module_of(target)) and m != module}
            for module, path in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    order, low, on_stack, stack, circles = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(sorted(graph[root])))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_module_imports_itself_through_others():
    """No import circle between modules, lazy imports inside functions
    included (a circle the package ranks cannot see: two modules of one package)."""
    assert import_circles(import_graph()) == []


def test_the_circle_finder_finds_circles():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", sorted((ROOT / "gemma_cy").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_has_one_job(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {n} lines: split it (docs/architecture.md)"


def test_top_level_holds_only_the_public_surface():
    """load and Model (api.py), the files they open (loading.py), the errors."""
    top = {p.name for p in (ROOT / "gemma_cy").iterdir() if p.suffix == ".py"}
    assert top <= {"__init__.py", "__main__.py", "api.py", "loading.py", "errors.py"}, top


def test_the_api_module_only_generates():
    """Model generates; loading and evaluation live in their own modules (docs/architecture.md)."""
    n = len((ROOT / "gemma_cy" / "api.py").read_text(encoding="utf-8").splitlines())
    assert n < 400, f"gemma_cy/api.py has {n} lines: move what is not generation out of Model"


def test_the_observer_type_is_defined_once():
    """``Observer`` (the per-layer hook's type) lives in gemma_cy/model/observe.py;
    every other module imports it instead of spelling it again."""
    defined = [str(path.relative_to(ROOT)) for path, _ in package_modules()
               if re.search(r"^Observer\s*=", path.read_text(encoding="utf-8"), re.M)]
    assert defined == ["gemma_cy/model/observe.py"], defined


def test_frontends_use_only_the_public_model():
    """The server and the commands reach a Model through its public methods
    (docs/architecture.md): no ``model._private`` and no ``.engine.batch``."""
    bad = []
    for path in [*(ROOT / "gemma_cy" / "server").glob("*.py"), *(ROOT / "gemma_cy" / "commands").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and "model" in node.value.id \
                    and node.attr.startswith("_"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr == "batch" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "engine":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: .engine.batch")
    assert not bad, "\n".join(bad)
