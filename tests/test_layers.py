"""The package's imports run one way, down the layers of DESIGN.md ("Layers").

Read from the source (no import needed): every `import` / `from ... import` of a module of
`ltc_async` or of the backends (`devices/`), at module level or inside a function.  Checked:

* no import circle, counting function-local imports (they only hide a circle);
* no import runs back up: a module imports only from layers below its own, or from its own
  folder (a package's modules may use each other, without a circle);
* the backends (`devices/`) see only the seam, the IR and the foundations, and the core never
  imports a backend (it loads one by name);
* a function-local import of the package's own modules is a deliberately lazy load of a heavy
  dependency, said so in a comment on its line or the line above.

`python tests/test_layers.py` prints the figures of the house (circles, imports up, local
imports, lines per package, the longest modules).
"""
from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__" and len(sys.argv) > 1:   # the figures of another checkout
    ROOT = os.path.abspath(sys.argv[1])

# From the ground up.  A module belongs to the first entry that is its name or a prefix of it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("ltc_async.base",)),
    ("IR", ("ltc_async.ir",)),
    ("backend seam", ("ltc_async.backend",)),
    ("compilers backends share", ("devices.inductor",)),   # the Inductor tier (issue 19)
    ("backends", ("devices",)),
    ("executor", ("ltc_async.executor",)),
    ("per-op path", ("ltc_async.tensor",)),
    ("torch patching and torch.compile", ("ltc_async.patches", "ltc_async.compile")),
    ("diagnostics", ("ltc_async.diagnostics",)),
    ("user-facing", ("ltc_async",)),
]
BACKENDS_SEE = ("ltc_async.backend", "ltc_async.ir", "ltc_async.base")


def modules() -> dict[str, str]:
    """Module name -> file, for `ltc_async` and `devices` (as the package names them)."""
    out = {}
    for pkg in ("ltc_async", "devices"):
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, pkg)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


# Where the modules of the tree before issue 17 (commit 9d24457) belonged, for its figures.
BEFORE = {"ltc_async._config": 0, "ltc_async.metrics": 0, "ltc_async.callsite": 0,
          "ltc_async.backend": 2}


def layer_of(mod: str) -> int:
    if mod in BEFORE and ROOT != os.path.dirname(os.path.dirname(os.path.abspath(__file__))):
        return BEFORE[mod]
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{mod} is in no layer")


def folder_of(mod: str, mods: dict[str, str]) -> str:
    return mod if mods[mod].endswith("__init__.py") else mod.rpartition(".")[0]


class Import:
    def __init__(self, src: str, dst: str, line: int, local: bool, comment: str) -> None:
        self.src, self.dst, self.line, self.local, self.comment = src, dst, line, local, comment

    def __repr__(self) -> str:
        kind = "local import" if self.local else "import"
        return f"{self.src}:{self.line} {kind} of {self.dst}"


def imports() -> list[Import]:
    mods = modules()
    found = []
    for mod, path in mods.items():
        src = open(path, encoding="utf-8").read()
        lines = src.splitlines()
        pkg = folder_of(mod, mods)

        def targets(node: ast.AST) -> list[str]:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    base = base + "." + node.module if node.module else base
                else:
                    base = node.module or ""
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            out = []
            for n in names:
                n = n.replace("ltc_async_devices", "devices")
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod and n not in out:
                    out.append(n)
            if isinstance(node, ast.ImportFrom) and len(out) > 1:
                base_mod = out[-1]
                out = [n for n in out if n != base_mod] or [base_mod]   # `from pkg import mod`
            return out

        def walk(node: ast.AST, local: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    text = " ".join(lines[max(0, child.lineno - 2): child.lineno])
                    comment = text.partition("#")[2] if "#" in text else ""
                    for t in targets(child):
                        found.append(Import(mod, t, child.lineno, local, comment))
                walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
        walk(ast.parse(src), False)
    return found


def circles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        graph[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def upward(edges: list[Import]) -> list[Import]:
    mods = modules()
    bad = []
    for e in edges:
        same_folder = folder_of(e.src, mods) == folder_of(e.dst, mods) or e.src.startswith(e.dst + ".") \
            or e.dst.startswith(folder_of(e.src, mods) + ".")
        if layer_of(e.dst) > layer_of(e.src) or (layer_of(e.dst) == layer_of(e.src) and not same_folder
                                                  and layer_of(e.src) != len(LAYERS) - 1):
            bad.append(e)
    return bad


# -- tests ------------------------------------------------------------------------------------

def test_no_import_circle():
    assert circles(imports()) == []


def test_imports_run_down_the_layers():
    assert upward(imports()) == []


def test_backends_see_only_the_seam_and_the_ir():
    edges = imports()
    wrong = [e for e in edges if e.src.startswith("devices") and e.dst.startswith("ltc_async")
             and not any(e.dst == p or e.dst.startswith(p + ".") for p in BACKENDS_SEE)]
    assert wrong == []
    assert [e for e in edges if e.src.startswith("ltc_async") and e.dst.startswith("devices")] == []


def test_local_imports_are_deliberately_lazy_and_say_so():
    local = [e for e in imports() if e.local]
    assert [e for e in local if "lazy" not in e.comment.lower()] == []


def test_every_module_is_in_a_layer():
    for mod in modules():
        layer_of(mod)


# -- figures ------------------------------------------------------------------------------------

def main() -> None:
    edges = imports()
    mods = modules()
    print(f"modules: {len(mods)}; imports of the package's own modules: {len(edges)}")
    print(f"import circles: {len(circles(edges))} {circles(edges)}")
    print(f"imports running back up: {len(upward(edges))} {upward(edges)}")
    local = [e for e in edges if e.local]
    print(f"function-local imports of own modules: {len(local)} {local}")
    lines: dict[str, int] = defaultdict(int)
    sizes = []
    for mod, path in mods.items():
        n = sum(1 for _ in open(path, encoding="utf-8"))
        lines[folder_of(mod, mods)] += n
        sizes.append((n, mod))
    print("lines per package: " + ", ".join(f"{k} {v}" for k, v in sorted(lines.items())))
    print("longest modules: " + ", ".join(f"{m} {n}" for n, m in sorted(sizes)[-3:][::-1]))


if __name__ == "__main__":
    main()
