"""
nanoGPT's configurator as a function that checks. After its default settings, train.py calls
    config = configure(globals(), sys.argv[1:], script=__file__, fields_of=AblationConfig, ...)
which returns a new dict of every setting: the script's globals bound to literals (not starting with
'_') and AblationConfig's fields, then the arguments applied left to right, later ones winning:
`name.py` runs a config file and takes its top-level assignments, `--key=value` sets one key (a
Python literal; a str setting takes the text as typed: --init_from=resume). A value must fit its
default's type (an int does for a float; a None default takes None or its type in `types`). An
unknown key, a wrong type or a broken config file stops with one line, "config error: ..."; --help
prints every setting, its default and comment. train.py then runs globals().update(config).

    $ python train.py config/shakespeare_char.py --n_layer=4 --dropout=0 --out_dir=out/lr=1e-3

sample.py and the lab's scripts pass a dict of their settings instead of globals(). --help groups
the settings under the script's whole-line comments; a setting's comment may go on below it, on
lines starting `#   `.
"""
import ast
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
import traceback
import types as pytypes

from vrl import cli
LITERAL_TYPES = (bool, int, float, str, tuple, list, type(None))


def configure(defaults, argv, types=None, script=None, verbose=True, log_to=None, fields_of=None,
              except_fields=()):
    """Return a copy of `defaults` with the config files and --key=value arguments in `argv` applied.
    defaults: {setting: default}, or a script's globals(), whose settings are the names bound to literal
    values (bool, int, float, str, tuple, list, None) that do not start with '_'.

    types: {key: type} for settings whose default is None (train.py: {'compile': bool}).
    script: the caller's file (__file__); --help reads its comments.
    fields_of: a dataclass whose fields (but except_fields) are settings too, at the dataclass's defaults
    unless `defaults` has them (train.py: AblationConfig, but vocab_size, which the data sets); --help
    gives each its docstring.
    verbose: print an 'Overriding: key = value' line per override, to log_to (None = stdout)."""
    defaults = {k: v for k, v in defaults.items() if not k.startswith('_') and isinstance(v, LITERAL_TYPES)}
    more_help = None
    if fields_of is not None:
        fields = [f for f in dataclasses.fields(fields_of) if f.name not in except_fields]
        defaults = {f.name: f.default for f in fields} | defaults
        types = {f.name: f.type for f in fields} | (types or {})
        more_help = (f"model ({fields_of.__name__}, {fields_of.__module__}.py)", field_docs(fields_of))
    kinds = {key: type(default) if default is not None else (types or {}).get(key)
             for key, default in defaults.items()}
    if '--help' in argv or '-h' in argv:
        print(help_text(defaults, kinds, script, more_help))
        raise SystemExit(0)
    config = dict(defaults)
    for arg in argv:
        if arg.startswith('--'):
            key, has_value, text = arg[2:].partition('=')  # only the first '=' separates key and value
            _require_known(key, defaults, 'config error')
            if not has_value:
                raise SystemExit(f"config error: {arg} needs a value, e.g. {arg}={defaults[key]!r}")
            overrides = {key: _parse(f'--{key}', text, kinds[key], defaults[key] is None)}
            where, name = 'config error', '--'
        elif arg.endswith('.py'):
            # the file's modules and functions are its helpers, unless they take a setting's name
            overrides = {key: value for key, value in _read_config_file(arg).items()
                         if key in defaults or not (isinstance(value, pytypes.ModuleType) or callable(value))}
            where, name = f'config error in {arg}', ''
        else:
            raise SystemExit(f"config error: unexpected argument {arg!r} "
                             "(expected --key=value or a config file ending in .py; "
                             "--help lists the settings)")
        for key, value in overrides.items():
            _require_known(key, defaults, where)
            kind, nullable = kinds[key], defaults[key] is None
            if not _accepts(kind, nullable, value):
                shown = f" {value!r}" if isinstance(value, LITERAL_TYPES) else ''  # not a function's address
                raise SystemExit(f"{where}: {name}{key} expects {_describe(kind, nullable)}, "
                                 f"got {type(value).__name__}{shown}")
            if kind is float and value is not None:
                value = float(value)  # --dropout=0 means 0.0
            elif kind in (tuple, list) and not nullable:
                value = kind(value)  # (0, 1) and [0, 1] are the same setting
            config[key] = value
            if verbose:
                print(f"Overriding: {key} = {value!r}", file=log_to)
    return config


def _require_known(key, defaults, where):
    if key not in defaults:
        close = difflib.get_close_matches(key, list(defaults), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SystemExit(f"{where}: unknown config key {key!r}{hint}")


def _parse(name, text, kind, nullable):
    """Turn the text after '=' into a value, using the setting's type to resolve bare words."""
    if kind is bool and text.lower() in ('true', 'false'):
        return text.lower() == 'true'
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # what literal_eval may raise
        if kind is str:
            return text  # bare words such as resume, cuda:0 or out/lr=1e-3
        raise SystemExit(f"config error: {name} expects {_describe(kind, nullable)}, "
                         f"got {text!r}, which is not a Python literal")
    if kind is str and not isinstance(value, str) and not (nullable and value is None):
        return text  # --wandb_run_name=2024 means the name '2024'
    return value


def _accepts(kind, nullable, value):
    if value is None:
        return nullable or kind is None
    if kind is None:
        return isinstance(value, LITERAL_TYPES)  # no type to go by: any literal will do
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # bool is a subclass of int, but True is not a layer count
    if kind is float:
        return isinstance(value, (int, float))
    if kind in (tuple, list):
        return isinstance(value, (tuple, list))
    return isinstance(value, kind)


def _describe(kind, nullable=False):
    if kind is None:
        return "a Python literal (None, a number, str, bool, list or tuple)"
    description = {bool: "bool (True or False, not 0 or 1)", tuple: "a list or tuple",
                   list: "a list or tuple"}.get(kind, kind.__name__)
    return f"{description} or None" if nullable else description


def _read_config_file(path):
    """Run a config file; return its top-level names that are not private."""
    cli.refuse_pipe(path, "config error: config file", "save the config as a file")
    try:
        with open(path, encoding='utf-8') as f:
            source = f.read()
    except FileNotFoundError:
        raise SystemExit(f"config error: config file {path} not found")
    except IsADirectoryError:
        raise SystemExit(f"config error: config file {path} is a folder; name a .py file in it")
    except UnicodeDecodeError as e:
        raise SystemExit(f"config error: config file {path} is not UTF-8 text (byte {e.start}); "
                         f"save it as UTF-8")
    except OSError as e:
        raise SystemExit(f"config error: cannot read config file {path} ({e.strerror})")
    namespace = {'__file__': path}
    try:
        exec(compile(source, path, 'exec'), namespace)
    except SyntaxError as e:
        raise SystemExit(f"config error in {path}:{e.lineno}: {e.msg}")
    except (Exception, SystemExit) as e:  # a config file is a program; report where it failed, in one line
        line = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path][-1]
        what = ("it exits (sys.exit or exit); a config file only sets values" if isinstance(e, SystemExit)
                else f"{type(e).__name__}: {e}")
        raise SystemExit(f"config error in {path}:{line}: {what}")
    return {k: v for k, v in namespace.items() if not k.startswith('_')}

# -----------------------------------------------------------------------------
# --help: the settings as the script lays them out


def help_text(defaults, kinds, script, more_help=None):
    """The script's docstring, then every setting as --key=default with its trailing comment, under the
    comment lines that head its group in the script (a line of dashes ends the settings' preamble), then
    more_help's settings under its heading."""
    docstring, entries = '', []  # entries: a heading str, or (key, comment) for a setting
    if script is not None:
        with open(script, encoding='utf-8') as f:
            source = f.read()
        docstring = ast.get_docstring(ast.parse(source)) or ''
        entries = _settings_layout(source, defaults)
    heading, comments = more_help or ('', {})
    entries = [(e[0], e[1] or comments.get(e[0], '')) if isinstance(e, tuple) else e for e in entries]
    listed = {entry[0] for entry in entries if isinstance(entry, tuple)}
    more = [(key, comments[key]) for key in comments if key in defaults and key not in listed]
    entries += [heading, *more] if more else []
    # set elsewhere than in a plain assignment
    entries += [(key, '') for key in defaults if key not in listed and key not in comments]

    def setting(key):
        kind = f" ({kinds[key].__name__})" if defaults[key] is None and kinds[key] is not None else ''
        return f"--{key}={defaults[key]!r}{kind}"

    width = min(32, max(len(setting(entry[0])) for entry in entries if isinstance(entry, tuple)))
    lines = [docstring, '', "settings (config files and --key=value override them, left to right):"]
    for entry in entries:
        if isinstance(entry, str):
            lines.append(f"\n{entry}")
        else:
            key, comment = entry
            lines.append(f"  {setting(key):<{width}}  {comment}".rstrip())
    return '\n'.join(lines).strip('\n')


def _settings_layout(source, defaults):
    """[heading or (key, trailing comment)] in source order, from the top-level assignments of `defaults`'
    keys and the whole-line comments among them and just above the first."""
    assigned = {}  # key -> (first line, last line) of its first top-level assignment
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in defaults:
                assigned.setdefault(node.targets[0].id, (node.lineno, node.end_lineno))
    if not assigned:
        return []
    comments = {}  # line -> (text, whole line?, continues the comment above: "#   " indented)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip('#').strip()
            comments[token.start[0]] = (text, not token.line[:token.start[1]].strip(),
                                        token.string.startswith('#   '))

    def heading(line):
        text, whole_line, continuation = comments.get(line, ('', False, False))
        return whole_line and not continuation and text.strip('-') != ''  # dashes separate, heading nothing

    first = min(start for start, _ in assigned.values())
    while heading(first - 1):  # the comment lines right above the first setting head it
        first -= 1
    starts = {start: key for key, (start, _) in assigned.items()}
    last = max(end for _, end in assigned.values())
    entries = []
    for line in range(first, last + 1):
        if line in starts:
            key = starts[line]
            start, end = assigned[key]
            text, whole_line, _ = comments.get(end, comments.get(start, ('', True, False)))
            text = '' if whole_line else text
            while text and comments.get(end + 1, ('', False, False))[2]:  # a long comment goes on below
                end += 1
                text += ' ' + comments[end][0]
            entries.append((key, text))
        elif heading(line):
            entries.append(comments[line][0])
    return entries


def field_docs(cls):
    """{field: its docstring, on one line} of a dataclass whose fields each have one below them, as
    GPTConfig's do."""
    docs = {}
    for base in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(base))).body[0].body
        docs |= {node.target.id: ' '.join(doc.value.value.split())
                 for node, doc in zip(body, body[1:]) if isinstance(node, ast.AnnAssign)
                 and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)}
    return docs
