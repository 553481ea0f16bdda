"""The layering, checked: cli → job → engine + io_formats, nothing running back up, and no import cycles.

Every import of every module is read (ast): module level, functions and TYPE_CHECKING blocks alike, for the
layering and for cycles (a deferred import inside a function still ties the two modules together).
score_batch/'s own modules (errors, choices, signals, …) sit below every layer; its __init__ is the public
namespace, which imports the Python API lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("cli", "job", "engine", "io_formats")
# What each layer may import besides itself and score_batch's own modules.
ALLOWED = {
    "cli": {"job", "engine", "io_formats"},
    "job": {"engine", "io_formats"},
    "engine": set(),
    "io_formats": set(),
}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (score_batch.engine.scorer → engine/scorer.py)."""
    found = {
        "score_batch." + ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for layer in LAYERS
        for path in (ROOT / layer).rglob("*.py")
    }
    found.update({f"score_batch.{path.stem}": path for path in (ROOT / "score_batch").glob("*.py")})
    return {name.removesuffix(".__init__"): path for name, path in found.items()}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules this module imports (`from score_batch.x import y` names y when y is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                ).strip(".")
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            )
    return {module for module in found if module in known and module != name}


def layer_of(module: str) -> str | None:
    """cli, job, engine or io_formats; None for score_batch's own modules."""
    part = module.split(".")[1] if module.count(".") else None
    return part if part in LAYERS else None


def graph() -> dict[str, set[str]]:
    """Each module → the package's modules it imports."""
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Imports that run against the layering, as 'importer → imported'."""
    wrong = []
    for importer, targets in edges.items():
        layer = layer_of(importer)
        for target in targets:
            other = layer_of(target)
            if importer == "score_batch":  # the public namespace: the Python API, imported lazily
                continue
            if (
                layer is None
                and other is not None
                or layer
                and other
                and other != layer
                and other not in ALLOWED[layer]
            ):
                wrong.append(f"{importer} → {target}")
    return sorted(wrong)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Modules that import each other, directly or around a loop (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


# engine/'s rooms, bottom first: each imports only rooms below it (and itself). The base is the records,
# configs, errors and activations every room shares; the top is the Python API (Scorer, the CrossEncoder surface).
ENGINE_ROOMS = ("base", "text", "plan", "attention", "native", "model", "run", "api")
ENGINE_BASE = {"errors", "config", "types", "activation"}
ENGINE_API = {"", "scorer", "crossencoder", "ce_arguments"}


def engine_room(module: str) -> str | None:
    """The room of an engine module (score_batch.engine.plan.planner → plan); None outside engine/."""
    if not (module == "score_batch.engine" or module.startswith("score_batch.engine.")):
        return None
    rest = module.removeprefix("score_batch.engine").lstrip(".").split(".")[0]
    if rest in ENGINE_BASE:
        return "base"
    return "api" if rest in ENGINE_API else rest


def climbs(edges: dict[str, set[str]], room_of, rooms: tuple[str, ...]) -> list[str]:
    """Imports from a room to a room above it in rooms (bottom first), as 'importer → imported'; room_of names a
    module's room, None outside the package."""
    wrong = []
    for importer, targets in edges.items():
        room = room_of(importer)
        for target in targets:
            other = room_of(target)
            if room is not None and other is not None and rooms.index(other) > rooms.index(room):
                wrong.append(f"{importer} → {target}")
    return sorted(wrong)


def test_engine_rooms_import_only_rooms_below():
    edges = graph()
    assert {engine_room(m) for m in edges} - {None} == set(ENGINE_ROOMS)  # every module is in a named room
    assert climbs(edges, engine_room, ENGINE_ROOMS) == []


# job/'s rooms, bottom first: each imports only rooms below it (and itself); the top is run(config), job/__init__.py.
JOB_ROOMS = (
    *("run_config", "score_stats", "checkpoint", "preflight", "report", "windows", "outputs", "policy"),
    *("reuse", "runners", ""),
)


def job_room(module: str) -> str | None:
    """The room of a job module (score_batch.job.checkpoint.identity → checkpoint); None outside job/."""
    if not (module == "score_batch.job" or module.startswith("score_batch.job.")):
        return None
    return module.removeprefix("score_batch.job").lstrip(".").split(".")[0]


def test_job_rooms_import_only_rooms_below():
    edges = graph()
    assert {job_room(m) for m in edges} - {None} == set(JOB_ROOMS)  # every module is in a named room
    assert climbs(edges, job_room, JOB_ROOMS) == []


def test_no_layer_imports_upward():
    assert upward_imports(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_graph_sees_the_layers():
    edges = graph()
    assert "score_batch.engine.model.setup" in edges["score_batch.engine.scorer"]
    assert "score_batch.engine.scorer" in edges["score_batch.job.runners.phase"]
    assert "score_batch.choices" in edges["score_batch.cli.options"]
