"""The source layout keeps its layers: every folder is a layer, no folder imports one above it, and
no two folders (or modules) import each other. Also the layout's other rules: no function over
100 lines, and a test file per stage.

The test reads every module of ``pipeline/`` and ``benchmarks/`` with ``ast`` (nothing is
imported), collects each ``import``/``from ... import`` wherever it stands (module level or inside
a function: a lazy import is still a dependency), resolves it to a module of the tree, and checks
the resulting graph at the level of folders. An import by name (``importlib.import_module``,
``__import__``) is a dependency too: a literal name (or an f-string's literal prefix) is resolved
as written; a computed one (``import_module(TASKS[name])``, ``import_module(t.pruning)``)
depends on every module of the tree its argument can name: the module names the module assigns
to its own variables (a registry dict such as ``TASKS``) and, for an attribute, every module name
the tree assigns to an attribute of that name (``pruning = "pipeline.models..."`` in a task
class). A computed name it cannot resolve fails, unless it loads the user's own code
(``NAMED_BY_THE_USER``). A module belongs to the folder it sits in; there is no per-module
table. One rule is by name: a ``__main__`` module is how ``python -m`` finds a command line, so
it counts as ``cli`` wherever it sits (it only calls ``pipeline.cli``).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A folder may import from its own layer and from any layer below, never from one
# above; folders of one layer may import each other as long as no cycle forms.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Knows nothing of models, stages or options: errors, this machine, cache-key and lock
    # helpers, the artifact record and its seal, child processes, a user's files, number formats.
    ("core", ("pipeline", "core")),
    # The typed schema of every config group: plain dataclasses and enums that every capability
    # may read.
    ("config", ("config",)),
    # The task contract (inputs, outputs, splits, batches, the Task protocol) and a metric's
    # direction and unit: what data, metrics and models all speak.
    ("task", ("task",)),
    # Libraries, each about one thing, called by stages and by the command lines; none knows the
    # order of work. quant/ holds the quantization capability (defaults from the CPU, calibration
    # methods, node names), not sequences of stages.
    ("capabilities", ("metrics", "data", "runtimes", "prune", "models", "bill", "measure",
                      "registry", "quant")),
    # Overrides into a Config (compose applies this machine's measured profile), the cached stage
    # runner and its Ray executor.
    ("engine", ("engine",)),
    # One module per stage, plus their private helpers.
    ("stages", ("stages",)),
    # Judges stage outputs; what a recipe returns.
    ("gate", ("gate",)),
    # Sequences of stages: the order of work and its sub-recipes.
    ("recipes", ("recipes",)),
    # What a finished run becomes: report.json/report.md and their sections, the manifest.
    ("report", ("report",)),
    # The model server: a published artifact behind HTTP, its batcher and its load generator.
    ("serve", ("serve",)),
    # Entry points: the command lines and sweeps.
    ("cli", ("cli",)),
    # make bench measures the library from outside it.
    ("benchmarks", ("benchmarks",)),
]


# Modules whose import by a computed name loads the user's code, never a module of this tree.
NAMED_BY_THE_USER = {
    "pipeline.models.torch_factory": "model.factory=package.module:function, the user's network",
}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for top in ("pipeline", "benchmarks"):
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _resolver(mods: dict[str, Path]):
    def resolve(name: str) -> str | None:  # the module itself, or the package that holds it
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None
    return resolve


def _module_names(node: ast.AST, mods: dict[str, Path]) -> set[str]:
    """Every string constant under ``node`` that names a module of the tree (``mod:attr`` too)."""
    out = set()
    for c in ast.walk(node):
        if isinstance(c, ast.Constant) and isinstance(c.value, str):
            name = c.value.partition(":")[0]
            if name in mods:
                out.add(name)
    return out


def _held_by_attribute(trees: dict[str, ast.AST], mods: dict[str, Path]) -> dict[str, set[str]]:
    """attribute name -> the tree's modules some module assigns to an attribute of that name
    (``pruning = "pipeline.models.torch_prune"`` in a class, ``self.pruning = "..."``)."""
    held: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                names = _module_names(node.value, mods)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets if names else ():
                    attr = (t.id if isinstance(t, ast.Name)
                            else t.attr if isinstance(t, ast.Attribute) else None)
                    if attr:
                        held.setdefault(attr, set()).update(names)
    return held


def _is_named_import(call: ast.Call) -> bool:
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return name in ("import_module", "__import__") and bool(call.args)


def _named_imports(name: str, tree: ast.AST, mods: dict[str, Path],
                   held: dict[str, set[str]]) -> tuple[set[str], list[str]]:
    """The tree's modules ``name`` imports by name, and the computed names it cannot resolve."""
    resolve = _resolver(mods)
    deps, unresolved = set(), []
    own = set()  # the module names it holds in variables (a registry dict such as TASKS)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            own |= _module_names(node.value, mods)
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_named_import(n)):
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            deps.add(resolve(arg.value))
            continue
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            deps.add(resolve(arg.values[0].value.rstrip(".")))  # f"benchmarks.zoo.{name}"
            continue
        found = set(own)  # the candidates the module lists itself (a registry dict)
        for n in ast.walk(arg):
            if isinstance(n, ast.Attribute):
                found |= held.get(n.attr, set())
        if found:
            deps |= found
        elif name not in NAMED_BY_THE_USER:
            unresolved.append(f"{name}:{call.lineno} import_module({ast.unparse(arg)})")
    return deps, unresolved


def _graph(mods: dict[str, Path], unresolved: list[str] | None = None) -> dict[str, set[str]]:
    resolve = _resolver(mods)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in mods.items()}
    held = _held_by_attribute(trees, mods)
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(trees[name]):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level-1 packages
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:  # `from pipeline import gate` names the module pipeline.gate
                    full = f"{base}.{a.name}"
                    deps.add(full if full in mods else resolve(base))
        by_name, unseen = _named_imports(name, trees[name], mods, held)
        deps |= by_name
        if unresolved is not None:
            unresolved += unseen
        deps.discard(None)
        deps.discard(name)
        graph[name] = deps
    return graph


@functools.cache
def _this_tree() -> tuple[dict[str, set[str]], tuple[str, ...]]:
    """This tree's import graph and its unresolved imports by name, parsed once for the four
    tests that read them (4 s a parse on 2 busy cores)."""
    unresolved: list[str] = []
    graph = _graph(_modules(), unresolved)
    return graph, tuple(unresolved)


def _folder(module: str) -> str:
    """The folder a module sits in: ``pipeline.models.ocr.task`` -> ``models``."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "cli"
    if parts[0] == "benchmarks":
        return "benchmarks"
    return parts[1] if len(parts) > 1 else "pipeline"


def _rank(folder: str) -> int | None:
    for i, (_, folders) in enumerate(LAYERS):
        if folder in folders:
            return i
    return None


def _folder_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """folder -> folder it imports -> the module-level imports behind that edge."""
    out: dict[str, dict[str, list[str]]] = {}
    for m, deps in graph.items():
        for d in deps:
            a, b = _folder(m), _folder(d)
            if a != b:
                out.setdefault(a, {}).setdefault(b, []).append(f"{m} -> {d}")
    return out


def test_only_entry_points_at_the_top():
    top = sorted(p.name for p in (ROOT / "pipeline").glob("*.py"))
    assert top == ["__init__.py", "__main__.py"], f"modules outside any folder: {top}"


def test_every_folder_has_a_layer():
    folders = [f for _, fs in LAYERS for f in fs]
    assert len(folders) == len(set(folders)), "a folder is listed in two layers"
    missing = sorted({_folder(m) for m in _modules()} - set(folders))
    assert not missing, f"folders in no layer (add them to LAYERS): {missing}"


def test_no_import_up_the_layers():
    edges = _folder_graph(_this_tree()[0])
    upward = [f"{a} ({LAYERS[_rank(a)][0]}) imports {b} ({LAYERS[_rank(b)][0]}): "
              + ", ".join(sorted(edges[a][b]))
              for a in sorted(edges) for b in sorted(edges[a]) if _rank(b) > _rank(a)]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]] | dict[str, dict]) -> list[list[str]]:
    # Tarjan's strongly connected components: any component of more than one node is a cycle.
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_folder_cycle():
    edges = _folder_graph(_this_tree()[0])
    cycles = _cycles(edges)
    detail = [f"{a} -> {b}: {sorted(edges[a][b])}" for c in cycles for a in c for b in c
              if b in edges.get(a, {})]
    assert not cycles, f"folders that import each other: {cycles}\n" + "\n".join(detail)


def test_no_import_cycle():
    cycles = _cycles(_this_tree()[0])
    assert not cycles, f"import cycles: {cycles}"


def test_imports_by_name_resolve():
    unresolved = _this_tree()[1]
    assert not unresolved, ("imports by a computed name the layering cannot follow (name the "
                            "candidates in the module, or go through a contract):\n"
                            + "\n".join(unresolved))


# A function over this many lines (decorators aside, nested functions included) is split into
# named phases: one screen per idea.
MAX_FUNCTION_LINES = 100


def _function_lengths(root: Path = ROOT) -> dict[str, int]:
    out = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(root)}:{node.name}"
                out[where] = max(out.get(where, 0), node.end_lineno - node.lineno + 1)
    return out


def test_no_function_over_100_lines():
    long = sorted(f"{f} ({n} lines)" for f, n in _function_lengths().items()
                  if n > MAX_FUNCTION_LINES)
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named "
                      "phases):\n" + "\n".join(long))


def test_every_stage_module_has_its_test_file():
    """Tests mirror the code: ``pipeline/stages/x.py`` (a stage module; private helpers are
    ``_x.py``) is tested through its stage interface in ``tests/stages/test_x.py``."""
    modules = sorted(p.stem for p in (ROOT / "pipeline" / "stages").glob("*.py")
                     if not p.name.startswith("_"))
    no_stage = [m for m in modules if not any(
        isinstance(n, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "run"
                                            for f in n.body)
        for n in ast.parse((ROOT / "pipeline" / "stages" / f"{m}.py").read_text()).body)]
    assert not no_stage, f"stage modules without a stage (a helper is named _x.py): {no_stage}"
    untested = [m for m in modules if not (ROOT / "tests" / "stages" / f"test_{m}.py").is_file()]
    assert not untested, f"stages without tests/stages/test_<stage>.py: {untested}"


def test_an_import_by_name_is_a_dependency(tmp_path):
    """What the layering test follows on a tree of its own: a literal name, an f-string's
    prefix, a registry dict of the module itself, an attribute that another module assigns a
    module name to (the way prune/helper.py once imported models by a task's ``pruning``
    string), and a computed name it cannot resolve."""
    files = {
        "pipeline/__init__.py": "",
        "pipeline/models/__init__.py": "",
        "pipeline/models/task.py": 'class T:\n    pruning = "pipeline.models.rule"\n',
        "pipeline/models/rule.py": "",
        "pipeline/prune/__init__.py": "",
        "pipeline/prune/helper.py": ("import importlib\n"
                                     "def helper(t):\n"
                                     "    return importlib.import_module(t.pruning)\n"),
        "pipeline/runtimes/__init__.py": ('BACKENDS = {"a": "pipeline.runtimes.a"}\n'
                                          "def backend(n):\n"
                                          "    return __import__(BACKENDS[n])\n"),
        "pipeline/runtimes/a.py": "",
        "pipeline/data/__init__.py": ("from importlib import import_module\n"
                                      'import_module("pipeline.models.rule")\n'
                                      'import_module(f"pipeline.runtimes.{1}")\n'
                                      "def load(name):\n"
                                      "    return import_module(name)\n"),
        "benchmarks/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    unresolved: list[str] = []
    graph = _graph(_modules(tmp_path), unresolved)
    assert graph["pipeline.prune.helper"] == {"pipeline.models.rule"}
    assert graph["pipeline.runtimes"] == {"pipeline.runtimes.a"}
    assert graph["pipeline.data"] == {"pipeline.models.rule", "pipeline.runtimes"}
    assert unresolved == ["pipeline.data:5 import_module(name)"]
