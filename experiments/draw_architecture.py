"""Draw the architecture: the import graph of the packages and sub-packages, read from the code with grimp.

Each node is a package or sub-package (its own modules, not its sub-packages); each arrow is "imports",
labelled with how many module-to-module imports it stands for. The picture is a Mermaid flowchart in
`docs/architecture.md` (GitHub renders it). Redraw it after every change that moves an import:

    python experiments/draw_architecture.py            # rewrites docs/architecture.md
    python experiments/draw_architecture.py --check    # exits 1 if docs/architecture.md is stale (run by the tests)
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "architecture.md"
PACKAGES = ("dynvocab", "encoders", "retrieval", "evals")

HEADER = """# Architecture: who imports whom

The import graph of the library's packages and sub-packages, drawn from the code by
`python experiments/draw_architecture.py` (a test fails when this page is stale). An arrow `A --> B`
means modules of `A` import modules of `B`; its label counts those module-to-module imports. A node
stands for a package's own modules, not its sub-packages. The contracts that keep this graph one-way
are in `pyproject.toml` (`[tool.importlinter]`, checked by `lint-imports` in `make test`).
Back to the [README](../README.md).
"""


def node_of(module: str, nodes: set[str]) -> str:
    """The deepest package in ``nodes`` that holds ``module``."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in nodes:
            return ".".join(parts[:depth])
    raise ValueError(f"{module} is in no package of {sorted(nodes)}")


def import_graph() -> tuple[list[str], Counter]:
    """The packages and sub-packages, and the count of module imports between each ordered pair of them."""
    import grimp

    graph = grimp.build_graph(*PACKAGES)
    modules = sorted(graph.modules)
    nodes = {m for m in modules if (ROOT / m.replace(".", "/") / "__init__.py").is_file()}
    edges: Counter = Counter()
    for module in modules:
        source = node_of(module, nodes)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] in PACKAGES and (target := node_of(imported, nodes)) != source:
                edges[source, target] += 1
    return sorted(nodes), edges


def mermaid(nodes: list[str], edges: Counter) -> str:
    """A Mermaid flowchart: one subgraph per top-level package, its sub-packages inside."""
    key = {node: node.replace(".", "_") for node in nodes}
    lines = ["```mermaid", "flowchart TD"]
    for package in PACKAGES:
        lines.append(f"  subgraph {package}_pkg[{package}]")
        lines += [f'    {key[n]}["{n}"]' for n in nodes if n.split(".")[0] == package]
        lines.append("  end")
    lines += [f"  {key[a]} -->|{count}| {key[b]}" for (a, b), count in sorted(edges.items())]
    lines.append("```")
    return "\n".join(lines)


def page() -> str:
    nodes, edges = import_graph()
    table = ["| from | to | imports |", "|---|---|---|"]
    table += [f"| `{a}` | `{b}` | {count} |" for (a, b), count in sorted(edges.items())]
    return f"{HEADER}\n{mermaid(nodes, edges)}\n\nThe same edges as a table:\n\n" + "\n".join(table) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page differs from the code's graph")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where the page goes (default: docs/architecture.md)")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `python experiments/draw_architecture.py`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
