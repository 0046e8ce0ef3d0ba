"""Override a script's default settings from config files and --key=value arguments.

train.py and sample.py keep their settings as plain globals, then hand them to `configure`:

    import sys
    from configurator import configure
    n_layer = 12
    dropout = 0.0
    out_dir = 'out'
    config_keys = [k for k, v in globals().items() if not k.startswith('_')
                   and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
    globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:]))

    $ python train.py config/train_shakespeare_char.py --n_layer=4 --dropout=0 --out_dir=out/lr=1e-3

Arguments are applied left to right, so later ones win:
  - `name.py` runs a config file; its top-level assignments become overrides.
  - `--key=value` sets one key; the value is a Python literal (`4`, `0.1`, `True`, `[[0, 1], [0.5, 0.5]]`).
    A str setting takes the text as typed, so `--init_from=resume` needs no quotes.
Each value must fit the type of its default (an int is fine for a float, never the reverse).
Any mistake stops the program with one line that starts with "config error".
"""
import ast
import difflib
import traceback
import types

LITERAL_TYPES = (bool, int, float, str, tuple, list, type(None))


def configure(defaults, argv, verbose=True):
    """Return a copy of `defaults` with the config files and --key=value arguments in `argv` applied."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith('--'):
            key, has_value, text = arg[2:].partition('=')  # only the first '=' separates key and value
            _require_known(key, defaults, 'config error')
            if not has_value:
                raise SystemExit(f"config error: {arg} needs a value, e.g. {arg}={defaults[key]!r}")
            overrides = {key: _parse(f'--{key}', text, defaults[key])}
            where, name = 'config error', '--'
        elif arg.endswith('.py'):
            overrides = _read_config_file(arg)
            where, name = f'config error in {arg}', ''
        else:
            raise SystemExit(f"config error: unexpected argument {arg!r} "
                             "(expected --key=value or a config file ending in .py)")
        for key, value in overrides.items():
            _require_known(key, defaults, where)
            default = defaults[key]
            if not _accepts(default, value):
                raise SystemExit(f"{where}: {name}{key} expects {_describe(default)}, "
                                 f"got {type(value).__name__} {value!r}")
            if isinstance(default, float):
                value = float(value)  # --dropout=0 means 0.0
            elif isinstance(default, (tuple, list)):
                value = type(default)(value)  # (0, 1) and [0, 1] are the same setting
            config[key] = value
            if verbose:
                print(f"Overriding: {key} = {value!r}")
    return config


def _require_known(key, defaults, where):
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SystemExit(f"{where}: unknown config key {key!r}{hint}")


def _parse(name, text, default):
    """Turn the text after '=' into a value, using the default's type to resolve bare words."""
    if isinstance(default, bool) and text.lower() in ('true', 'false'):
        return text.lower() == 'true'
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # what literal_eval may raise
        if isinstance(default, str):
            return text  # bare words such as resume, cuda:0 or out/lr=1e-3
        raise SystemExit(f"config error: {name} expects {_describe(default)}, "
                         f"got {text!r}, which is not a Python literal")
    if isinstance(default, str) and not isinstance(value, str):
        return text  # --wandb_run_name=2024 means the name '2024'
    return value


def _accepts(default, value):
    if default is None:
        return isinstance(value, LITERAL_TYPES)  # no type to go by: any literal will do
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # bool is a subclass of int, but True is not a layer count
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (tuple, list)):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(default))


def _describe(default):
    if default is None:
        return "a Python literal (None, a number, str, bool, list or tuple)"
    if isinstance(default, bool):
        return "bool (True or False, not 0 or 1)"
    if isinstance(default, (tuple, list)):
        return "a list or tuple"
    return type(default).__name__


def _read_config_file(path):
    """Run a config file; its settings are the top-level names that are not private, modules or callables."""
    try:
        with open(path) as f:
            source = f.read()
    except FileNotFoundError:
        raise SystemExit(f"config error: config file {path} not found")
    namespace = {'__file__': path}
    try:
        exec(compile(source, path, 'exec'), namespace)
    except SyntaxError as e:
        raise SystemExit(f"config error in {path}:{e.lineno}: {e.msg}")
    except Exception as e:  # a config file is a program; report where it failed, in one line
        line = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path][-1]
        raise SystemExit(f"config error in {path}:{line}: {type(e).__name__}: {e}")
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and not isinstance(v, types.ModuleType) and not callable(v)}
