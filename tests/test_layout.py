"""The layout rules of docs/STYLE.md a script can check: no import circles (imports inside functions
included), no module importing another module's underscore names, no family of 4+ modules sharing a name
prefix on one level, code modules under ~400 lines (a declared table may be longer), lathe/train's top level
small enough to read, no merge-conflict markers in any tracked file, and every lathe import naming a module
that exists (no leftovers of the move into folders). Each failure lists what breaks the rule.

The contracts: MAY_IMPORT is each wing's table of which folder (or top-level module) may import which, inside
the wing; an import it does not declare fails, and so does a loop in the table (the arrows point one way).
docs/LAYOUT.md is written from it and the folders' docstrings by docs/make_layout.py, and fails when stale."""

import ast
import functools
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lathe"
MAX_MODULE_LINES = 400
# Declared tables: data a reader looks up rather than code a reader follows, kept whole in one place.
DECLARED_TABLES: dict[str, str] = {
    "lathe/train/args/training_args.py": "the one table of TrainingArguments' fields (name, type, default, help)",
}
# lathe/'s top level holds transformers' module names (lathe.trainer_callback, lathe.training_args_seq2seq, ...)
# so that `from transformers.X import Y` becomes `from lathe.X import Y`: those families are the peer's.
PEER_NAMED_FAMILIES = {("lathe", "trainer"), ("lathe", "training")}
MAX_TRAIN_TOP_LEVEL = 26  # 25 rooms + accelerator.py (Trainer.accelerator: above parallel, runtime and data)

# Each wing's folders and top-level modules, and which others of the same wing each may import (imports inside
# functions count, `if TYPE_CHECKING:` ones do not). A new arrow is declared here first: keep the table free
# of loops, listed from the top of the house (what the user runs) to its leaves.
MAY_IMPORT: dict[str, dict[str, set[str]]] = {
    "lathe.train": {
        "trainer": {
            "args",
            "batching",
            "callbacks",
            "checkpoints",
            "data",
            "evaluation",
            "features",
            "loop",
            "loss",
            "modeling",
            "optim",
            "parallel",
            "resume",
            "runtime",
            "saving",
            "seed",
            "session",
            "state",
            "stepping",
            "surface",
        },
        "seq2seq": {"parallel", "trainer"},
        "accelerator": {"data", "parallel", "runtime"},
        "surface": {
            "accelerator",
            "data",
            "evaluation",
            "features",
            "modeling",
            "optim",
            "parallel",
            "queries",
            "resume",
            "runtime",
            "saving",
        },
        "queries": {"batching"},
        "loop": {
            "batching",
            "data",
            "evaluation",
            "features",
            "parallel",
            "resume",
            "run",
            "runtime",
            "saving",
            "seed",
            "state",
            "stepping",
        },
        "resume": {"checkpoints", "optim", "parallel", "saving", "state"},
        "saving": {"checkpoints", "evaluation", "parallel", "runtime", "state"},
        "evaluation": {"batching", "checkpoints", "data", "features", "optim", "parallel", "runtime"},
        "stepping": {"optim", "parallel", "runtime"},
        "session": {"features", "seed"},
        "batching": {"data", "parallel"},
        "run": {"parallel"},
        "runtime": {"parallel"},
        "callbacks": {"state"},
        "state": {"checkpoints"},
        "features": {"args"},
        "args": {"accelerator", "callbacks", "parallel", "runtime"},
        "loss": {"data"},
        "parallel": {"checkpoints"},
        "checkpoints": {"seed"},
        "data": {"seed"},
        "modeling": set(),
        "optim": set(),
        "seed": set(),
    },
    "lathe.llm": {
        "commands": {
            "config",
            "data",
            "export",
            "hub",
            "inference",
            "launch",
            "model",
            "multimodal",
            "templates",
            "webui",
            "workflows",
        },
        "webui": {"gguf", "inference", "templates", "workflows"},
        "export": {"gguf", "hub", "inference", "model", "templates", "workflows"},
        "gguf": {"templates"},
        "inference": {"config", "gguf", "hub", "model", "multimodal", "templates", "workflows"},
        "launch": {"config", "hub", "workflows"},
        "workflows": {"config", "data", "memory", "methods", "model", "multimodal", "preference", "rl", "templates"},
        "preference": {"methods", "model"},
        "methods": {"model"},
        "rl": {"model", "templates"},
        "data": {"hub", "multimodal", "path_typos", "strict_files", "templates"},
        "memory": {"multimodal"},
        "model": {"config", "hub", "multimodal", "remote_code"},
        "multimodal": {"hub", "remote_code"},
        "templates": {"strict_files"},
        "config": {"rl", "strict_files"},
        "hub": {"path_typos"},
        "path_typos": set(),
        "remote_code": set(),
        "strict_files": set(),
    },
}
# Arrows that point up on purpose, each with its reason; the loop check leaves them out.
DECLARED_UPWARD: dict[tuple[str, str], str] = {
    ("lathe.llm.config", "lathe.llm.rl"): "config/grpo.py builds rl's GRPOConfig at parse time, so a wrong GRPO "
    "key is refused with TRL's own checks before anything loads",
}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _is_type_checking(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) or getattr(test, "attr", None)) == "TYPE_CHECKING"


def _nodes(tree):
    """Every node but those under `if TYPE_CHECKING:` (annotations only: nothing is imported at run time)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node) if not _is_type_checking(child))


def _imports(path: pathlib.Path):
    """(line, imported module, imported names) for every import in the file, inside functions too."""
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def _targets(module: str, names: list[str]) -> list[str]:
    """The lathe modules an import statement loads: `from a import b` loads a.b when b is a module."""
    if not module.startswith("lathe"):
        return []
    submodules = [f"{module}.{name}" for name in names if f"{module}.{name}" in MODULES]
    return submodules if submodules and len(submodules) == len(names) else [module, *submodules]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """lathe's module -> the lathe modules it imports (parsed once per session; callers only read it)."""
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for _, module, names in _imports(path):
            graph[name].update(target for target in _targets(module, names) if target != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_checks_see_the_package():
    # A wrong path would make every rule below pass on nothing.
    graph = import_graph()
    assert len(MODULES) > 100 and sum(len(targets) for targets in graph.values()) > 300
    assert "lathe.train.data.sampling" in graph["lathe.train.data.loaders"]


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lathe.a import A\n"
        "def f():\n    from lathe.b import B\n"
    )
    assert sorted(module for _, module, _ in _imports(source)) == ["lathe.b", "typing"]


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_no_module_imports_another_modules_private_names():
    private = []
    for name, path in MODULES.items():
        for line, module, names in _imports(path):
            if module.startswith("lathe") and module != name:
                taken = [imported for imported in names if imported.startswith("_") and not imported.startswith("__")]
                private += [f"{path.relative_to(ROOT)}:{line} {module}.{imported}" for imported in taken]
    assert private == []


def test_no_family_of_four_modules_shares_a_prefix():
    families: dict[tuple[str, str], list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "_" in path.stem.strip("_"):
            folder = str(path.parent.relative_to(ROOT))
            families.setdefault((folder, path.stem.split("_")[0]), []).append(path.name)
    large = {key: sorted(names) for key, names in families.items() if len(names) >= 4}
    assert {key: names for key, names in large.items() if key not in PEER_NAMED_FAMILIES} == {}


def test_code_modules_stay_under_400_lines():
    long_modules = {}
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and str(path.relative_to(ROOT)) not in DECLARED_TABLES:
            long_modules[str(path.relative_to(ROOT))] = lines
    assert long_modules == {}
    assert [name for name in DECLARED_TABLES if not (ROOT / name).is_file()] == []


def test_train_top_level_is_small():
    entries = [entry.name for entry in (PACKAGE / "train").iterdir() if entry.name != "__pycache__"]
    assert len(entries) <= MAX_TRAIN_TOP_LEVEL, sorted(entries)


def _tracked_files() -> list[pathlib.Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.splitlines() if (ROOT / name).is_file()]


CONFLICT_MARKER = re.compile(rb"^(<<<<<<< |>>>>>>> |=======$)", re.MULTILINE)


def test_conflict_markers_are_found():
    assert CONFLICT_MARKER.search(b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n")
    assert not CONFLICT_MARKER.search(b"Title\n=====\n<<<< not a marker\n")


def test_no_merge_conflict_markers_in_tracked_files():
    marked = []
    for path in _tracked_files():
        content = path.read_bytes()
        if b"\0" in content[:8000]:
            continue  # binary
        if CONFLICT_MARKER.search(content) and re.search(rb"^<<<<<<< |^>>>>>>> ", content, re.MULTILINE):
            marked.append(str(path.relative_to(ROOT)))
    assert marked == []


def test_every_lathe_import_names_a_module_that_exists():
    # Old paths still import for users (lathe/_moved.py), but lathe, its tests and benchmarks use the new ones.
    stale = []
    # bench/.cache, bench/.venv-* and bench/lf_stubs hold the peers' environments (git-ignored): not lathe's code.
    bench = [
        path
        for path in (ROOT / "bench").rglob("*.py")
        if not any(part.startswith(".") or part == "lf_stubs" for part in path.relative_to(ROOT).parts)
    ]
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *bench]
    sources += list((ROOT / "examples").rglob("*.py"))
    for path in sources:
        for line, module, _names in _imports(path):
            if module.startswith("lathe.") or module == "lathe":
                if module not in MODULES:
                    stale.append(f"{path.relative_to(ROOT)}:{line} {module}")
    assert stale == []


def wing_node(module: str, wing: str) -> str | None:
    """The folder or top-level module of `wing` that `module` belongs to (None: outside the wing)."""
    return module[len(wing) + 1 :].split(".")[0] if module.startswith(wing + ".") else None


def wing_edges(graph: dict[str, set[str]], wing: str) -> dict[tuple[str, str], list[str]]:
    """(node, imported node) -> the module imports that make the arrow, for every arrow inside `wing`."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        source = wing_node(module, wing)
        for target in targets:
            imported = wing_node(target, wing)
            if source and imported and imported != source:
                edges.setdefault((source, imported), []).append(f"{module} -> {target}")
    return edges


def wing_nodes(wing: str) -> set[str]:
    folder = ROOT / wing.replace(".", "/")
    return {
        entry.stem if entry.suffix == ".py" else entry.name
        for entry in folder.iterdir()
        if (entry.suffix == ".py" and entry.name != "__init__.py") or (entry / "__init__.py").is_file()
    }


def table_graph(wing: str) -> dict[str, set[str]]:
    """The declared arrows of `wing`, the deliberate upward ones left out."""
    return {
        node: {target for target in targets if (f"{wing}.{node}", f"{wing}.{target}") not in DECLARED_UPWARD}
        for node, targets in MAY_IMPORT[wing].items()
    }


def test_the_table_checks_see_the_arrows():
    # A wrong wing name would make the contract pass on nothing.
    edges = wing_edges(import_graph(), "lathe.llm")
    assert ("workflows", "preference") in edges and ("launch", "config") in edges
    assert wing_edges({"lathe.llm.a.x": {"lathe.llm.b", "lathe.train.c"}}, "lathe.llm") == {
        ("a", "b"): ["lathe.llm.a.x -> lathe.llm.b"]
    }


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_every_folder_of_a_wing_is_in_its_table(wing):
    assert sorted(wing_nodes(wing) ^ set(MAY_IMPORT[wing])) == []


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_no_folder_imports_what_its_table_does_not_declare(wing):
    edges = wing_edges(import_graph(), wing)
    undeclared = {
        f"{source} -> {target}": made_by
        for (source, target), made_by in sorted(edges.items())
        if target not in MAY_IMPORT[wing].get(source, set())
    }
    assert undeclared == {}


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_the_table_has_no_loop(wing):
    # With every import declared (above), a table without loops means folder-level imports without loops.
    graph = table_graph(wing)
    assert all(target in graph for targets in graph.values() for target in targets)
    assert circles(graph) == []


def test_declared_upward_arrows_are_in_the_table():
    for source, target in DECLARED_UPWARD:
        wing = next(name for name in MAY_IMPORT if source.startswith(name + "."))
        assert wing_node(target, wing) in MAY_IMPORT[wing][wing_node(source, wing)]


def test_lathe_train_never_imports_lathe_llm():
    graph = import_graph()
    upward = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("lathe.train")
        for target in targets
        if target.startswith("lathe.llm")
    ]
    assert upward == []


def test_docs_layout_md_is_written_from_the_docstrings_and_the_table():
    # docs/make_layout.py writes it; a folder, docstring or arrow changed without rerunning it fails here.
    script = ROOT / "docs" / "make_layout.py"
    written = subprocess.run(
        [sys.executable, str(script), "--stdout"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert written == (ROOT / "docs" / "LAYOUT.md").read_text(), (
        "docs/LAYOUT.md is stale: run python docs/make_layout.py"
    )
