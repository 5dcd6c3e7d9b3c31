"""Training prompts that are not in the benchmark sets.

`stdlib_code_prompts` turns standard-library function signatures and docstrings into
"write this function" requests, a source of code prompts that ships with Python.
"""

from __future__ import annotations

import importlib
import inspect

STDLIB_MODULES = (
    "bisect",
    "calendar",
    "collections",
    "colorsys",
    "csv",
    "difflib",
    "fnmatch",
    "fractions",
    "functools",
    "glob",
    "heapq",
    "html",
    "itertools",
    "json",
    "math",
    "operator",
    "os.path",
    "random",
    "re",
    "shlex",
    "statistics",
    "string",
    "textwrap",
    "urllib.parse",
    "zlib",
    "base64",
    "binascii",
    "copy",
    "datetime",
    "decimal",
    "hashlib",
    "ipaddress",
    "pathlib",
    "pprint",
    "secrets",
    "shutil",
    "struct",
    "tempfile",
)


def stdlib_code_prompts(limit: int | None = None) -> list[str]:
    prompts = []
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 40:
                continue
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                continue
            summary = doc.strip().split("\n\n")[0].replace("\n", " ")
            prompts.append(
                f"Write a Python function `{attr}{sig}` without using the `{name}` module. "
                f"It should do the following: {summary}"
            )
    return prompts[:limit]
