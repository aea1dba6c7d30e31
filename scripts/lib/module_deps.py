#!/usr/bin/env python3
"""Checks that the filter crate's modules import each other without cycles.

Every `crate::a::b` path in `filter/src` (imports and qualified uses; comments and
test code — `tests.rs` files and `#[cfg(test)] mod tests` blocks — excluded: a test may
build its fixture with the top-level loader) is an edge from the module of the file it is written in to the module it
names. Two levels are checked:

* top-level modules (`config`, `scheduler`, `proxy`, ...): the graph must be acyclic;
* second-level modules inside one top-level module (`scheduler::filters`,
  `scheduler::scorers`, ...): siblings must not form a cycle. Edges between a module
  and its own parent are left out: a parent declares its children and may name them.

Usage: scripts/lib/module_deps.py [--graph] [SRC_DIR]   (default: filter/src)
Exit status 1 and the cycle printed when one is found.
"""

import argparse
import pathlib
import re
import sys

USE_BLOCK = re.compile(r"\buse\s+crate::((?:[^;{}]|\{(?:[^{}]|\{[^{}]*\})*\})*);", re.S)
QUALIFIED = re.compile(r"\bcrate::([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)")


def strip_comments(text: str) -> str:
    """The source without `//` line comments (doc comments included) and block comments."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d']."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, _, rest = tree.partition("{")
    body = rest[: rest.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        for tail in expand(p):
            out.append(head + tail if tail not in ("self", "") else head.rstrip(":"))
    return out


def without_tests(text: str) -> str:
    """The source up to its `#[cfg(test)] mod tests` block (by convention the last item)."""
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text


def module_of(path: pathlib.Path, src: pathlib.Path) -> list[str]:
    """`scheduler/filters/roles.rs` -> ['scheduler', 'filters', 'roles']."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts and parts[-1] in ("mod", "lib"):
        parts.pop()
    return parts


def modules(src: pathlib.Path) -> set[tuple[str, ...]]:
    """Every module path of the crate."""
    found = set()
    for f in src.rglob("*.rs"):
        if "bin" in f.relative_to(src).parts:
            continue
        m = module_of(f, src)
        for i in range(1, len(m) + 1):
            found.add(tuple(m[:i]))
    return found


def known_prefix(path: list[str], mods: set[tuple[str, ...]], depth: int) -> tuple[str, ...]:
    """The longest module prefix of `path`, at most `depth` long."""
    best: tuple[str, ...] = ()
    for i in range(1, min(depth, len(path)) + 1):
        if tuple(path[:i]) in mods:
            best = tuple(path[:i])
    return best


def edges(src: pathlib.Path, depth: int) -> dict[tuple, set[tuple]]:
    mods = modules(src)
    graph: dict[tuple, set[tuple]] = {}
    for f in sorted(src.rglob("*.rs")):
        if "bin" in f.relative_to(src).parts or f.name == "tests.rs":
            continue
        here = tuple(module_of(f, src)[:depth])
        if not here:
            continue
        text = without_tests(strip_comments(f.read_text()))
        names = []
        for m in USE_BLOCK.finditer(text):
            names.extend(expand(m.group(1)))
        names.extend(m.group(1) for m in QUALIFIED.finditer(USE_BLOCK.sub("", text)))
        for name in names:
            target = known_prefix(name.split("::"), mods, depth)
            if target and target != here:
                graph.setdefault(here, set()).add(target)
    return graph


def find_cycle(graph: dict[tuple, set[tuple]]) -> list[tuple] | None:
    state: dict[tuple, int] = {}
    stack: list[tuple] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def name(m: tuple) -> str:
    return "::".join(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?", default="filter/src")
    ap.add_argument("--graph", action="store_true", help="print the top-level graph")
    args = ap.parse_args()
    src = pathlib.Path(args.src)
    top = edges(src, 1)
    if args.graph:
        for n in sorted(top):
            print(f"{name(n)} -> {', '.join(sorted(name(m) for m in top[n]))}")
    failed = False
    cycle = find_cycle(top)
    if cycle:
        print("module cycle: " + " -> ".join(name(m) for m in cycle))
        failed = True
    second = edges(src, 2)
    for parent in sorted({n[:1] for n in second}):
        siblings = {
            n: {m for m in ms if m[:1] == parent and len(m) == 2}
            for n, ms in second.items()
            if n[:1] == parent and len(n) == 2
        }
        cycle = find_cycle(siblings)
        if cycle:
            print("module cycle: " + " -> ".join(name(m) for m in cycle))
            failed = True
    if not failed:
        print(f"no module cycles in {src}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
