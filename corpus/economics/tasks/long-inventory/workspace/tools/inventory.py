#!/usr/bin/env python3
"""The module inventory: one line per module of src/, its owner and its functions."""
import ast
import pathlib

for path in sorted(pathlib.Path("src").glob("m*.py")):
    tree = ast.parse(path.read_text())
    owner = next(n.value.value for n in tree.body if isinstance(n, ast.Assign))
    funcs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    print(f"- {path.stem}: {owner}; {', '.join(funcs)}")
