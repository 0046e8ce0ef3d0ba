"""Every collective train.py makes, its own and its helpers' (vrl/, model.py, ablations.py and
configurator.py), is in train.py's docstring list."""
import ast
import collections
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what a rank calls that waits for the others, makes a group or tears one down (DDP: its constructor
# broadcasts the weights, its backward all-reduces the gradients)
COLLECTIVES = {'init_process_group', 'new_group', 'destroy_process_group', 'DDP',
               'DistributedDataParallel', 'all_reduce', 'barrier', 'monitored_barrier', 'broadcast',
               'broadcast_object_list', 'all_gather', 'all_gather_object', 'all_gather_into_tensor',
               'reduce_scatter', 'reduce_scatter_tensor', 'all_to_all'}


def call_sites(path, top_level_where):
    """Counter of (where, collective) over path's calls: where is the enclosing function's name, or, for
    code outside any function, top_level_where(the call's line)."""
    sites = collections.Counter()

    def visit(node, function):
        if isinstance(node, ast.Call):
            name = getattr(node.func, 'id', getattr(node.func, 'attr', None))
            if name in COLLECTIVES:
                sites[function or top_level_where(node.lineno), name] += 1
        for child in ast.iter_child_nodes(node):
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, child.name if inner else function)
    visit(ast.parse(path.read_text()), None)
    return sites


def code_sites(train_py=REPO / 'train.py'):
    """Every collective call in train.py ('start-up', 'loop' or 'end' outside its functions: before, inside
    and after its training loop, the one `while`) and in the helpers ('vrl/file.py:function')."""
    loop = next(node for node in ast.walk(ast.parse(train_py.read_text())) if isinstance(node, ast.While))
    sites = call_sites(train_py, lambda line: 'start-up' if line < loop.lineno else
                       'loop' if line <= loop.end_lineno else 'end')
    helpers = [*sorted((REPO / 'vrl').glob('*.py')), *(REPO / f for f in
               ('model.py', 'ablations.py', 'configurator.py'))]
    for helper in helpers:
        for (where, name), n in call_sites(helper, lambda line: 'top level').items():
            sites[f'{helper.relative_to(REPO)}:{where}', name] += n
    return sites


def listed_sites(train_py=REPO / 'train.py'):
    """The docstring's list: rows `  where  call [xN]  ...`, N calls (1 if not said)."""
    listed = collections.Counter()
    for where, name, times in re.findall(r'^  (\S+) +(\w+)(?: x(\d+))? ', ast.get_docstring(
            ast.parse(train_py.read_text())), re.M):
        if name in COLLECTIVES:
            listed[where, name] += int(times or 1)
    return listed


def test_every_collective_is_in_train_pys_list():
    assert code_sites() == listed_sites()


def test_each_row_gives_the_lines_of_its_calls():
    """A row of train.py's own calls names their lines ('Line N.', 'Lines N, M, K.'), one a
    call, each holding that call: a reader can go straight to it."""
    doc = ast.get_docstring(ast.parse((REPO / 'train.py').read_text()))
    lines = (REPO / 'train.py').read_text().splitlines()
    rows = re.findall(r'^  (\S+) +(\w+)(?: x(\d+))? +Lines? ([\d, ]+)\.', doc, re.M)
    assert len(rows) == sum(1 for where, _ in listed_sites() if not where.startswith('vrl/'))
    for where, name, times, numbers in rows:
        numbers = [int(n) for n in numbers.split(', ')]
        assert len(numbers) == int(times or 1), (where, name)
        for n in numbers:
            assert re.search(rf'\b{name}\(', lines[n - 1]), (where, name, n, lines[n - 1])


def test_an_unlisted_collective_fails_the_list(tmp_path):
    """An all_reduce added to evaluate, or a broadcast in the loop, and the list no longer matches."""
    source = (REPO / 'train.py').read_text()
    for old, new in (('    if ddp:\n        all_reduce(sums)', '    if ddp:\n        all_reduce(sums)\n'
                      '        all_reduce(sums)'),
                     ('        lr = get_lr(iter_num)\n',
                      '        lr = get_lr(iter_num)\n        broadcast(lr, 0)\n')):
        assert source.count(old) == 1
        changed = tmp_path / 'train.py'
        changed.write_text(source.replace(old, new))
        assert code_sites(changed) != listed_sites(changed)
