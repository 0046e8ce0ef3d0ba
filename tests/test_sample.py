"""sample.py on tiny checkpoints trained here in seconds: in this process (fast),
and once through the real CLI."""
import contextlib
import functools
import io
import os
import re
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

from model import GPT, GPTConfig
from testing import run_script, with_stdout_closed
from vrl import run_folder

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
SAMPLE_PY = os.path.join(HERE, 'sample.py')
TEXT = "the quick brown fox jumps over the lazy dog. " * 40
CHARS = sorted(set(TEXT))
# vocabulary padded as train.py does
TINY = dict(block_size=32, vocab_size=64, n_layer=3, n_head=2, n_embd=32)


@contextlib.contextmanager
def one_thread():
    """Models this small only lose time to a second thread, and a lot of it on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_tiny_checkpoint(path, variant, data_dir='data/tiny_char', steps=150, text=TEXT, chars=CHARS, seed=0,
                          **settings):
    """Train a tiny character-level model on text (TEXT: until greedy decoding recites it); save it as
    train.py would, with `settings` added to its config."""
    torch.manual_seed(seed)
    config = GPTConfig(**TINY, variant=variant)
    model = GPT(config)
    data = torch.tensor([chars.index(c) for c in text])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    T = config.block_size
    with one_thread():
        for _ in range(steps):
            starts = torch.randint(len(data) - T - 1, (16,))
            x = torch.stack([data[s:s + T] for s in starts])
            y = torch.stack([data[s + 1:s + T + 1] for s in starts])
            loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({'model': model.state_dict(), 'model_args': asdict(config), 'iter_num': steps,
                'best_val_loss': loss.item(),
                'config': {'dataset': 'tiny_char', 'data_dir': data_dir, 'block_size': T, 'dtype': 'float32',
                           'seed': seed, 'out_dir': os.path.dirname(path), **settings},
                'data_meta': {'tokenizer': 'char', 'chars': chars, 'vocab_size': len(chars)}}, path)
    return model


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """Folders with a trained vanilla and SVFormer checkpoint each, and one with a truncated checkpoint."""
    root = tmp_path_factory.mktemp('runs')
    for variant in ('vanilla', 'svformer'):
        train_tiny_checkpoint(str(root / variant / 'ckpt.pt'), variant)
    (root / 'truncated').mkdir()
    data = (root / 'vanilla' / 'ckpt.pt').read_bytes()
    (root / 'truncated' / 'ckpt.pt').write_bytes(data[:len(data) // 2])
    checkpoint = torch.load(root / 'vanilla' / 'ckpt.pt', weights_only=True)
    (root / 'no_meta').mkdir()
    torch.save({k: v for k, v in checkpoint.items() if k != 'data_meta'}, root / 'no_meta' / 'ckpt.pt')
    (root / 'damaged_best').mkdir()  # a good ckpt.pt, and a best.pt that no longer matches its checksum
    torch.save(checkpoint, root / 'damaged_best' / 'ckpt.pt')
    torch.save(checkpoint | {'checksum': run_folder.checksum(checkpoint) + 1}, root / 'damaged_best' / 'best.pt')
    (root / 'nan').mkdir()
    checkpoint['model']['lm_head.weight'][0, 0] = float('nan')
    torch.save(checkpoint, root / 'nan' / 'ckpt.pt')
    return root


def run_sample(out_dir, *args, check=True):
    """`python sample.py --out_dir=... --device=cpu *args` run from out_dir's parent folder, in this process."""
    with one_thread():
        return run_script(SAMPLE_PY, [f'--out_dir={out_dir}', '--device=cpu', *args], os.path.dirname(out_dir),
                          check)


def sample(out_dir, *args):
    """(stdout, stderr) of a sample.py run that succeeds."""
    result = run_sample(out_dir, *args)
    return result.stdout, result.stderr


def sample_error(out_dir, *args):
    """The message a sample.py run exits with, status 1: its stderr holds the message on one line, after
    configurator's Overriding lines."""
    result = run_sample(out_dir, *args, check=False)
    *overrides, message = result.stderr.splitlines()
    assert result.returncode == 1 and all(line.startswith('Overriding: ') for line in overrides), result.stderr
    return message


def samples_of(stdout):
    """The printed samples: stdout holds them alone (configurator's 'Overriding' lines go to stderr)."""
    assert stdout.endswith('\n---------------\n')
    return stdout.split('\n---------------\n')[:-1]


def kv_line(stderr):
    """(cache bytes, vanilla bytes, percent) from the line
    `kv cache: 1,234 bytes (vanilla same shape: 2,468; 50.0%)`."""
    match = re.search(r'^kv cache: ([\d,]+) bytes \(vanilla same shape: ([\d,]+); ([\d.]+)%\)$', stderr, re.M)
    assert match, stderr
    return int(match[1].replace(',', '')), int(match[2].replace(',', '')), float(match[3])


# 69 tokens: past block_size, so the context crops
GREEDY = ('--start=the quick', '--temperature=0', '--max_new_tokens=60')


def test_greedy_output_is_the_same_with_and_without_the_cache(runs):
    cached, cached_log = sample(runs / 'vanilla', *GREEDY, '--use_cache=True')
    uncached, uncached_log = sample(runs / 'vanilla', *GREEDY, '--use_cache=False')
    assert samples_of(cached) == samples_of(uncached)
    [text] = samples_of(cached)
    assert len(text) == 9 + 60 and text.startswith('the quick brown fox jumps')  # the model learned TEXT
    assert 'kv cache:' in cached_log and 'kv cache:' not in uncached_log


def test_a_batch_of_greedy_samples_equals_the_streamed_sample(runs):
    streamed, _ = sample(runs / 'vanilla', *GREEDY)
    batched, log = sample(runs / 'vanilla', *GREEDY, '--num_samples=3')
    assert samples_of(batched) == samples_of(streamed) * 3
    assert 'generated 180 tokens (3 x 60)' in log


def test_sampling_a_batch_gives_separate_samples(runs):
    stdout, _ = sample(runs / 'vanilla', '--start=the ', '--num_samples=3', '--max_new_tokens=20',
                       '--temperature=2.0')
    texts = samples_of(stdout)
    assert len(texts) == 3 and all(t.startswith('the ') and len(t) == 24 for t in texts)
    assert len(set(texts)) > 1  # at temperature 2, three identical 20-token samples would be a fluke


def test_padding_tokens_are_never_sampled(runs):
    # at temperature 5 the 36 padding ids past the 28 characters would otherwise come up within a few tokens
    stdout, _ = sample(runs / 'vanilla', '--start=the ', '--num_samples=4', '--max_new_tokens=100',
                       '--temperature=5.0')
    assert [len(text) for text in samples_of(stdout)] == [104] * 4


def test_a_sample_ends_before_the_stop_text(runs):
    stdout, log = sample(runs / 'vanilla', *GREEDY, '--stop=fox')
    assert samples_of(stdout) == ['the quick brown ']
    assert 'generated 10 tokens' in log  # ' brown fox': generation ends once every sample has stopped


@pytest.mark.parametrize('variant, key_layers, value_layers', [('vanilla', 3, 3), ('svformer', 3, 1)])
def test_reported_kv_cache_bytes_are_the_models_cache(runs, variant, key_layers, value_layers):
    _, log = sample(runs / variant, '--start=the ', '--num_samples=2', '--max_new_tokens=10')
    kv_bytes, vanilla_bytes, percent = kv_line(log)
    # float32 keys or values of shape (batch 2, 2 heads, 4 + 10
    # positions, head_dim 16) for each layer that caches them
    per_layer = 2 * 2 * (4 + 10) * 16 * 4
    assert kv_bytes == (key_layers + value_layers) * per_layer
    assert vanilla_bytes == 2 * 3 * per_layer
    assert percent == round(100 * (key_layers + value_layers) / 6, 1)  # SVFormer: (L + 1) / 2L = 66.7%


@pytest.mark.parametrize('run, args, words', [
    ('missing', ['--start=the '], ['not found']),
    ('truncated', ['--start=the '], ['truncated/ckpt.pt']),
    ('vanilla', ['--start='], ['empty']),
    ('vanilla', ['--start=the Zebra?'], ["'?'", "'Z'"]),
    ('vanilla', ['--start=' + 'the ' * 10], ['40 tokens', 'block_size of 32']),
    ('vanilla', ['--start=FILE:no_such_prompt.txt'], ['no_such_prompt.txt']),
    ('vanilla', ['--temperature=-1'], ['temperature']),
    ('vanilla', ['--top_k=0'], ['top_k']),
    ('vanilla', ['--num_samples=0'], ['num_samples']),
    ('vanilla', ['--start=the ', '--temperature=1e-40'], ['temperature=1e-40', 'use 0 for greedy']),
    ('vanilla', ['--start=the ', '--temperature=1e999'], ['temperature=inf', 'finite']),
    # sized before the batch is made: the list [start_ids] * num_samples alone was a MemoryError
    ('vanilla', ['--start=the ', '--num_samples=100000000000', '--max_new_tokens=2'],
     ['num_samples=100000000000 samples of 4 + 2 tokens needs at least', 'does not fit', 'fewer samples']),
    ('vanilla', ['--start=the ', '--seed=99999999999999999999999'],
     ['seed=99999999999999999999999', '2**64 - 1']),
    ('no_meta', ['--start=the '], ['no_meta/ckpt.pt has no data_meta']),
    ('nan', ['--start=the '], ['nan/ckpt.pt holds NaN or inf weights (lm_head.weight)', 'its run diverged; '
                                're-train or point to another checkpoint']),
])
def test_bad_input_exits_with_one_line(runs, run, args, words):
    message = sample_error(runs / run, *args)
    assert all(word in message for word in words), message


def test_a_damaged_best_pt_is_answered_with_the_runs_other_checkpoint(runs):
    """A best.pt that fails its checksum: the advice names the run's ckpt.pt (not best.pt, which it is)."""
    assert sample_error(runs / 'damaged_best', '--start=the ', '--ckpt=best.pt') == (
        f"checkpoint {runs / 'damaged_best' / 'best.pt'} is damaged: it no longer matches the checksum written "
        f"with it (a flipped byte on disk or in a copy); use {runs / 'damaged_best' / 'ckpt.pt'} instead")


def test_command_line(runs):
    """The real thing once: a sample on stdout, the statistics on stderr,
    and a one-line error with exit status 1."""
    def cli(out_dir, *args):
        return subprocess.run([sys.executable, SAMPLE_PY, f'--out_dir={out_dir}', '--device=cpu', *args],
                              capture_output=True, text=True, cwd=runs,
                              env=dict(os.environ, OMP_NUM_THREADS='1'))
    result = cli('svformer', *GREEDY)
    assert result.returncode == 0, result.stderr
    # stdout is exactly the text: the 9-character prompt, 60 characters, the separator line
    assert result.stdout.startswith('the quick brown fox jumps') and len(result.stdout) == 9 + 60 + 17
    assert samples_of(result.stdout) == [result.stdout[:69]]
    assert "Overriding: temperature = 0.0\n" in result.stderr
    assert kv_line(result.stderr)[2] == 66.7
    result = cli('missing', *GREEDY)
    *overrides, error = result.stderr.splitlines()
    assert (result.returncode, result.stdout) == (1, '') and 'missing/ckpt.pt not found' in error
    assert len(overrides) == 5 and all(line.startswith('Overriding: ') for line in overrides)


# vrl/hardware.py's pick_device turns an unusable device into one line
@pytest.mark.parametrize('device', ['nosuch', 'cuda:0'])
def test_unusable_device_exits_with_one_line(runs, device):
    if device.startswith('cuda') and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    message = sample_error(runs / 'vanilla', '--start=the ', f'--device={device}')
    assert device in message, message


def test_a_prompt_file_that_is_a_pipe_without_a_writer_exits_with_one_line_instead_of_waiting(runs):
    os.mkfifo(runs / 'prompt.fifo')  # opening it to read would block until someone opened it to write
    result = subprocess.run([sys.executable, SAMPLE_PY, '--out_dir=vanilla', '--device=cpu',
                             '--start=FILE:prompt.fifo'],
                            capture_output=True, text=True, cwd=runs, timeout=60)
    assert (result.returncode, result.stdout) == (1, '') and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == ("sample.py: the prompt file prompt.fifo is not a regular file "
                                              "(a pipe or device may wait forever for a writer); save the "
                                              "prompt to a file, or pass --start=TEXT")


@pytest.mark.parametrize('what', ['config', 'checkpoint'])
def test_a_config_or_checkpoint_that_is_a_pipe_exits_with_one_line_instead_of_waiting(runs, what):
    """A separate process, with a timeout: a pipe opened to read would block this one for good."""
    (runs / 'piped').mkdir(exist_ok=True)
    os.mkfifo(runs / 'piped' / ('ckpt.pt' if what == 'checkpoint' else 'config.py'))
    args = ['--out_dir=piped'] if what == 'checkpoint' else ['piped/config.py', '--out_dir=vanilla']
    try:
        result = subprocess.run([sys.executable, SAMPLE_PY, '--device=cpu', '--start=the ', *args],
                                capture_output=True, text=True, cwd=runs, timeout=60)
    finally:
        os.remove(runs / 'piped' / ('ckpt.pt' if what == 'checkpoint' else 'config.py'))
    assert (result.returncode, result.stdout) == (1, '') and 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].endswith('is not a regular file (a pipe or device may wait forever '
                                                   'for a writer); ' + ('point to a checkpoint file written '
                                                   'by train.py' if what == 'checkpoint' else
                                                   'save the config as a file'))


def test_a_checkpoint_without_read_permission_says_so(runs, monkeypatch):
    """chmod 000 does not stop root, who runs these tests in some containers: the OS's refusal is simulated
    where torch.load opens the file."""
    real_open = open

    def refusing_open(path, *args, **kwargs):
        if str(path).endswith('ckpt.pt'):
            raise PermissionError(13, 'Permission denied', str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(torch.serialization, 'open', refusing_open, raising=False)
    assert sample_error(runs / 'vanilla', '--start=the ') == (
        f"checkpoint {runs / 'vanilla' / 'ckpt.pt'} is unreadable (permission denied); check its permissions or "
        "point to another checkpoint")


# -----------------------------------------------------------------------------
# Sample: each token decoded once as it arrives, the text the same as the whole sample's decode. The tokens
# are scripted (the model's generate_tokens replaced), so every case is exact: GPT-2 BPE splits a
# multi-byte character over tokens, and some tokens even end inside the next character.
GPT2_META = {'tokenizer': 'gpt2', 'vocab_size': 50257, 'eot_token': 50256}
EOT = 50256


@functools.lru_cache(maxsize=1)
def gpt2():
    """GPT-2's BPE, built once (about a second)."""
    from vrl.tokenizer import load_tokenizer
    return load_tokenizer(GPT2_META)


def byte_token(byte):
    return gpt2().encoding.encode_single_token(bytes([byte]))


@pytest.fixture(scope='module')
def bpe_run(tmp_path_factory):
    """A folder with an untrained GPT-2 BPE checkpoint (its tokens are scripted)."""
    root = tmp_path_factory.mktemp('bpe')
    config = GPTConfig(block_size=32, vocab_size=50304, n_layer=2, n_head=2, n_embd=16, variant='vanilla')
    torch.manual_seed(0)
    model = GPT(config)
    (root / 'bpe').mkdir()
    torch.save({'model': model.state_dict(), 'model_args': asdict(config), 'iter_num': 0,
                'config': {'dataset': 'shakespeare_gpt2'}, 'data_meta': GPT2_META}, root / 'bpe' / 'ckpt.pt')
    return root / 'bpe'


def scripts():
    """{name: generated token ids}: a split emoji and split CJK characters; tokens that each end inside the
    next character (曶橶書: E6 | 9B | B6 E6 | A9 B6 E6 | 9B | B8), a sample that ends inside a character at
    max_new_tokens or at the end of text, and plain ASCII."""
    enc = gpt2()
    chain = [byte_token(0xE6), byte_token(0x9B), 35050, 47490, byte_token(0x9B), byte_token(0xB8)]
    return {'split': enc.encode(' quick 😀 fox 日本語 dog. 中华人民共和国 ok'),
            'straddle': enc.encode(' a') + chain + enc.encode(' b') + chain,
            'cut_at_the_end': enc.encode(' the end 日') + [33768],  # b'\xe6\x97': the first bytes of 日
            'eot_inside_a_character': enc.encode(' x 語') + [33768, EOT] + enc.encode(' after'),
            'ascii': enc.encode(' the quick brown fox jumps over the lazy dog.' * 4)}


def whole_decode(ids, stop=''):
    """What the sample's text must be: its tokens decoded at once, up to the end of text, cut before the
    stop text."""
    text = gpt2().decode(ids[:ids.index(EOT)] if EOT in ids else ids)
    return text[:text.index(stop)] if stop and stop in text else text


@contextlib.contextmanager
def scripted(monkeypatch, rows):
    """sample.py's model yields rows' tokens (a row per sample, all of one length); its tokenizer counts
    the tokens it decodes (in counted[0])."""
    import vrl.tokenizer
    [width] = {len(row) for row in rows}

    def generate_tokens(self, idx, max_new_tokens, *args, **kwargs):
        assert idx.size(0) == len(rows)
        for step in range(min(max_new_tokens, width)):
            yield torch.tensor([[row[step]] for row in rows])

    counted = [0]

    class Counting:
        eot_token, vocab_size, encode = gpt2().eot_token, gpt2().vocab_size, gpt2().encode

        def decode(self, ids):
            counted[0] += len(ids)
            return gpt2().decode(ids)

    def counting(meta):
        assert meta == GPT2_META
        return Counting()
    monkeypatch.setattr(GPT, 'generate_tokens', generate_tokens)
    monkeypatch.setattr(vrl.tokenizer, 'load_tokenizer', counting)
    yield counted


@pytest.mark.parametrize('stop', ['', '本語', 'fox', '書 b'])
def test_streamed_and_batched_text_is_the_whole_samples_decode(bpe_run, monkeypatch, stop):
    """Each scripted sample, streamed alone, prints the prompt and its tokens' whole decode (cut before the
    stop text): no half character, nothing lost at the end; the same samples drawn as one batch print the
    same texts."""
    names, rows = zip(*scripts().items())
    width = max(map(len, rows))
    rows = [[220] * (width - len(row)) + row for row in rows]  # spaces first: each ends as it was made to
    prompt = gpt2().decode(gpt2().encode('Hello'))
    args = ['--start=Hello', '--use_cache=False', f'--max_new_tokens={width}', f'--stop={stop}']
    for name, row in zip(names, rows):
        with scripted(monkeypatch, [row]):
            stdout, _ = sample(bpe_run, *args)
        assert samples_of(stdout) == [prompt + whole_decode(row, stop)], name
    with scripted(monkeypatch, list(rows)):
        stdout, _ = sample(bpe_run, *args, f'--num_samples={len(rows)}')
    assert samples_of(stdout) == [prompt + whole_decode(row, stop) for row in rows]


def test_the_stream_never_shows_half_a_character_or_the_start_of_the_stop_text(bpe_run, monkeypatch):
    """What streams as the tokens arrive is final: sample.py's writes, in order, never hold U+FFFD (a
    character whose bytes are still coming) nor text that the stop text later cuts."""
    row = scripts()['split']
    streams = []  # the writes to each StringIO made meanwhile: run_script's stdout is one

    class Recorder(io.StringIO):
        def __init__(self, *args):
            super().__init__(*args)
            self.writes = []
            streams.append(self)

        def write(self, text):
            self.writes.append(text)
            return super().write(text)
    monkeypatch.setattr(io, 'StringIO', Recorder)
    with scripted(monkeypatch, [row]):
        stdout, _ = sample(bpe_run, '--start=Hello', '--use_cache=False', '--max_new_tokens=40',
                           '--stop=中华人民')
    [writes] = [stream.writes for stream in streams if stream.getvalue() == stdout]
    streamed = ''.join(writes)
    assert samples_of(stdout) == ['Hello' + whole_decode(row, '中华人民')]
    assert '\ufffd' not in streamed and '中' not in streamed
    assert len([w for w in writes if w]) > 5  # it streamed: not all at the end


def test_each_token_is_decoded_once(bpe_run, monkeypatch):
    """A sample of N tokens costs N token decodes, not the N (N + 1) / 2 of decoding the whole sample at
    each token; a token waits (and is decoded again) only while it ends inside a character."""
    row = scripts()['ascii']
    with scripted(monkeypatch, [row]) as counted:
        sample(bpe_run, '--start=Hello', '--use_cache=False', f'--max_new_tokens={len(row)}')
    prompt = len(gpt2().encode('Hello'))
    assert counted[0] == prompt + len(row)  # the prompt's decode, then each token once
    row = scripts()['split']
    with scripted(monkeypatch, [row]) as counted:
        sample(bpe_run, '--start=Hello', '--use_cache=False', f'--max_new_tokens={len(row)}')
    assert prompt + len(row) < counted[0] < prompt + 2 * len(row)


def test_help_into_a_closed_pipe_ends_quietly():
    """`python sample.py --help | head`: no BrokenPipeError once head has its lines."""
    result = with_stdout_closed([sys.executable, 'sample.py', '--help'], cwd=os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    assert (result.returncode, result.stderr) == (0, '')
