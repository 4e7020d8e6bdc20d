#!/usr/bin/env python3
"""The core crate's module graph: which module imports which, import circles, and
imports that go up the layers (docs/ARCHITECTURE.md, "Layers").

    python3 scripts/layers.py            # check: exit 1 on a circle or an upward import
    python3 scripts/layers.py --edges    # also print every edge between modules

A module is a file of halo/src/ (`halo/src/comm/p2p.rs` is `comm::p2p`, `halo/src/comm/mod.rs` is
`comm`). An edge A -> B is a path in A's code (outside comments and string literals)
that names `crate::B...`, `super::...` or `self::...` resolving to B. Edges between a
module and its own ancestors or descendants are not counted (a child uses its
parent's items, a parent re-exports its children): a circle is between modules of which
neither contains the other. Tests (`tests.rs`, `#[cfg(test)] mod tests` blocks) are
skipped. Written by hand: no crate reads Rust `use` trees at this granularity without
compiling the code, and this needs only the standard library.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "halo" / "src"

# Low to high: a module may use its own layer and the ones below it.
LAYERS = [
    ["host"],
    ["error"],
    ["transport"],
    ["bootstrap"],
    ["select", "tune", "device"],
    ["policy"],
    ["comm"],
    ["local"],
    ["c_abi", "lib"],
]
LAYER_OF = {m: i for i, names in enumerate(LAYERS) for m in names}


def module_of(path: Path) -> tuple:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts == ["lib"]:
        return ()
    return tuple(parts)


def strip(text: str) -> str:
    """The code without comments, string and char literals, and test modules."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and re.match(r'r#*"', text[i:]):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            j = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if j < 0 else j + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # `#[cfg(test)] mod tests { ... }` to the end of the file (they come last).
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", code)
    return code[: m.start()] if m else code


PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::\w+)*)::\{([^;]*)\};", re.S)


def resolve(start: tuple, head: str, rest: list, modules: set, is_dir: bool):
    """The deepest module the path names, or None."""
    if head == "crate":
        base = []
    elif head == "self":
        base = list(start) if is_dir else list(start)
    else:  # super
        base = list(start[:-1])
        while rest and rest[0] == "super":
            base = base[:-1]
            rest = rest[1:]
    best = None
    cur = list(base)
    if tuple(cur) in modules:
        best = tuple(cur)
    for seg in rest:
        cur.append(seg)
        if tuple(cur) in modules:
            best = tuple(cur)
        else:
            break
    return best


def paths_in(code: str):
    for m in USE_GROUP.finditer(code):
        head, prefix = m.group(1), [s for s in m.group(2).split("::") if s]
        for item in re.split(r"[,{}\s]+", m.group(3)):
            item = item.split(" as ")[0].strip()
            if item:
                yield head, prefix + [p for p in item.split("::") if p]
    for m in PATH.finditer(code):
        yield m.group(1), [s for s in m.group(2).split("::") if s]


def graph():
    files = [p for p in SRC.rglob("*.rs") if p.name != "tests.rs"]
    modules = {module_of(p): p for p in files}
    edges = {}
    for mod, path in modules.items():
        code = strip(path.read_text())
        is_dir = path.name == "mod.rs" or mod == ()
        # `super` in a file `a/b.rs` (module a::b) is `a`; in `a/b/mod.rs` also `a`.
        for head, rest in paths_in(code):
            target = resolve(mod, head, rest, set(modules), is_dir)
            if target is None or target == mod:
                continue
            if target[: len(mod)] == mod or mod[: len(target)] == target:
                continue  # ancestor or descendant
            edges.setdefault(mod, set()).add(target)
    return modules, edges


def name(m: tuple) -> str:
    return "::".join(m) if m else "lib"


def circles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    sys.setrecursionlimit(10000)
    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    modules, edges = graph()
    if "--edges" in sys.argv:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{name(a)} -> {name(b)}")
    bad = 0
    for comp in circles(edges):
        bad += 1
        inner = [f"{name(a)} -> {name(b)}" for a in comp for b in sorted(edges.get(a, ())) if b in comp]
        print(f"circle: {', '.join(name(m) for m in comp)}\n    " + "\n    ".join(inner))
    for a in sorted(edges):
        la = LAYER_OF.get(a[0] if a else "lib")
        for b in sorted(edges[a]):
            lb = LAYER_OF.get(b[0] if b else "lib")
            if la is None or lb is None:
                print(f"unknown layer: {name(a)} -> {name(b)} (add it to LAYERS)")
                bad += 1
            elif lb > la:
                print(f"upward: {name(a)} (layer {la}) -> {name(b)} (layer {lb})")
                bad += 1
    print(f"{len(modules)} modules, {sum(len(v) for v in edges.values())} edges, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
