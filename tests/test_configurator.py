"""configurator.py: config files and --key=value overrides, in order; one-line errors for bad ones."""
import ast
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest

from ablations import AblationConfig
from configurator import configure, field_docs
from model import GPTConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
DEFAULTS = {'n_layer': 12, 'dropout': 0.1, 'compile': True, 'out_dir': 'out', 'init_from': 'scratch',
            'betas': (0.9, 0.95), 'lambdas': None, 'n_kv_head': None}


def run(argv, defaults=DEFAULTS):
    return configure(defaults, argv, verbose=False)


def error(argv, defaults=DEFAULTS):
    with pytest.raises(SystemExit) as e:
        run(argv, defaults)
    message = str(e.value.code)
    assert message.startswith('config error') and '\n' not in message
    return message


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_no_arguments_returns_an_equal_copy():
    config = run([])
    assert config == DEFAULTS and config is not DEFAULTS


def test_config_files_then_cli_applied_in_order(tmp_path):
    a = write(tmp_path, 'a.py', """
        import math
        n_layer = 4
        dropout = 0.2
        _scratch = 'private names are ignored'
        def helper(): pass
        betas = (0.9, round(math.sqrt(0.98), 2))
    """)
    b = write(tmp_path, 'b.py', "n_layer = 6\nout_dir = 'out-' + __file__.split('/')[-1]\n")
    config = run([a, '--n_layer=8', b, '--dropout=0.3'])
    assert config['n_layer'] == 6  # b.py came after --n_layer=8
    assert config['dropout'] == 0.3
    assert config['betas'] == (0.9, 0.99)
    assert config['out_dir'] == 'out-b.py'
    assert 'helper' not in config and 'math' not in config and '_scratch' not in config


def test_overrides_are_printed_unless_silenced(capsys):
    configure(DEFAULTS, ['--n_layer=4'])
    assert capsys.readouterr().out == "Overriding: n_layer = 4\n"
    configure(DEFAULTS, ['--n_layer=4'], verbose=False)
    assert capsys.readouterr().out == ""
    configure(DEFAULTS, ['--n_layer=4'], log_to=sys.stderr)
    assert capsys.readouterr() == ("", "Overriding: n_layer = 4\n")


def test_defaults_are_not_mutated(tmp_path):
    defaults = {'n_layer': 12, 'betas': [0.9, 0.95]}
    snapshot = {'n_layer': 12, 'betas': [0.9, 0.95]}
    run([write(tmp_path, 'c.py', "betas = [0.8, 0.9]\n"), '--n_layer=2'], defaults)
    assert defaults == snapshot


def test_int_for_float_becomes_float():
    config = run(['--dropout=0'])
    assert config['dropout'] == 0.0 and type(config['dropout']) is float


@pytest.mark.parametrize('text, expected', [
    ('False', False), ('True', True), ('false', False), ('TRUE', True)])
def test_bool_words(text, expected):
    assert run([f'--compile={text}'])['compile'] is expected


def test_bool_rejects_0_and_1():
    assert error(['--compile=0']) == \
        "config error: --compile expects bool (True or False, not 0 or 1), got int 0"


@pytest.mark.parametrize('arg', ['--out_dir=out/lr=1e-3', '--init_from=resume', '--out_dir=a==b'])
def test_str_takes_text_as_typed(arg):
    key, value = arg[2:].split('=', 1)
    assert run([arg])[key] == value


def test_str_takes_numbers_as_text_and_unquotes_literals():
    assert run(['--out_dir=2024'])['out_dir'] == '2024'
    assert run(["--out_dir='my out'"])['out_dir'] == 'my out'


def test_nested_list_with_none_default():
    assert run(['--lambdas=[[0,1],[0.5,0.5]]'])['lambdas'] == [[0, 1], [0.5, 0.5]]
    assert run(['--lambdas=((0,1),(0.5,0.5))'])['lambdas'] == ((0, 1), (0.5, 0.5))


def test_nested_list_with_tuple_default():
    config = run(['--lambdas=[[0,1],[0.5,0.5]]'], {'lambdas': ((0.5, 0.5),)})
    assert config['lambdas'] == ([0, 1], [0.5, 0.5])  # the container takes the default's type


def test_none_default_accepts_any_literal_and_none_back():
    assert run(['--n_kv_head=2'])['n_kv_head'] == 2
    assert run(['--n_kv_head=2', '--n_kv_head=None'])['n_kv_head'] is None


def test_unknown_key_suggests_close_match():
    assert error(['--n_layers=4']) == "config error: unknown config key 'n_layers' (did you mean 'n_layer'?)"
    assert error(['--zzz=4']) == "config error: unknown config key 'zzz'"


def test_int_rejects_float_and_bool():
    assert error(['--n_layer=2.5']) == "config error: --n_layer expects int, got float 2.5"
    assert error(['--n_layer=True']) == "config error: --n_layer expects int, got bool True"
    assert error(['--dropout=True']) == "config error: --dropout expects float, got bool True"


def test_unparseable_value_for_non_str():
    assert error(['--n_layer=four']) == \
        "config error: --n_layer expects int, got 'four', which is not a Python literal"


def test_malformed_arguments():
    assert error(['--compile']) == "config error: --compile needs a value, e.g. --compile=True"
    assert error(['n_layer=4']).startswith("config error: unexpected argument 'n_layer=4'")


def test_missing_config_file():
    assert error(['config/nope.py']) == "config error: config file config/nope.py not found"


def test_config_file_errors_name_the_file(tmp_path):
    bad_key = write(tmp_path, 'bad_key.py', "lr = 1e-3\n")
    assert error([bad_key]) == f"config error in {bad_key}: unknown config key 'lr'"
    bad_type = write(tmp_path, 'bad_type.py', "n_layer = 2.5\n")
    assert error([bad_type]) == f"config error in {bad_type}: n_layer expects int, got float 2.5"


def test_config_file_syntax_and_runtime_errors_are_one_line(tmp_path):
    syntax = write(tmp_path, 'syntax.py', "n_layer = 4\ndropout = (0.1\n")
    assert error([syntax]).startswith(f"config error in {syntax}:2: ")
    runtime = write(tmp_path, 'runtime.py', "n_layer = 4\n\ndropout = undefined_name\n")
    assert error([runtime]) == f"config error in {runtime}:3: NameError: name 'undefined_name' is not defined"


def test_script_exits_with_one_line_on_stderr(tmp_path):
    script = write(tmp_path, 'script.py', """
        import sys
        from configurator import configure
        n_layer = 12
        dropout = 0.0
        config_keys = [k for k, v in globals().items() if not k.startswith('_')
                       and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
        globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:]))
        print(n_layer, dropout)
    """)
    env = {**os.environ, 'PYTHONPATH': HERE}
    def run_script(*argv):
        return subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, env=env)
    ok = run_script('--n_layer=4', '--dropout=0')
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == '4 0.0'
    bad = run_script('--n_layers=4')
    assert bad.returncode != 0
    assert bad.stderr == "config error: unknown config key 'n_layers' (did you mean 'n_layer'?)\n"


def test_config_file_that_exits_is_a_one_line_error(tmp_path):
    for call in ("sys.exit()", "sys.exit(0)", "exit()"):
        exits = write(tmp_path, 'exits.py', f"import sys\nn_layer = 4\n{call}\n")
        assert error([exits]) == \
            f"config error in {exits}:3: it exits (sys.exit or exit); a config file only sets values"


def test_config_value_of_the_wrong_kind_names_the_key_and_type(tmp_path):
    lam = write(tmp_path, 'lam.py', "dropout = lambda: 0.5\n")
    assert error([lam]) == f"config error in {lam}: dropout expects float, got function"
    module = write(tmp_path, 'module.py', "import math as n_kv_head\n")
    assert error([module]) == f"config error in {module}: n_kv_head expects a Python literal " \
                              "(None, a number, str, bool, list or tuple), got module"


def test_train_py_with_a_config_file_that_exits_fails_with_one_line(tmp_path):
    config = write(tmp_path, 'quits.py', "import sys\nmax_iters = 10\nsys.exit()\n")
    result = subprocess.run([sys.executable, os.path.join(HERE, 'train.py'), config,
                             f'--out_dir={tmp_path / "out"}'],
                            capture_output=True, text=True, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, '')
    assert result.stderr == \
        f"config error in {config}:3: it exits (sys.exit or exit); a config file only sets values\n"
    assert os.listdir(tmp_path) == ['quits.py']  # no out_dir, nothing written


def test_config_path_that_is_a_folder_or_not_utf8(tmp_path):
    folder = tmp_path / 'configs.py'
    folder.mkdir()
    assert error([str(folder)]) == f"config error: config file {folder} is a folder; name a .py file in it"
    latin1 = tmp_path / 'latin1.py'
    latin1.write_bytes("n_layer = 4  # caf\u00e9\n".encode('latin-1'))
    assert error([str(latin1)]) == \
        f"config error: config file {latin1} is not UTF-8 text (byte 18); save it as UTF-8"


TYPES = {'n_kv_head': int, 'lambdas': list, 'compile_or_auto': bool}


@pytest.mark.parametrize('arg, message', [
    ('--n_kv_head=2.5', "--n_kv_head expects int or None, got float 2.5"),
    ('--n_kv_head=True', "--n_kv_head expects int or None, got bool True"),
    ('--compile_or_auto=1', "--compile_or_auto expects bool (True or False, not 0 or 1) or None, got int 1"),
    ('--lambdas=3', "--lambdas expects a list or tuple or None, got int 3"),
])
def test_none_default_with_a_type_takes_only_that_type(arg, message):
    defaults = {'n_kv_head': None, 'lambdas': None, 'compile_or_auto': None}
    with pytest.raises(SystemExit) as e:
        configure(defaults, [arg], types=TYPES, verbose=False)
    assert e.value.code == f"config error: {message}"


def test_none_default_with_a_type_takes_that_type_and_none():
    defaults = {'n_kv_head': None, 'lambdas': None, 'compile_or_auto': None}
    config = configure(defaults, ['--n_kv_head=2', '--lambdas=[[0, 1], [0.5, 0.5]]',
                                  '--compile_or_auto=true'],
                       types=TYPES, verbose=False)
    assert config == {'n_kv_head': 2, 'lambdas': [[0, 1], [0.5, 0.5]], 'compile_or_auto': True}
    assert configure(defaults, ['--n_kv_head=2', '--n_kv_head=None'], types=TYPES,
                     verbose=False)['n_kv_head'] is None


HELP_SCRIPT = '''"""A script that trains things."""
import sys
from configurator import configure

# ------
# I/O
out_dir = 'out'  # where the run goes
log_interval = 10
# model: the shape
n_layer = 12  # transformer blocks,
#   each a block
n_kv_head = None  # None = n_head
betas = (0.9,
         0.95)  # AdamW
# ------
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:],
                           types={'n_kv_head': int}, script=__file__))
print('ran')
'''

HELP_TEXT = '''A script that trains things.

settings (config files and --key=value override them, left to right):

I/O
  --out_dir='out'         where the run goes
  --log_interval=10

model: the shape
  --n_layer=12            transformer blocks, each a block
  --n_kv_head=None (int)  None = n_head
  --betas=(0.9, 0.95)     AdamW
'''


@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_settings_by_section_and_exits_0(tmp_path, flag):
    script = tmp_path / 'script.py'
    script.write_text(HELP_SCRIPT)
    result = subprocess.run([sys.executable, str(script), '--n_layer=4', flag], capture_output=True,
                            text=True, env={**os.environ, 'PYTHONPATH': HERE})
    assert (result.returncode, result.stderr) == (0, '')
    assert result.stdout == HELP_TEXT


@pytest.mark.parametrize('script', ['train.py', 'sample.py', 'lab/analyze.py', 'lab/bench.py', 'lab/eval.py'])
def test_help_of_the_real_scripts_lists_every_setting(script):
    result = subprocess.run([sys.executable, os.path.join(HERE, script), '--help'], capture_output=True,
                            text=True)
    assert (result.returncode, result.stderr) == (0, ''), result.stderr
    module = ast.parse(open(os.path.join(HERE, script)).read())
    settings = list(dict.fromkeys(node.targets[0].id for node in module.body if isinstance(node, ast.Assign)
                                  and isinstance(node.targets[0], ast.Name)
                                  and f"\n  --{node.targets[0].id}=" in result.stdout))  # in source order
    assert len(settings) >= 6
    if script == 'train.py':  # then AblationConfig's other fields, GPTConfig's included (but vocab_size,
        settings += [f.name for f in fields(AblationConfig)  # which the data sets)
                     if f.name not in settings and f.name != 'vocab_size']
    lines = result.stdout.splitlines()
    assert [line.split('=')[0].strip() for line in lines if line.startswith('  --')] == \
        [f'--{s}' for s in settings]
    if script == 'train.py':
        from testing import train_defaults  # train.py's literal settings and GPTConfig's fields
        assert set(settings) == set(train_defaults()) | {f.name for f in fields(AblationConfig)} - {'vocab_size'}
        # every model field train.py does not comment itself shows its docstring, GPTConfig's and
        # AblationConfig's alike
        docs = field_docs(AblationConfig)
        shown = {line.split('=')[0].strip()[2:]: line for line in lines if line.startswith('  --')}
        for name in ('n_kv_head', 'rope_theta', 'lambda_mode', 'residual_from', 'anchors', 'value_bank'):
            assert shown[name].endswith(f'  {docs[name]}'), (name, shown[name])


def test_the_call_the_docstring_shows_is_train_pys():
    """configurator.py's docstring shows train.py's own call to configure (up to its '...')."""
    import configurator
    shown = [line.strip() for line in configurator.__doc__.splitlines() if 'configure(' in line]
    with open(os.path.join(HERE, 'train.py'), encoding='utf-8') as f:
        train = ' '.join(f.read().split())  # its call over several lines, on one
    assert shown and all(call.endswith(', ...)') for call in shown)
    for call in shown:
        assert call[:-len(' ...)')] in train, call


def test_field_docs_walk_the_dataclass_bases():
    """A subclass's field_docs hold its base's fields' docstrings as well as its own, each on one line."""
    docs = field_docs(AblationConfig)
    assert set(docs) == {f.name for f in fields(AblationConfig)}
    assert {name: docs[name] for name in field_docs(GPTConfig)} == field_docs(GPTConfig)
    assert docs['n_layer'].startswith('Transformer blocks') and docs['h0_residual'].startswith('False: block 1')
    assert all('\n' not in doc and '  ' not in doc for doc in docs.values())


def test_a_config_file_that_is_a_pipe_is_refused_in_one_line_instead_of_waiting(tmp_path):
    os.mkfifo(tmp_path / 'fifo.py')

    def waited(*_):
        raise AssertionError("configure opened the pipe and waited for a writer")
    previous = signal.signal(signal.SIGALRM, waited)  # a guard: the suite never hangs here
    signal.alarm(10)
    try:
        with pytest.raises(SystemExit) as exit:
            configure({'a': 1}, [str(tmp_path / 'fifo.py')])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert exit.value.code == (f"config error: config file {tmp_path / 'fifo.py'} is not a regular file (a "
                               f"pipe or device may wait forever for a writer); save the config as a file")
