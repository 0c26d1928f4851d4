"""How much of the package's CUDA-only code the CPU suite executes (the rehearsal against
autospecs of ``torch.cuda`` and ``pynvml`` included): the lines behind a CUDA, NVML or NCCL
guard, and the share of them a coverage run of the quick tier reaches.

A line counts as CUDA-only when it is in the true branch of an ``if`` whose condition names
CUDA, NVML, NCCL or a GPU (``torch.cuda.is_available()``, ``self._cuda``, ``device.type ==
"cuda"``), in the ``else`` of one that negates it, in a function whose body calls ``pynvml``,
or when it calls a ``torch.cuda`` function that needs a device (not ``is_available``,
``device_count``, ``is_initialized``, which answer on a CPU). A heuristic on the text: it
lists what it counted, file by file, so a reader can check it.

    pip install coverage
    python scripts/cuda_coverage.py            # runs the quick tier under coverage (~5 min)
    python scripts/cuda_coverage.py --data .coverage --list
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tuner"
GUARD = re.compile(r"cuda|nvml|nccl|gpu", re.I)
CPU_SAFE = {"is_available", "device_count", "is_initialized"}


def _lines(node: ast.AST) -> set[int]:
    out: set[int] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.stmt):
            out.add(child.lineno)
    return out


def _body_lines(stmts: list[ast.stmt]) -> set[int]:
    out: set[int] = set()
    for s in stmts:
        out |= _lines(s)
    return out


def guarded(path: Path) -> set[int]:
    """The statement lines of ``path`` that run only with a GPU (see the module)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            cond = ast.get_source_segment(text, node.test) or ""
            if GUARD.search(cond):
                negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                out |= _body_lines(node.orelse if negated else node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            src = ast.get_source_segment(text, node) or ""
            if "pynvml." in src:
                out |= _body_lines(node.body)
        elif isinstance(node, ast.stmt) and not isinstance(node, (ast.If, ast.FunctionDef, ast.ClassDef, ast.With,
                                                                   ast.Try, ast.For, ast.While)):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                    name = ast.get_source_segment(text, call.func) or ""
                    if name.startswith("torch.cuda.") and call.func.attr not in CPU_SAFE:
                        out.add(node.lineno)
    # a docstring is no code
    docs = {n.body[0].lineno for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                         ast.ClassDef, ast.Module))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(getattr(n.body[0], "value", None),
                                                                          ast.Constant)}
    return out - docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="an existing coverage data file (default: run the quick tier)")
    parser.add_argument("--list", action="store_true", help="list the lines not executed, file by file")
    args = parser.parse_args(argv)
    import coverage

    data_file = args.data or str(ROOT / ".coverage.cuda")
    if not args.data:
        subprocess.run([sys.executable, "-m", "coverage", "run", f"--data-file={data_file}", "--source=tuner",
                        "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"], cwd=ROOT, check=False)
    data = coverage.CoverageData(basename=data_file)
    data.read()
    total = hit = 0
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = guarded(path)
        if not lines:
            continue
        ran = set(data.lines(str(path)) or [])
        done = lines & ran
        total, hit = total + len(lines), hit + len(done)
        rows.append((path.relative_to(ROOT), len(done), len(lines), sorted(lines - ran)))
    print("| module | CUDA-only lines executed | of |")
    print("|---|---:|---:|")
    for rel, done, n, missing in rows:
        print(f"| {rel} | {done} | {n} |")
        if args.list and missing:
            print(f"|   not executed: {', '.join(map(str, missing))} | | |")
    print(f"\n{hit} of {total} CUDA-only lines executed on this CPU ({hit / total:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
