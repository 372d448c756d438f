"""The source layout keeps its layers: no import cycle, and no import up the layers.

The test reads every module of ``pipeline/`` and ``benchmarks/`` with ``ast`` (nothing is
imported), collects each ``import``/``from ... import`` wherever it stands (module level or inside
a function: a lazy import is still a dependency), resolves it to a module of the tree, and checks
the resulting graph. A new module lands in the layer of its package; a module whose package does
not say where it belongs fails the test until ``LAYERS`` names it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A module may import from its own layer and from any layer below, never from one
# above. Entries are module names or package prefixes; the longest matching entry wins, so a
# package can sit in one layer and one of its modules in another.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Knows nothing of models, stages or options: errors, this machine, cache-key and lock
    # helpers, the artifact record, child processes.
    ("core", ("pipeline", "pipeline.errors", "pipeline.env", "pipeline.locks",
              "pipeline.leftovers", "pipeline.seal", "pipeline.artifact", "pipeline.interrupt",
              "pipeline.isolate")),
    # The typed schema of every config group: plain dataclasses and enums that every
    # capability may read (the bill reads Precision), so it must not import any of them. The
    # data= and metric= groups' schemas live beside the code that reads them.
    ("config", ("pipeline.config", "pipeline.data.spec", "pipeline.metrics.config")),
    # Libraries, each about one thing, called by stages and by the CLIs; none knows the order of
    # work. Peers in one layer may import each other (models decode with metrics, cold start
    # times a runtime) as long as no cycle forms.
    ("capabilities", ("pipeline.data", "pipeline.metrics", "pipeline.runtimes",
                      "pipeline.measure", "pipeline.models", "pipeline.registry",
                      "pipeline.bill", "pipeline.prune", "pipeline.quant.defaults",
                      "pipeline.quant.calibration", "pipeline.quant.modules",
                      "pipeline.quant.index_nodes", "pipeline.quant.mask_nodes",
                      "pipeline.quant.sensitivity")),
    # The engine that turns overrides into a Config (compose applies this machine's hardware
    # numbers from the bill, so it sits above the capabilities) and runs stages (runner, and its
    # Ray executor for timed stages on a cluster).
    ("engine", ("pipeline.compose", "pipeline.runner", "pipeline.cluster")),
    # One module per stage, plus their private helpers.
    ("stages", ("pipeline.stages",)),
    # Judges stage outputs; the sub-recipes judge candidates with it (quant=auto).
    ("gate", ("pipeline.gate", "pipeline.outcome")),
    # Sub-recipes: sequences of stages for one capability (INT8, mixed search, float regions,
    # quant=auto).
    ("sub-recipes", ("pipeline.quant",)),
    # The order of work.
    ("recipe", ("pipeline.recipe",)),
    # What a finished run becomes: report.json/report.md and their sections, the manifest.
    ("report", ("pipeline.report", "pipeline.quant.report", "pipeline.quant.auto_report")),
    # Entry points: many runs at once, and the command lines.
    ("cli", ("pipeline.sweep", "pipeline.__main__", "pipeline.llm", "pipeline.finish", "pipeline.registry.__main__",
             "pipeline.bill.__main__")),
    # make bench measures the library from outside it.
    ("benchmarks", ("benchmarks",)),
]


def _modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for top in ("pipeline", "benchmarks"):
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:  # the module itself, or the package that holds it
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
        deps.discard(None)
        deps.discard(name)
        graph[name] = deps
    return graph


def _layer(module: str) -> int | None:
    best, rank = -1, None
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > best:
                best, rank = len(entry), i
    return rank


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if _layer(m) is None)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_no_import_up_the_layers():
    graph = _graph(_modules())
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
              for m, deps in sorted(graph.items()) for d in sorted(deps)
              if _layer(d) is not None and _layer(m) is not None and _layer(d) > _layer(m)]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycle():
    graph = _graph(_modules())
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
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
    assert not cycles, f"import cycles: {cycles}"


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    """The checks above are only as good as the graph: a function-level import, a relative one
    and ``from package import module`` must all be edges."""
    pkg = tmp_path / "pipeline"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from pipeline import errors\n")
    (pkg / "sub" / "b.py").write_text("from . import a\nfrom ..errors import x\n")
    (tmp_path / "benchmarks").mkdir()
    graph = _graph(_modules(tmp_path))
    assert graph["pipeline.sub.a"] == {"pipeline.errors"}
    assert graph["pipeline.sub.b"] == {"pipeline.sub.a", "pipeline.errors"}


def test_every_stage_is_a_stage():
    """Each stage module holds a frozen dataclass that meets ``runner.Stage``: its fields are
    its key, so a mutable one could change after its key was taken."""
    import dataclasses
    import importlib
    import inspect

    from pipeline.runner import Stage

    found = []
    for path in sorted((ROOT / "pipeline" / "stages").glob("[!_]*.py")):
        module = importlib.import_module(f"pipeline.stages.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not hasattr(cls, "hardware_dependent"):
                continue
            found.append(cls.__name__)
            assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
            assert isinstance(cls.name, str) and isinstance(cls.version, int), cls
            assert isinstance(cls.hardware_dependent, bool), cls
            params = list(inspect.signature(cls.run).parameters)
            assert params[:3] == ["self", "parent", "out_dir"], (cls, params)
            assert set(Stage.__annotations__) <= set(dir(cls)), cls
    assert {"Load", "Export", "Evaluate", "Benchmark", "Explain"} <= set(found)
