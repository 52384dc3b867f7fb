"""No function of the package or of its tools is longer than a screen (80 lines, its
docstring included): one idea per function, read at a glance (docs/README.md)."""

import ast
import pathlib

import cifar10_estimator

PACKAGE_DIR = pathlib.Path(cifar10_estimator.__file__).parent
# The instruments for tuning recipes on a CPU, beside the package in the checkout.
TOOLS_DIR = PACKAGE_DIR.parent / "tools"
MAX_FUNCTION_LINES = 80


def function_lengths(source_dirs=(PACKAGE_DIR, TOOLS_DIR)):
    """(path:line name, lines) of every function and method of the modules in source_dirs,
    nested ones included."""
    for path in sorted(path for source_dir in source_dirs for path in source_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = "%s:%d %s" % (path.relative_to(PACKAGE_DIR.parent), node.lineno,
                                      node.name)
                yield where, node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_a_screen():
    long_ones = ["%s: %d lines" % (where, lines) for where, lines in function_lengths()
                 if lines > MAX_FUNCTION_LINES]
    assert not long_ones, "split these into functions of one idea each:\n" + "\n".join(
        long_ones)


def test_the_count_sees_every_function_with_its_body():
    lengths = dict(function_lengths())
    [(where, lines)] = [(where, lines) for where, lines in lengths.items()
                        if where.endswith(" make_model_fn")]
    assert where.startswith("cifar10_estimator/model_fn.py:") and 40 < lines <= 80
    assert any(where.endswith(" model_fn") for where in lengths)  # nested in make_model_fn
    assert any(where.startswith("tools/step_rates.py:") for where in lengths)
