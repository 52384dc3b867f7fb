"""The package's imports run one way: no circle between modules, none between the top
level's units (a top-level module, or a folder), nothing outside benchmarks/ imports it,
and nothing imports main. Its folders of one concern each are layered: the command-line
plumbing (cli/) under what the settings decide (settings/), under what a step computes
(training/), under the run's handling (run/). The flag layer imports no TensorFlow, so
that the commands tell a flag's error before it loads, nor do the time to go and the
file plumbing, and CIFAR-10's facts are declared once, in data/cifar10_facts.py.

The installed package is the product: its top level stays a short list, setup.py ships
each of its folders, and the instruments of tools/, beside it in the checkout, are
neither shipped nor imported by it.

Imports are read from the source with ast, those inside functions included: an import
deferred to a function is still a dependency, only a later one.
"""

import ast
import pathlib
import runpy
import subprocess
import sys

import setuptools

import cifar10_estimator

PACKAGE_DIR = pathlib.Path(cifar10_estimator.__file__).parent
PACKAGE = PACKAGE_DIR.name
REPO_ROOT = PACKAGE_DIR.parent
BENCHMARKS = PACKAGE + ".benchmarks"
MAIN = PACKAGE + ".main"
TOOLS = "tools"


def module_paths(package_dir):
    """Dotted name -> source path of every module of the package in package_dir."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _import_base(node, module, is_package):
    """The absolute module name a `from ... import` statement imports from."""
    if not node.level:
        return node.module
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return package + "." + node.module if node.module else package


def imported_modules(module, path, modules):
    """The package's modules that `module` imports anywhere in its source."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(node, module, path.name == "__init__.py")
            # `from package import name` imports module package.name when there is one,
            # else takes the attribute name of package.
            targets = [base + "." + alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                imported.add(target)
    return imported


def import_graph(package_dir=PACKAGE_DIR):
    """Module -> the set of the package's modules it imports."""
    modules = module_paths(package_dir)
    return {module: imported_modules(module, path, modules) for module, path in modules.items()}


def unit_of(module):
    """The top level's unit of a module: the top-level module itself, or its folder."""
    return ".".join(module.split(".")[:2])


def itself(module):
    """Each module its own unit: for the circles between modules."""
    return module


def unit_graph(graph, unit=unit_of):
    """Unit -> the set of other units its modules import."""
    units = {}
    for module, imported in graph.items():
        units.setdefault(unit(module), set()).update(
            unit(target) for target in imported if unit(target) != unit(module))
    return units


def circles(graph):
    """The strongly connected components of more than one node, each a sorted list:
    every node of one reaches every other, so each lies on a cycle."""
    index, lowlink, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node):
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                lowlink[node] = min(lowlink[node], lowlink[successor])
            elif successor in on_stack:
                lowlink[node] = min(lowlink[node], index[successor])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_cycles(graph, circle):
    """The distinct shortest cycles through each node of `circle` (one of circles(graph)),
    each a list of nodes starting at its least."""
    cycles = set()
    for start in circle:
        paths, queue = {start: [start]}, [start]
        while queue:
            node = queue.pop(0)
            if start in graph[node]:
                cycle = paths[node]
                least = cycle.index(min(cycle))
                cycles.add(tuple(cycle[least:] + cycle[:least]))
                break
            for successor in sorted(graph[node]):
                if successor in circle and successor not in paths:
                    paths[successor] = paths[node] + [successor]
                    queue.append(successor)
    return sorted(cycles)


def _name(module):
    return module[len(PACKAGE) + 1:] or PACKAGE


def describe_cycles(graph, unit):
    """The cycles between the units of graph's modules (unit_of, or itself for the modules
    themselves), each with the imports that make it; '' when there is none."""
    units = unit_graph(graph, unit)
    lines = []
    for circle in circles(units):
        for cycle in shortest_cycles(units, circle):
            lines.append("  " + " -> ".join(_name(node) for node in cycle + (cycle[0],)))
            for source, target in zip(cycle, cycle[1:] + cycle[:1]):
                lines.extend("      %s imports %s" % (_name(module), _name(imported))
                             for module in sorted(graph) if unit(module) == source
                             for imported in sorted(graph[module]) if unit(imported) == target)
    return "\n".join(lines)


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert PACKAGE + ".flags" in graph[MAIN]  # at the top of main
    assert PACKAGE + ".model_fn" in graph[MAIN]  # inside one of main's functions


def test_no_circle_between_modules():
    cycles = describe_cycles(import_graph(), unit=itself)
    assert not cycles, "modules importing each other, directly or through others:\n" + cycles


def test_no_circle_between_the_top_levels_units():
    cycles = describe_cycles(import_graph(), unit=unit_of)
    assert not cycles, "units (top-level modules, folders) importing each other:\n" + cycles


def test_nothing_outside_benchmarks_imports_them():
    graph = import_graph()
    importers = ["%s imports %s" % (_name(module), _name(target))
                 for module, imported in sorted(graph.items()) for target in sorted(imported)
                 if unit_of(target) == BENCHMARKS and unit_of(module) != BENCHMARKS]
    assert not importers, "\n".join(importers)


def test_nothing_imports_main():
    graph = import_graph()
    assert [_name(module) for module, imported in sorted(graph.items()) if MAIN in imported] == []


# The folders of one concern each, lowest first: none imports a folder after it.
LAYERS = [PACKAGE + "." + name for name in ("cli", "settings", "training", "run")]


def test_each_concerns_folder_imports_none_above_it():
    units = unit_graph(import_graph())
    upward = ["%s imports %s" % (_name(lower), _name(higher))
              for index, lower in enumerate(LAYERS) for higher in LAYERS[index + 1:]
              if higher in units[lower]]
    assert not upward, "\n".join(upward)


def test_the_package_imports_nothing_from_the_tools():
    importers = []
    for module, path in module_paths(PACKAGE_DIR).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and
                     not node.level else [])
            importers += ["%s imports %s" % (_name(module), name) for name in names
                          if name.split(".")[0] == TOOLS]
    assert not importers, "\n".join(importers)


# The tutorial's training path under its own names, the run, and a little plumbing; the
# rest is one folder away (docs/README.md, "Where things are").
MAX_TOP_LEVEL_MODULES = 16


def test_the_top_level_is_a_short_list():
    modules = sorted(path.stem for path in PACKAGE_DIR.glob("*.py") if path.stem != "__init__")
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def setup_arguments(monkeypatch):
    """The keywords setup.py hands to setuptools.setup, read by running it with a stand-in
    in the checkout's root, where pip runs it."""
    arguments = {}
    monkeypatch.setattr(setuptools, "setup", arguments.update)
    monkeypatch.chdir(REPO_ROOT)
    runpy.run_path(str(REPO_ROOT / "setup.py"), run_name="__main__")
    return arguments


def test_setup_ships_every_folder_of_the_package_and_none_of_the_tools(monkeypatch):
    packages = setup_arguments(monkeypatch)["packages"]
    folders = sorted(".".join(path.parent.relative_to(REPO_ROOT).parts)
                     for path in PACKAGE_DIR.rglob("*.py"))
    assert set(folders) <= set(packages), sorted(set(folders) - set(packages))
    assert (REPO_ROOT / TOOLS / "__init__.py").exists()
    assert [package for package in packages if not package.startswith(PACKAGE)] == []


# The flag layer: the options' declarations, the parser and its checks, which the commands
# run before TensorFlow loads.
FLAG_LAYER = [PACKAGE + "." + name for name in (
    "cli.options", "cli.command", "hparams", "flags", "settings.recipes", "settings.schedule",
    "settings.precision")]
# And the modules that are arithmetic or files: the rest of the command-line plumbing, the
# time to go (its hooks are apart, in run.progress) and the file plumbing, which loads
# TensorFlow for a URL only.
WITHOUT_TENSORFLOW = FLAG_LAYER + [PACKAGE + "." + name for name in (
    "cli.tensorflow_logs", "cli.child_process", "cli.terminal", "cli.markdown", "files",
    "run.time_to_go")]
FACTS = PACKAGE + ".data.cifar10_facts"
DATA_SET = PACKAGE + ".cifar10"


def _outside_functions(tree):
    """The nodes of a module that run when it is imported: all but function bodies."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in ast.iter_child_nodes(node)
                       if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda)))


def imported_on_import(module, path, modules):
    """(the package's modules, the other top-level packages) that importing `module` imports
    itself, its own package's __init__ included; imports inside functions wait."""
    targets = []
    for node in _outside_functions(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(node, module, path.name == "__init__.py")
            targets += [base] + [base + "." + alias.name for alias in node.names]
    parent = module.rpartition(".")[0]
    targets += [parent] if parent else []
    package_modules, others = set(), set()
    for target in targets:
        if target.split(".")[0] != PACKAGE:
            others.add(target.split(".")[0])
            continue
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            package_modules.add(target)
    return package_modules, others


def chain_to_tensorflow(start, modules):
    """The shortest chain of imports made on import from `start` to a module that imports
    TensorFlow on import, as a list of modules; None where there is none."""
    paths, queue = {start: [start]}, [start]
    while queue:
        module = queue.pop(0)
        package_modules, others = imported_on_import(module, modules[module], modules)
        if "tensorflow" in others:
            return paths[module]
        for target in sorted(package_modules - set(paths)):
            paths[target] = paths[module] + [target]
            queue.append(target)
    return None


def test_the_flag_layer_the_time_to_go_and_the_file_plumbing_import_no_tensorflow():
    modules = module_paths(PACKAGE_DIR)
    chains = {module: chain_to_tensorflow(module, modules) for module in WITHOUT_TENSORFLOW}
    assert not any(chains.values()), "\n".join(
        "%s imports TensorFlow on import: %s" % (_name(module), " -> ".join(map(_name, chain)))
        for module, chain in chains.items() if chain)
    # What the interpreter really loads, third-party packages included.
    result = subprocess.run(
        [sys.executable, "-c", "import sys; import %s; print('tensorflow' in sys.modules)"
         % ", ".join(WITHOUT_TENSORFLOW)],
        cwd=str(PACKAGE_DIR.parent), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True, timeout=120)
    assert result.stdout.strip() == "False", result.stdout + result.stderr


def _assigned_at_top(path):
    """Names a module assigns outside its functions and classes."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def test_cifar10s_facts_are_declared_in_cifar10_facts_only_and_the_data_set_hands_them_on():
    modules = module_paths(PACKAGE_DIR)
    facts = {name for name in _assigned_at_top(modules[FACTS]) if name.isupper()}
    assert {"HEIGHT", "NUM_CLASSES", "CLASS_NAMES", "MAX_SHIFT", "PADDED_HEIGHT"} <= facts
    declared_again = {_name(module): sorted(facts & _assigned_at_top(path))
                      for module, path in modules.items() if module != FACTS}
    assert not any(declared_again.values()), {
        module: names for module, names in declared_again.items() if names}
    handed_on = {alias.asname or alias.name
                 for node in ast.parse(modules[DATA_SET].read_text()).body
                 if isinstance(node, ast.ImportFrom) and node.module == FACTS
                 for alias in node.names}
    assert facts <= handed_on, "cifar10.py does not hand on %s" % sorted(facts - handed_on)
