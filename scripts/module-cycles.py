#!/usr/bin/env python3
"""Import cycles between modules of each crate (scripts/module-cycles.py).

A module's file names other modules through `crate::a::b` and `super::`
paths. An edge A -> B joins two modules when a file of A names B and neither
is inside the other (a parent and its children share their items by
design). Every strongly connected component of more than one module is a
cycle; the script lists them and exits 1 when there is one.
"""
import os
import re
import sys

CRATES = ["shm-protocol", "peer", "rdma", "agent", "tools", "client-c", "bench"]
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)::\{([^}]*)\}")


def modules(src):
    """Module path (tuple) of every .rs file under src."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts and parts[0] == "bin":
                continue
            out[os.path.join(dirpath, f)] = tuple(parts)
    return out


def resolve(known, base, names):
    """The longest known module that `base + names` starts with."""
    path = list(base) + names
    while path:
        if tuple(path) in known:
            return tuple(path)
        path.pop()
    return None


def edges_of(path, me, known):
    text = open(path, encoding="utf-8").read()
    # Test modules are left out: `#[cfg(test)] mod tests { ... }` at the end.
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    text = re.sub(r"//[^\n]*", "", text)
    found = set()
    refs = []
    for m in GROUP.finditer(text):
        for item in m.group(2).split(","):
            item = item.strip().split(" as ")[0]
            if item:
                refs.append((m.group(1), "::" + item.replace("{", "").strip()))
    refs += [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
    for kind, rest in refs:
        names = [n for n in rest.split("::") if n]
        if kind == "crate":
            base = ()
        else:
            base = list(me)
            # `super` from a mod.rs/lib.rs file is the parent of its module.
            while names and names[0] == "super":
                names = names[1:]
                base = base[:-1]
            base = base[:-1]
        target = resolve(known, base, names)
        if target is None or target == me:
            continue
        if target[: len(me)] == me or me[: len(target)] == target:
            continue
        found.add(target)
    return found


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    total = 0
    for crate in CRATES:
        src = os.path.join(root, crate, "src")
        files = modules(src)
        known = set(files.values()) | {()}
        graph = {}
        for path, me in files.items():
            graph.setdefault(me, set()).update(edges_of(path, me, known))
        for comp in sccs(graph):
            if len(comp) > 1:
                total += 1
                names = sorted("::".join(m) or "(root)" for m in comp)
                print(f"{crate}: cycle between {', '.join(names)}")
    print(f"{total} import cycles between modules")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
