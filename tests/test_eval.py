"""eval.py through lm_eval's full path (task YAML, local JSONL, simple_evaluate) on tiny models,
with no network."""
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

# set before lm_eval imports datasets and huggingface_hub, which read them once
os.environ['HF_DATASETS_OFFLINE'] = '1'
os.environ['HF_HUB_OFFLINE'] = '1'

import lm_eval.evaluator
import pytest
import torch
import torch.nn.functional as F

from lab.eval import LOCAL_TASKS_DIR, ValueResidualLM, accuracy_means, evaluate
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
EVAL_PY = os.path.join(HERE, 'lab', 'eval.py')
ITEMS = [json.loads(line) for line in open(os.path.join(LOCAL_TASKS_DIR, 'tiny_choice.jsonl'))]
# each item as the task writes it, answer included: what the "trained on its answers" model learns
ANSWERED = [f"Question: {d['question']}\nAnswer: {d['choices'][d['answer']]}\n\n" for d in ITEMS]
CHARS = sorted(set(''.join(ANSWERED) + ''.join(c for d in ITEMS for c in d['choices'])))
# block_size 48 is shorter than most items, so most contexts are cut on the left
TINY = dict(block_size=48, vocab_size=64, n_layer=3, n_head=2, n_embd=32)
VARIANTS = ('vanilla', 'resformer_identity', 'svformer')
CHAR_META = {'tokenizer': 'char', 'chars': CHARS, 'vocab_size': len(CHARS)}
GPT2_META = {'tokenizer': 'gpt2', 'vocab_size': 50257, 'eot_token': 50256}  # as prepare.py writes it


@pytest.fixture(autouse=True)
def setup(monkeypatch):
    monkeypatch.chdir(HERE)  # task YAMLs name their data files relative to the repository root
    # lm_eval records the machine with each result through torch's collect_env, which runs pip and nvidia-smi:
    # seconds per call. The command-line test keeps it.
    monkeypatch.setattr(lm_eval.evaluator, 'add_env_info', lambda results: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # models this small only lose time to a second thread
    yield
    torch.set_num_threads(threads)


def save_checkpoint(model, path, data_meta=CHAR_META):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({'model': model.state_dict(), 'model_args': asdict(model.config), 'config': {},
                'data_meta': data_meta}, path)
    return path


def train_on_answers(variant, steps):
    """A tiny model trained on the quiz with its answers; the last block_size + 1 characters of each item."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, variant=variant))
    docs = [[CHARS.index(c) for c in text][-(TINY['block_size'] + 1):] for text in ANSWERED]
    longest = max(map(len, docs))
    x = torch.tensor([d[:-1] + [0] * (longest - len(d)) for d in docs])
    y = torch.tensor([d[1:] + [-1] * (longest - len(d)) for d in docs])  # -1: padding, not scored
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """variant -> path of a character-level checkpoint with random weights; 'gpt2' -> a GPT-2 BPE one
    (vocabulary padded to 50304, as train.py does); 'trained' -> an Identity ResFormer trained on the
    answers."""
    root = tmp_path_factory.mktemp('runs')
    paths = {}
    for variant in VARIANTS:
        torch.manual_seed(0)
        paths[variant] = save_checkpoint(GPT(GPTConfig(**TINY, variant=variant)),
                                         str(root / variant / 'ckpt.pt'))
    torch.manual_seed(0)
    gpt2 = GPT(GPTConfig(**(TINY | dict(block_size=8, vocab_size=50304)), variant='resformer_identity'))
    paths['gpt2'] = save_checkpoint(gpt2, str(root / 'gpt2' / 'ckpt.pt'), GPT2_META)
    paths['trained'] = save_checkpoint(train_on_answers('resformer_identity', steps=40),
                                       str(root / 'trained' / 'ckpt.pt'))
    return paths


@pytest.fixture(scope='module')
def extra_tasks(tmp_path_factory):
    """A folder of task YAMLs on the quiz's data: greedy generation, rolling perplexity, and the quiz
    scored by acc alone (as lm_eval scores WinoGrande)."""
    folder = tmp_path_factory.mktemp('tasks')
    data = f"""dataset_path: json
dataset_kwargs:
  data_files:
    test: {os.path.join(LOCAL_TASKS_DIR, 'tiny_choice.jsonl')}
test_split: test
"""
    (folder / 'tiny_generate.yaml').write_text(f"""task: tiny_generate
{data}output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["?"]
  max_gen_toks: 30
metric_list:
  - metric: exact_match
""")
    (folder / 'tiny_rolling.yaml').write_text(f"""task: tiny_rolling
{data}output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}} {{{{question}}}} {{{{question}}}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
""")
    (folder / 'tiny_acc_only.yaml').write_text(f"""task: tiny_acc_only
{data}output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""")
    (folder / 'tiny_missing.yaml').write_text(f"""task: tiny_missing
{data.replace('tiny_choice.jsonl', 'no_such_file.jsonl')}output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
""")
    return str(folder)


def direct_log_prob(model, vocab_size, context, continuation):
    """(log P(continuation | context), whether it is the greedy continuation) from model.py alone: one
    sequence, its last block_size + 1 tokens, probabilities over the tokenizer's vocabulary."""
    tokens = (context + continuation)[-(model.config.block_size + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]]))[0, :, :vocab_size]
    n = len(continuation)
    log_probs = F.log_softmax(logits.float(), dim=-1)[len(tokens) - 1 - n:]
    return (sum(log_probs[j, token].item() for j, token in enumerate(continuation)),
            log_probs.argmax(dim=-1).tolist() == continuation)


def samples(results, task):
    return results['samples'][task]


@pytest.mark.parametrize('variant', VARIANTS + ('gpt2',))
def test_loglikelihoods_equal_a_direct_computation(checkpoints, variant):
    # 48 requests: batches of 5, the last of 3
    lm = ValueResidualLM(checkpoints[variant], device='cpu', batch_size=5)
    results = evaluate(lm, ['tiny_choice'], log_samples=True)
    encode, vocab_size = lm.tokenizer.encode, lm.tokenizer.vocab_size
    items = samples(results, 'tiny_choice')
    assert len(items) == len(ITEMS)
    for item in items:
        for (context, continuation), [(log_prob, is_greedy)] in zip(item['arguments'], item['resps']):
            expected, expected_greedy = direct_log_prob(lm.model, vocab_size, encode(context),
                                                        encode(continuation))
            assert log_prob == pytest.approx(expected, abs=1e-5, rel=1e-5)
            assert is_greedy == expected_greedy
    assert results['results']['tiny_choice']['acc,none'] * len(ITEMS) == sum(
        max(range(4), key=lambda k: item['resps'][k][0][0]) == item['target'] for item in items)


@pytest.mark.parametrize('variant', VARIANTS + ('gpt2',))
def test_rolling_loglikelihood_equals_a_direct_computation(checkpoints, extra_tasks, variant):
    lm = ValueResidualLM(checkpoints[variant], device='cpu', batch_size=4)
    results = evaluate(lm, ['tiny_rolling'], [LOCAL_TASKS_DIR, extra_tasks], log_samples=True)
    model, L, vocab_size = lm.model, lm.max_length, lm.tokenizer.vocab_size
    # the token before a document: GPT-2's <|endoftext|>,
    # or the newline that ends a character-level blank line
    start_of_text = 50256 if variant == 'gpt2' else CHARS.index('\n')
    lengths = []
    for item in samples(results, 'tiny_rolling'):
        [(text,)] = item['arguments']
        ids = lm.tokenizer.encode(text)
        lengths.append(len(ids))
        # lm_eval's scheme: windows of L predictions, each
        # token predicted once; the last window reads a full L
        seq = [start_of_text] + ids
        expected = 0.0
        for start in range(0, len(ids), L):
            end = min(start + L, len(ids))
            first = max(0, end - L)  # the window reads seq[first:end] and predicts ids[first:end]
            with torch.no_grad():
                logits = model(torch.tensor([seq[first:end]]))[0, :, :vocab_size]
            log_probs = F.log_softmax(logits, dim=-1)
            expected += sum(log_probs[j - first, ids[j]].item() for j in range(start, end))
        [[log_prob]] = item['resps']
        assert log_prob == pytest.approx(expected, abs=1e-5, rel=1e-5)
    assert max(lengths) > 2 * L  # a question three times: some texts need three windows or more


def test_greedy_generate_until_equals_model_generate(checkpoints, extra_tasks):
    lm = ValueResidualLM(checkpoints['svformer'], device='cpu', batch_size=3)
    results = evaluate(lm, ['tiny_generate'], [LOCAL_TASKS_DIR, extra_tasks], log_samples=True)
    lengths = set()
    for item in samples(results, 'tiny_generate'):
        [(context, gen_kwargs)] = item['arguments']
        ids = lm.tokenizer.encode(context)
        lengths.add(len(ids))
        out = lm.model.generate(torch.tensor([ids[-lm.max_length:]]), 30, temperature=0,
                                vocab_size=len(CHARS))
        expected = lm.tokenizer.decode(out[0, -30:].tolist()).split('?')[0]
        [[text]] = item['resps']
        assert text == expected
    assert len(lengths) > 1  # contexts of several lengths, so several batches


def test_a_model_trained_on_the_answers_beats_chance_through_the_command_line(checkpoints):
    out_dir = os.path.dirname(checkpoints['trained'])
    result = subprocess.run([sys.executable, EVAL_PY, f'--out_dir={out_dir}', '--tasks=tiny_choice',
                             '--device=cpu'],
                            capture_output=True, text=True, cwd=HERE,
                            env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert result.returncode == 0, result.stderr
    with open(os.path.join(out_dir, 'ckpt_lm_eval.json')) as f:
        results = json.load(f)
    scores = results['results']['tiny_choice']
    assert scores['acc,none'] >= 0.75  # chance is 0.25 on these 12 four-way items
    assert results['accuracy_mean'] == {'tasks': ['tiny_choice'], 'acc': scores['acc,none'],
                                        'acc_norm_else_acc': scores['acc_norm,none']}
    # the headline is plain acc, the paper's metric (eval.py's docstring), with acc_norm's mean beside it
    assert (f"mean accuracy over tiny_choice: {scores['acc,none']:.4f} (acc, the paper's), "
            f"{scores['acc_norm,none']:.4f} (acc_norm;") in result.stdout
    assert results['config']['checkpoint'] == os.path.join(out_dir, 'ckpt.pt')
    assert '|tiny_choice|' in result.stdout and 'ckpt_lm_eval.json' in result.stdout  # lm_eval's table
    assert 'loglikelihood requests: 100%' in result.stderr  # the progress bar


def test_the_mean_takes_acc_norm_else_acc_and_leaves_perplexity_out(checkpoints, extra_tasks):
    lm = ValueResidualLM(checkpoints['vanilla'], device='cpu')
    tasks = ['tiny_choice', 'tiny_rolling', 'tiny_acc_only']
    results = evaluate(lm, tasks, [LOCAL_TASKS_DIR, extra_tasks])
    choice, acc_only = results['results']['tiny_choice'], results['results']['tiny_acc_only']
    assert choice['acc_norm,none'] != choice['acc,none']  # so the test tells the two apart
    assert 'acc_norm,none' not in acc_only
    means = accuracy_means(results, tasks)
    assert means['tasks'] == ['tiny_choice', 'tiny_acc_only']
    assert means['acc_norm_else_acc'] == pytest.approx((choice['acc_norm,none'] + acc_only['acc,none']) / 2)
    assert means['acc'] == pytest.approx((choice['acc,none'] + acc_only['acc,none']) / 2)
    assert accuracy_means(results, ['tiny_rolling']) is None


def test_limit_evaluates_the_first_items_only(checkpoints):
    lm = ValueResidualLM(checkpoints['vanilla'], device='cpu')
    results = evaluate(lm, ['tiny_choice'], limit=3, log_samples=True)
    assert [item['doc_id'] for item in samples(results, 'tiny_choice')] == [0, 1, 2]


def test_missing_data_is_a_one_line_error(checkpoints, extra_tasks):
    lm = ValueResidualLM(checkpoints['vanilla'], device='cpu')
    with pytest.raises(SystemExit) as exit:
        evaluate(lm, ['tiny_missing'], [LOCAL_TASKS_DIR, extra_tasks])
    message = exit.value.code
    assert isinstance(message, str) and '\n' not in message
    assert 'no_such_file.jsonl' in message and 'Hugging Face hub' in message


def test_without_lm_eval_eval_py_says_how_to_install_it():
    # None in sys.modules makes `import lm_eval` raise ImportError, as if it were not installed
    code = (f"import sys, runpy; sys.modules['lm_eval'] = None; "
            f"runpy.run_path({EVAL_PY!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=HERE)
    assert result.returncode == 1
    assert result.stderr == "eval.py: lm_eval is not installed; run `pip install -r lab/requirements-eval.txt`\n"


def test_help_works_without_lm_eval_and_comments_every_setting():
    code = (f"import sys, runpy; sys.modules['lm_eval'] = None; sys.argv = ['eval.py', '--help']; "
            f"runpy.run_path({EVAL_PY!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=HERE)
    assert (result.returncode, result.stderr) == (0, '')
    settings = [line.split() for line in result.stdout.splitlines() if line.startswith('  --')]
    assert [words[0] for words in settings[:2]] == ["--out_dir='out'", "--ckpt='ckpt.pt'"]
    assert len(settings) == 12 and all(len(words) > 1 for words in settings)  # a comment beside each
    assert 'tiny_choice' in result.stdout  # the task that runs offline


def eval_cli(out_dir, *args, env=None):
    return subprocess.run([sys.executable, EVAL_PY, f'--out_dir={out_dir}', '--tasks=tiny_choice',
                           '--device=cpu', '--limit=2', *args], capture_output=True, text=True, cwd=HERE,
                          env=dict(os.environ, OMP_NUM_THREADS='1', **(env or {})))


def one_line_error(result, *words):
    """The last line on stderr is the message (lm_eval's progress bars may precede it); no traceback."""
    message = result.stderr.splitlines()[-1]
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
    assert message.startswith('eval.py: ') and all(word in message for word in words), message


@pytest.mark.parametrize('arg, words', [
    ('--limit=1e999', ['limit=inf', 'positive number']),
    ('--limit=True', ['limit=True']),
    ('--num_fewshot=-1', ['num_fewshot=-1', 'use 0']),
])
def test_bad_settings_exit_with_one_line_before_loading_anything(checkpoints, arg, words):
    # without lm_eval: checked before it is imported
    code = (f"import sys, runpy; sys.modules['lm_eval'] = None; "
            f"sys.argv = ['eval.py', '--out_dir=x', {arg!r}]; "
            f"runpy.run_path({EVAL_PY!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=HERE)
    one_line_error(result, *words)
    assert result.stderr.count('\n') == 1


@pytest.fixture
def evaluated(checkpoints, tmp_path):
    """A run folder with a checkpoint and the results of an earlier evaluation: (folder, their bytes)."""
    shutil.copy(checkpoints['vanilla'], tmp_path / 'ckpt.pt')
    earlier = b'{"results": "an earlier evaluation"}'
    (tmp_path / 'ckpt_lm_eval.json').write_bytes(earlier)
    return tmp_path, earlier


def test_earlier_results_are_kept_unless_overwrite_is_given(evaluated):
    out_dir, earlier = evaluated
    refused = eval_cli(out_dir, '--num_fewshot=1')
    one_line_error(refused, 'ckpt_lm_eval.json holds an earlier', '--overwrite=True')
    assert refused.stderr.count('\n') == 1  # refused before any evaluating
    assert (out_dir / 'ckpt_lm_eval.json').read_bytes() == earlier
    result = eval_cli(out_dir, '--overwrite=True')
    assert result.returncode == 0, result.stderr
    assert json.loads((out_dir / 'ckpt_lm_eval.json').read_text())['config']['limit'] == 2
    assert sorted(os.listdir(out_dir)) == ['ckpt.pt', 'ckpt_lm_eval.json']


def test_a_full_disk_leaves_the_earlier_results_whole(evaluated, tmp_path_factory):
    out_dir, earlier = evaluated
    site = tmp_path_factory.mktemp('site')  # json.dump of the results runs out of space halfway
    (site / 'sitecustomize.py').write_text(
        "import errno, json\n"
        "dump = json.dump\n"
        "def full(obj, f, **kwargs):\n"
        "    if 'lm_eval.json' not in getattr(f, 'name', ''):\n"
        "        return dump(obj, f, **kwargs)\n"
        "    f.write('{\"results\": ')\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "json.dump = full\n")
    result = eval_cli(out_dir, '--overwrite=True', env={'PYTHONPATH': str(site)})
    one_line_error(result, f"could not write {out_dir / 'ckpt_lm_eval.json'} (No space left on device)")
    assert '|tiny_choice|' in result.stdout  # the scores were printed before
    assert (out_dir / 'ckpt_lm_eval.json').read_bytes() == earlier
    assert sorted(os.listdir(out_dir)) == ['ckpt.pt', 'ckpt_lm_eval.json']  # no temporary file left behind
