"""What the tests share: a script of this folder run in the test's own process.

A plain module rather than conftest.py, which pytest loads itself and does not mean to be imported."""
import ast
import atexit
import contextlib
import dataclasses
import gc
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the repository root


def run_script(script, args, cwd, check=True):
    """`python script args` run from folder cwd in this process, which saves paying for torch's start-up again:
    its exit status and output as a CompletedProcess. As the interpreter does at exit, a SystemExit with a
    message prints it on stderr with status 1; any other exception (a traceback, or Ctrl-C) reaches the test.
    What the script's own code registers with atexit runs when it ends, as at the interpreter's exit (train.py
    lets go of out_dir's lock so). check: fail unless the status is 0."""
    args = [str(arg) for arg in args]
    argv, folder, out, err, code = sys.argv, os.getcwd(), io.StringIO(), io.StringIO(), 0
    at_exit, register = [], atexit.register
    try:
        sys.argv = [str(script), *args]
        os.chdir(cwd)
        atexit.register = lambda function, *a, **kw: (at_exit.append((function, a, kw)) or function) \
            if ours(function) else register(function, *a, **kw)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(script), run_name='__main__')
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            code = 1
            err.write(f"{stop.code}\n")
    finally:
        atexit.register = register
        sys.argv = argv
        for function, a, kw in reversed(at_exit):  # as the interpreter's exit would (train.py lets go of
            function(*a, **kw)                      # out_dir's lock so)
        os.chdir(folder)
        gc.collect()  # a script's globals can form a reference cycle: free them, closing the files they hold
    result = subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{script} {args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def ours(function):
    """Whether function is this repository's code, not a library's (whose exit handlers wait for the real exit:
    a library goes on serving the scripts that follow)."""
    code = getattr(getattr(function, '__func__', function), '__code__', None)
    path = Path(code.co_filename).resolve() if code else None
    return path is not None and path.is_relative_to(REPO) and 'site-packages' not in path.parts


def train_defaults():
    """train.py's settings and their defaults, read from its source without running it: its literal
    globals, and AblationConfig's fields but vocab_size (which the data sets), as train.py's configure has
    them."""
    from ablations import AblationConfig
    tree = ast.parse((REPO / 'train.py').read_text())
    script = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id.islower() and isinstance(node.value, (ast.Constant, ast.Tuple, ast.List))}
    return {f.name: f.default for f in dataclasses.fields(AblationConfig) if f.name != 'vocab_size'} | script


def with_stdout_closed(command, **kwargs):
    """command run with its stdout a pipe whose reader has already gone, as `| head` leaves it once it has its
    lines: its CompletedProcess, stderr captured."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(command, stdout=writer, stderr=subprocess.PIPE, text=True, **kwargs)
    finally:
        os.close(writer)
