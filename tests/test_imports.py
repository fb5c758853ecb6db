"""The import graph of ``analyzer/`` has no cycle, commands and presentation sit above the
readers and the replayer, and ``forensics --help`` stays light.

The graph is read from the source with ``ast``, nothing imported. Every import counts: at
module level, under ``if TYPE_CHECKING:`` and inside functions, since a lazy import that
breaks a cycle at run time still leaves the cycle in the design. ``from a.b import c`` is
an edge to the module ``a.b.c`` when there is one, else to ``a.b``. Running a package's
``__init__`` on the way to one of its submodules is not an edge: a package may re-export
its submodules, and a submodule that wants a sibling's name imports the sibling, never its
own package (that would be a cycle through ``__init__``). Strings are not imports: the lazy
export table of ``analyzer/__init__.py`` names modules without importing them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ALLOWED: dict[tuple[str, str], str] = {}
"""Edges left out of the check, each with what removes it; empty when the graph is a DAG.
A listed edge that no longer exists fails the test, so the list only shrinks."""


def modules(root: Path, package: str = "analyzer") -> dict[str, Path]:
    """Every module of ``package`` below ``root``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, tree: ast.AST, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for every import statement anywhere in ``tree``, relative ones made
    absolute; ``names`` is empty for ``import a.b``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            yield base, [alias.name for alias in node.names]


def graph(root: Path, package: str = "analyzer") -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    mods = modules(root, package)
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets: set[str] = set()
        for base, names in _imported(name, tree, path.name == "__init__.py"):
            if not names:
                targets.add(base)
            for item in names:
                targets.add(f"{base}.{item}" if f"{base}.{item}" in mods else base)
        edges[name] = {t for t in targets if t in mods and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (or a
    module importing itself), as ``[a, b, ..., a]``; Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    components.append(component)
    return [_cycle_in(c, edges) for c in components]


def _cycle_in(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest way from the component's first module back to itself."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start \
                        else [start, start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in {sorted(component)}")  # pragma: no cover


def test_the_import_graph_of_analyzer_has_no_cycle() -> None:
    edges = graph(ROOT)
    stale = [edge for edge in ALLOWED if edge[1] not in edges.get(edge[0], set())]
    assert not stale, f"allowed edges that no longer exist, delete them from ALLOWED: {stale}"
    for source, target in ALLOWED:
        edges[source].discard(target)
    found = cycles(edges)
    assert not found, "import cycles in analyzer/ (import from the defining module):\n" + \
        "\n".join("  " + " -> ".join(cycle) for cycle in found)


READERS = ("analyzer.ingest", "analyzer.replayer", "analyzer.model", "analyzer.onset",
           "analyzer.rules", "analyzer.capture", "analyzer.tags")
"""What reads and computes: it returns records, and neither prints them nor picks an exit
status."""


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_commands_and_presentation_sit_above_readers_and_replay() -> None:
    edges = graph(ROOT)
    wrong = sorted(
        (source, target) for source, targets in edges.items() for target in targets
        if (_within(target, "analyzer.cli") and not _within(source, "analyzer.cli"))
        or (_within(target, "analyzer.report") and any(_within(source, r) for r in READERS)))
    assert not wrong, f"imports of the commands or of the presentation from below: {wrong}"


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_sees_lazy_type_only_relative_and_package_imports(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "from pkg.sub import thing\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "b.py": "def f():\n    from .a import x\n",
        "sub/__init__.py": "",
        "sub/thing.py": "from pkg import VALUE\n",
        "c.py": "import pkg.d\n",
        "d.py": "from pkg.sub.thing import name\nfrom . import c\n",
    })
    edges = graph(root, "pkg")
    assert edges["pkg"] == {"pkg.sub.thing"}
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.a"}
    assert edges["pkg.sub.thing"] == {"pkg"}  # its own package's __init__: an edge
    assert edges["pkg.d"] == {"pkg.sub.thing", "pkg.c"}
    assert sorted(cycles(edges)) == [["pkg", "pkg.sub.thing", "pkg"], ["pkg.a", "pkg.b", "pkg.a"],
                                     ["pkg.c", "pkg.d", "pkg.c"]]


def test_every_module_of_analyzer_is_in_the_graph() -> None:
    edges = graph(ROOT)
    assert {"analyzer", "analyzer.cli", "analyzer.report", "analyzer.model"} <= set(edges)
    assert len(edges) == len(list((ROOT / "analyzer").rglob("*.py")))


def _heavy_after(code: str, heavy: tuple[str, ...] = ("torch", "streamlit")) -> list[str]:
    probe = (f"import sys\n{code}\n"
             f"print([m for m in {heavy!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("[")][-1:]


def test_help_imports_neither_torch_nor_streamlit() -> None:
    for argv in (["--help"], ["replay", "--help"], ["inspect", "--help"]):
        code = ("from analyzer.cli import main\n"
                f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n"
                "    assert exc.code == 0, exc.code")
        assert _heavy_after(code) == ["[]"], argv


def test_help_imports_neither_numpy_nor_protobuf() -> None:
    # The parser lists the replay's dtypes from a leaf module: importing the replayer's
    # package for them pulled in the records, numpy with them (0.4 s of a 0.5 s --help).
    for argv in (["--help"], ["analyze", "--help"], ["replay", "--help"]):
        code = ("from analyzer.cli import main\n"
                f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n"
                "    assert exc.code == 0, exc.code")
        assert _heavy_after(code, ("numpy", "google.protobuf", "pandas")) == ["[]"], argv


def _small_run(folder: Path, optimizer_kind: str = "sgd") -> Path:
    """A run of a log and two checkpoints, a torch.save archive (SGD's momentum or Adam's
    moments beside the model) and a safetensors file holding a NaN, written by the real
    writers."""
    import torch
    from safetensors.torch import save_file

    run = folder / "run"
    (run / "checkpoints").mkdir(parents=True)
    model = torch.nn.Linear(4, 3)
    optimizer = (torch.optim.Adam(model.parameters(), lr=0.1) if optimizer_kind == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 5},
               run / "checkpoints" / "step_5.pt")
    save_file({"weight": torch.randn(3, 4), "bias": torch.full((3,), float("nan"))},
              str(run / "checkpoints" / "step_9.safetensors"))
    (run / "train.log").write_text("step 1 loss 0.5\nstep 2 loss nan\n")
    return run


@pytest.mark.parametrize("optimizer_kind", ["sgd", "adam"])
def test_analyze_of_a_small_run_imports_neither_torch_nor_pandas(tmp_path: Path,
                                                                 optimizer_kind: str) -> None:
    # Before: the checkpoint scan imported torch (1.8 s of a 2.5 s analyze) to decide the
    # pickle and to reduce the values; both are done without it for these files now. Adam's
    # ratio |m| / (sqrt(v) + eps) took torch's float32 root (not correctly rounded, so numpy
    # could not match it): both readings take IEEE's root now.
    run = _small_run(tmp_path, optimizer_kind)
    code = ("from analyzer.cli import main\n"
            f"assert main(['analyze', {str(run)!r}, '--no-replay']) == 1")
    assert _heavy_after(code, ("torch", "pandas", "scipy", "streamlit")) == ["[]"]


APP_MAY_IMPORT = {
    "analyzer.pipeline": "the stages, which the dashboard caches one by one",
    "analyzer.model": "the records it shows",
    "analyzer.errors": "the errors a stage raises",
    "analyzer.tags": "which tag is the loss, the gradient norm, a layer's",
    "analyzer.wording": "a step and a failing place in words, as the report says them",
    "analyzer.report": "the replay's text, as forensics replay prints it",
    "analyzer.trust": "the folders trusted to replay, and recording one",
    "analyzer.rules": "explain(code): a rule's documentation",
    "analyzer.replayer": "DTYPE_CHOICES: the dtypes a replay can be asked for",
    "analyzer.ingest.safeio": "opening a log without following it into a FIFO or device",
    "analyzer.ingest.discover": "walk_tree, to fingerprint a capture's files",
    "analyzer.ingest.tb": "is_event_file, to count a run's event files",
    "analyzer.capture.folder": "the name of env.json, a file of a run's fingerprint",
    "analyzer.ingest.storage": "a URL told from a local path, its parent, join and relative "
                               "path, and an object's listing: a root on object storage",
    "analyzer.fleet.summary": "summarize: the sweep summary of the results the runs table "
                              "keeps, the Fleet page's stage",
    "analyzer.fleet.hyperparams": "a run's hyperparameters as the sweep summary reads them: "
                                  "the Compare page's table of differing settings",
    "analyzer.frames": "summary_frames and its column names: the sweep summary's frames, as "
                       "the API gives them",
}
"""What the dashboard may import of the analyzer, and why: the stages and their records, the
shared vocabulary and wording, and the safe readers it needs to show a file."""


def _app_imports() -> set[tuple[str, str]]:
    out = set()
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for base, names in _imported("app", tree, False):
            for name in names or [""]:
                dotted = f"{base}.{name}" if name else base
                if dotted == "analyzer" or dotted.startswith("analyzer."):
                    out.add((str(path.relative_to(ROOT)), dotted))
    return out


def test_the_dashboard_calls_only_the_public_stages() -> None:
    # A stage re-implemented in app/ (analyze(rules=False) then the rules' internals, once)
    # imports something below the stages.
    found = _app_imports()
    assert any(target.startswith("analyzer.pipeline") for _, target in found)
    wrong = sorted((path, target) for path, target in found
                   if not any(_within(target, allowed) for allowed in APP_MAY_IMPORT)
                   or (_within(target, "analyzer.rules") and target != "analyzer.rules.explain")
                   or (_within(target, "analyzer.replayer")
                       and target != "analyzer.replayer.DTYPE_CHOICES"))
    assert not wrong, f"app/ reaches below the stages: {wrong}"
