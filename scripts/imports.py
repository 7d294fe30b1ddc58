#!/usr/bin/env python3
"""The crate's import graph, from its `use crate::` / `use super::` lines and
`crate::` paths, file by file.

    scripts/imports.py            circles and imports against the direction
    scripts/imports.py --edges    every file -> file edge as well
    scripts/imports.py --dot      the room graph for graphviz (dot -Tsvg)

Exits non-zero when it finds a circle between files or an import that goes
against the direction in docs/architecture.md's module map (the ROOMS table
below says the same). Tests (`tests/` folders, `*_tests.rs`, `#[cfg(test)]`
modules at a file's end) are left out: they may reach anywhere.
"""

import re
import sys
from pathlib import Path

# room -> rooms it may use (besides itself). Top-level files are rooms too.
ROOMS = {
    "model": set(),
    "clock": {"model"},
    "owner_only": set(),
    "socket_path": set(),
    "suggest": set(),
    "hostname": set(),
    "metric": set(),
    "spec": {"model", "clock", "suggest"},
    "sched": {"model"},
    "state": {"model", "sched"},
    "raft": {"state", "model", "metric"},
    "net": {"model", "clock"},
    "config": {"model", "socket_path", "suggest", "hostname"},
    "http": {"net", "model", "spec", "clock", "metric"},
    "agent": {"net", "model", "config", "clock", "owner_only", "socket_path", "http", "metric"},
    "server": {"raft", "state", "sched", "net", "model", "config", "clock", "owner_only", "socket_path", "http", "metric"},
    "cli": {"net", "model", "spec", "clock", "socket_path"},
    "compat": {"spec", "cli", "net", "model", "clock", "socket_path", "suggest", "hostname"},
    "sim": {"agent", "net", "model", "config", "owner_only", "clock", "state", "sched", "cli", "spec"},
    "dev": {"server", "agent", "config", "net", "model", "clock", "owner_only", "socket_path", "http"},
    "main": None,  # the binary's edge: anything
    "lib": None,
}

SRC = Path(__file__).resolve().parent.parent / "src"


def module_of(path: Path) -> tuple:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    return tuple(parts)


def strip_tests(text: str) -> str:
    # A trailing `#[cfg(test)] mod tests { ... }` and comments are not imports.
    cut = re.search(r"^#\[cfg\(test\)\]\s*\n\s*(pub\s+)?mod\s+\w+\s*\{", text, re.M)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def expand(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    return [p for item in items if item for p in expand(prefix + item)]


def paths_in(text: str, me: tuple) -> set:
    found = set()
    for m in re.finditer(r"\buse\s+((?:crate|super|self)::[^;]*);", text, re.S):
        found.update(expand(m.group(1)))
    for m in re.finditer(r"(?<!::)\b(crate|super|self)((?:::\w+)+)", text):
        found.add(m.group(1) + m.group(2))
    out = set()
    here = list(me)  # `super` is the parent of the file's own module
    for p in found:
        parts = [x for x in p.split("::") if x and x not in ("*",)]
        parts = [re.sub(r"\bas\b.*", "", x) for x in parts]
        if parts[0] == "crate":
            out.add(tuple(parts[1:]))
        elif parts[0] in ("super", "self"):
            base = list(here)
            while parts and parts[0] in ("super", "self"):
                if parts.pop(0) == "super":
                    base.pop()
            out.add(tuple(base + parts))
    return out


def resolve(path: tuple, files: dict):
    """The file that defines the longest module prefix of `path`."""
    for n in range(len(path), 0, -1):
        if path[:n] in files:
            return path[:n]
    return None


def circles(edges: dict) -> list:
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    files = {}
    for f in sorted(SRC.rglob("*.rs")):
        rel = f.relative_to(SRC)
        if "tests" in rel.parts[:-1] or rel.name.endswith("_tests.rs") or rel.name == "tests.rs":
            continue
        if rel.name.startswith("tests_"):
            continue
        files[module_of(f)] = f
    edges = {}
    for mod, f in files.items():
        text = strip_tests(f.read_text())
        targets = set()
        for p in paths_in(text, mod):
            t = resolve(p, files)
            if t is not None and t != mod and not (mod and t == mod[:len(t)]):
                targets.add(t)
        edges[mod] = targets
    name = lambda m: str(files[m].relative_to(SRC)) if m in files else "/".join(m)
    bad = 0
    if "--dot" in sys.argv:
        rooms = {(a[0], b[0]) for a, bs in edges.items() for b in bs if a and b and a[0] != b[0]}
        print("digraph gpuq {")
        for a, b in sorted(rooms):
            print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    for comp in circles(edges):
        bad += 1
        print("circle:", " <-> ".join(name(m) for m in comp))
    for a, bs in sorted(edges.items()):
        if not a:
            continue
        room = a[0]
        allowed = ROOMS.get(room, set())
        for b in sorted(bs):
            if "--edges" in sys.argv:
                print(f"edge: {name(a)} -> {name(b)}")
            if not b or b[0] == room or allowed is None:
                continue
            if b[0] not in allowed:
                bad += 1
                print(f"against the direction: {name(a)} -> {name(b)} ({room} may not use {b[0]})")
    n_edges = sum(len(b) for b in edges.values())
    print(f"{len(files)} files, {n_edges} edges, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
