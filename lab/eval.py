"""
Zero-shot downstream evaluation of a checkpoint with EleutherAI's lm-evaluation-harness (lm_eval 0.4.x).

    pip install -r lab/requirements-eval.txt
    python lab/eval.py --out_dir=out                        # the paper's tasks (data from the Hugging Face hub)
    python lab/eval.py --out_dir=out --tasks=wikitext       # WikiText word perplexity alone
    python lab/eval.py --out_dir=out --tasks=tiny_choice    # a local task shipped in lab/eval_tasks/ (offline)
    python lab/eval.py --out_dir=out --limit=100            # quick check: the first 100 items of each task

The default tasks are the paper's: the six zero-shot accuracy tasks of its Table 1 (ICLR 2025 text, Sec. 4.4;
arXiv v1 Table 1), whose "Avg" is their unweighted mean, and WikiText, whose word perplexity only the latest
version reports (its 468M table, known second-hand) and which stays out of the mean. The text names no
metric, but Table 1's numbers do: its OpenBookQA scores, 0.136-0.148, lie below the 0.25 of a four-way
guess, where only plain acc puts models this small (acc_norm, which lm_eval 0.4 scores per character of
the answer, puts them near or above chance; per byte is acc_bytes). So eval.py's headline is the mean of
plain acc, the paper's; beside it, the mean of acc_norm (acc where a task has none: WinoGrande),
TinyLlama's convention (the paper follows its task list).

Run it from the repository root: local tasks name their data files relative to it. It prints lm_eval's
table and the means, and writes the full results (the means under "accuracy_mean") to
out_dir/<ckpt name>_lm_eval.json, next to the checkpoint; results an earlier evaluation left there are
replaced only with --overwrite=True.
`ValueResidualLM` is registered with lm_eval as 'value_residual', so lm_eval's own Python API can use it too:
lm_eval.simple_evaluate(model='value_residual', model_args={'checkpoint': 'out/ckpt.pt'}, tasks=[...]).
"""
import json
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from configurator import configure

# the paper's zero-shot accuracy tasks, as lm_eval names them, in its Table 1's order
PAPER_TASKS = 'hellaswag,openbookqa,winogrande,arc_easy,arc_challenge,piqa'
PERPLEXITY_TASKS = 'wikitext'  # reported beside the mean, never in it
LOCAL_TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'eval_tasks')

# -----------------------------------------------------------------------------
out_dir = 'out'  # the training run's folder
ckpt = 'ckpt.pt'  # file in out_dir: 'ckpt.pt' (latest) or 'best.pt' (best validation loss)
tasks = f'{PAPER_TASKS},{PERPLEXITY_TASKS}'  # comma-separated lm_eval task names; tiny_choice runs offline
include_path = LOCAL_TASKS_DIR  # a folder of extra lm_eval task YAML files (lab/eval_tasks/ holds tiny_choice)
limit = None  # lm_eval's --limit: at most this many items per task (a float < 1 is a fraction); None = all
num_fewshot = 0  # the paper reports zero-shot accuracy
batch_size = 32  # token windows per forward pass
max_gen_toks = 256  # tokens generated per request by generative tasks, unless the task sets it
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name); or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' = bfloat16 on GPUs that have it, else float16 on CUDA, else float32; or name one
seed = 1234  # lm_eval's seeds (few-shot sampling, sampled generation)
overwrite = False  # replace the results an earlier evaluation of this checkpoint left in out_dir
config_keys = [k for k, v in globals().items() if not k.startswith('_') and k.islower()
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
# settings and their checks before lm_eval and torch load: --help works without them
if __name__ == '__main__':
    globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], script=__file__))
    task_names = [t.strip() for t in tasks.split(',') if t.strip()]
    if not task_names:
        raise SystemExit("eval.py: --tasks is empty; name at least one lm_eval task, e.g. --tasks=arc_easy")
    if limit is not None and not (type(limit) in (int, float) and 0 < limit < math.inf):
        raise SystemExit(f"eval.py: limit={limit!r}; use a positive number of items (or a fraction below 1)")
    if num_fewshot < 0:
        raise SystemExit(f"eval.py: num_fewshot={num_fewshot}; "
                         f"use 0 (zero-shot, as the paper) or more examples")
    if batch_size < 1:
        raise SystemExit(f"eval.py: batch_size={batch_size}; use at least 1")
    results_path = os.path.join(out_dir, f'{os.path.splitext(ckpt)[0]}_lm_eval.json')
    if os.path.exists(results_path) and not overwrite:
        raise SystemExit(f"eval.py: {results_path} holds an earlier evaluation's results; move it away to "
                         "keep them, or pass --overwrite=True to replace them")
# -----------------------------------------------------------------------------

try:  # after the settings, so --help works without lm_eval; before torch, so its absence shows at once
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import (get_rolling_token_windows, handle_non_serializable, make_disjoint_window,
                               make_table)
except ImportError:
    raise SystemExit("eval.py: lm_eval is not installed; "
                     "run `pip install -r lab/requirements-eval.txt`") from None

import torch
import torch.nn.functional as F
from tqdm import tqdm

from vrl import hardware, run_folder
from vrl.tokenizer import CHAR_SEPARATOR, load_tokenizer


@register_model('value_residual')
class ValueResidualLM(TemplateLM):
    """A checkpoint written by train.py, any variant, as an lm_eval language model. Text is tokenized with
    the training data's tokenizer; log-probabilities are normalised over its real vocabulary (train.py pads
    the embedding with ids that have no text). Contexts longer than block_size lose tokens on the left, as
    in lm_eval's Hugging Face wrapper."""

    def __init__(self, checkpoint, device='auto', dtype='auto', batch_size=32, max_batch_size=None,
                 max_gen_toks=256):
        # max_batch_size: simple_evaluate hands it to every model; batches here are always batch_size
        super().__init__()
        device = hardware.pick_device(device)
        device_type = device.split(':')[0]
        dtype = hardware.pick_dtype(dtype, device_type)
        self.model, ckpt = run_folder.load_checkpoint(checkpoint, device)
        self.model.eval()
        self.tokenizer = load_tokenizer(ckpt['data_meta'])
        self.vocab_size = self.tokenizer.vocab_size
        self.max_length = self.model.config.block_size
        self.batch_size = int(batch_size)  # lm_eval hands it over as text from --model_args
        self.max_gen_toks = int(max_gen_toks)
        self._device = torch.device(device)
        self.autocast = nullcontext() if dtype == 'float32' else \
            torch.autocast(device_type=device_type,
                           dtype={'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype])

    @property
    def eot_token_id(self):
        # GPT-2 BPE ends every training document with <|endoftext|>; character-level data ends one with a
        # blank line, so its last newline is what precedes a new document
        eot = self.tokenizer.eot_token
        return eot if eot is not None else self.tok_encode(CHAR_SEPARATOR[-1])[0]

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        try:
            return self.tokenizer.encode(string)
        except ValueError as e:  # a character-level vocabulary has only the training text's characters
            raise SystemExit(f"eval.py: the task's text has {e}; "
                             f"evaluate a GPT-2 BPE checkpoint on this task") from None

    def tok_decode(self, tokens):
        return self.tokenizer.decode(tokens)

    @torch.no_grad()
    def _logits(self, windows):
        """The model's logits for a batch of token lists, (B, longest, padded vocab), right-padded: the model
        is causal, so padding after a window never changes the window's logits."""
        longest = max(len(w) for w in windows)
        x = torch.tensor([w + [0] * (longest - len(w)) for w in windows], device=self._device)
        with self.autocast:
            return self.model(x)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, desc='loglikelihood requests'):
        """(log P(continuation | context), whether greedy decoding gives the continuation)
        per (key, context, continuation)."""
        results = [None] * len(requests)
        # longest first, so each batch pads little and running out of memory happens at once, not at the end
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        progress = tqdm(total=len(requests), desc=desc, disable=disable_tqdm)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            # the last block_size + 1 tokens; the model reads all but the last and predicts all but the first
            tokens = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):] for i in batch]
            # the positions that predict each continuation, and their targets, for the whole batch at once:
            # one copy to the device and one back, not one each per request
            rows, positions, targets = [], [], []
            for row, (i, t) in enumerate(zip(batch, tokens)):
                continuation = requests[i][2]
                n = len(continuation)
                if n >= len(t):
                    raise SystemExit(f"eval.py: a continuation of {n} tokens does not fit the model's "
                                     f"block_size of {self.max_length}; "
                                     f"evaluate on a task with shorter answers")
                rows += [row] * n
                positions += range(len(t) - 1 - n, len(t) - 1)
                targets += continuation
            logits = self._logits([t[:-1] for t in tokens])
            index = torch.tensor([rows, positions, targets], device=logits.device)
            # in float32, over the tokenizer's real vocabulary
            log_probs = F.log_softmax(logits[index[0], index[1], :self.vocab_size].float(), dim=-1)
            chosen = log_probs.gather(1, index[2][:, None])[:, 0]
            greedy = log_probs.argmax(1) == index[2]
            chosen, greedy = chosen.tolist(), greedy.tolist()
            start_of = 0
            for i in batch:
                key, n = requests[i][0], len(requests[i][2])
                results[i] = (sum(chosen[start_of:start_of + n]), all(greedy[start_of:start_of + n]))
                start_of += n
                if key is not None:
                    self.cache_hook.add_partial('loglikelihood', key, results[i])
            progress.update(len(batch))
        progress.close()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Log-likelihood of each whole text, read in windows of block_size tokens (lm_eval's perplexity
        scheme: every token predicted once, the first one from eot_token_id)."""
        windows, owners = [], []
        for n, (text,) in enumerate(req.args for req in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(n)
        totals = [0.0] * len(requests)
        for n, (log_prob, _) in zip(owners,
                                    self._loglikelihood_tokens(windows, disable_tqdm, 'rolling windows')):
            totals[n] += log_prob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial('loglikelihood_rolling', req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy (or, with do_sample, sampled) continuations decoded with the KV cache, cut before the first
        `until` string; the end-of-text token always stops one."""
        results = [None] * len(requests)
        # the model has no padding mask, so a batch holds contexts of one length (and one set of gen_kwargs)
        groups = {}
        for i, (context, gen_kwargs) in enumerate(req.args for req in requests):
            ids = self.tok_encode(context)[-self.max_length:] or [self.prefix_token_id]
            groups.setdefault((len(ids), json.dumps(gen_kwargs, sort_keys=True)), []).append((i, ids))
        progress = tqdm(total=len(requests), desc='generate_until requests', disable=disable_tqdm)
        for (_, kwargs_json), members in groups.items():
            gen_kwargs = json.loads(kwargs_json)
            until = gen_kwargs.get('until', [])
            until = [until] if isinstance(until, str) else until
            max_new_tokens = gen_kwargs.get('max_gen_toks', self.max_gen_toks)
            temperature = gen_kwargs.get('temperature', 1.0) if gen_kwargs.get('do_sample', False) else 0.0
            for start in range(0, len(members), self.batch_size):
                batch = members[start:start + self.batch_size]
                texts = self._generate([ids for _, ids in batch], until, max_new_tokens, temperature)
                for (i, _), text in zip(batch, texts):
                    results[i] = text
                    self.cache_hook.add_partial('generate_until', requests[i].args, text)
                progress.update(len(batch))
        progress.close()
        return results

    @torch.no_grad()
    def _generate(self, contexts, until, max_new_tokens, temperature):
        """Continuations of equally long token lists,
        each cut before its first `until` string or end of text."""
        x = torch.tensor(contexts, device=self._device)
        generated = [[] for _ in contexts]
        texts = [''] * len(contexts)
        finished = [False] * len(contexts)
        with self.autocast:
            for next_tokens in self.model.generate_tokens(x, max_new_tokens, temperature, use_cache=True,
                                                          vocab_size=self.vocab_size):
                for row, token in enumerate(next_tokens[:, 0].tolist()):
                    if finished[row]:
                        continue
                    if token == self.tokenizer.eot_token:
                        finished[row] = True
                        continue
                    generated[row].append(token)
                    texts[row] = self.tok_decode(generated[row])
                    stops = [texts[row].index(s) for s in until if s and s in texts[row]]
                    if stops:
                        texts[row] = texts[row][:min(stops)]
                        finished[row] = True
                if all(finished):
                    break
        return texts


def task_manager_for(tasks, include_path):
    """lm_eval's task index. Indexing its ~14,000 built-in tasks takes tens of seconds, so it is skipped when
    every task asked for is a local one."""
    local = TaskManager(include_path=include_path, include_defaults=False)
    if all(task in local.all_tasks for task in tasks):
        return local
    manager = TaskManager(include_path=include_path)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise SystemExit(f"eval.py: lm_eval has no task {', '.join(map(repr, unknown))}; "
                         f"list its tasks with `lm_eval ls tasks`, or add a YAML file to {include_path}")
    return manager


def evaluate(lm, tasks, include_path=LOCAL_TASKS_DIR, limit=None, num_fewshot=None, log_samples=False,
             seed=1234):
    """lm_eval.simple_evaluate on task names;
    data that cannot be loaded (offline, say) exits with one line."""
    task_manager = task_manager_for(tasks, include_path)
    try:
        return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager, limit=limit,
                                       num_fewshot=num_fewshot, log_samples=log_samples, random_seed=seed,
                                       numpy_random_seed=seed, torch_random_seed=seed,
                                       fewshot_random_seed=seed)
    # ConnectionError too: the hub is unreachable or offline mode is on; or a local file is missing
    except OSError as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SystemExit(f"eval.py: could not load a task's data ({reason}); the paper's tasks download it "
                         f"from the Hugging Face hub, so they need the network (and HF_DATASETS_OFFLINE "
                         f"unset); local tasks name their files relative to the repository root, so run "
                         f"eval.py from there") from None


def accuracy_means(results, tasks):
    """Unweighted means over those of `tasks` that report accuracy (perplexity tasks stay out): of plain
    acc, the paper's "Avg" (the module's docstring says why), and of acc_norm, or acc where a task has no
    acc_norm. None if no task reports accuracy."""
    scores = [results['results'][task] for task in tasks if 'acc,none' in results['results'].get(task, {})]
    if not scores:
        return None
    return {'tasks': [task for task in tasks if 'acc,none' in results['results'].get(task, {})],
            'acc': sum(m['acc,none'] for m in scores) / len(scores),
            'acc_norm_else_acc': sum(m.get('acc_norm,none', m['acc,none']) for m in scores) / len(scores)}


if __name__ == '__main__':
    path = os.path.join(out_dir, ckpt)
    lm = ValueResidualLM(path, device=device, dtype=dtype, batch_size=batch_size, max_gen_toks=max_gen_toks)
    results = evaluate(lm, task_names, include_path, limit, num_fewshot, seed=seed)
    results['config'].update(checkpoint=path, model_args=asdict(lm.model.config))  # what was evaluated
    print(make_table(results))
    if 'groups' in results:
        print(make_table(results, 'groups'))
    results['accuracy_mean'] = means = accuracy_means(results, task_names)
    if means:
        print(f"mean accuracy over {', '.join(means['tasks'])}: {means['acc']:.4f} (acc, the paper's), "
              f"{means['acc_norm_else_acc']:.4f} (acc_norm; acc where a task has no acc_norm)")
    try:  # whole or not at all: a full disk leaves an earlier file as it was
        with open(results_path + '.tmp', 'w') as f:
            json.dump(results, f, indent=2, default=handle_non_serializable)
        os.replace(results_path + '.tmp', results_path)
    except OSError as e:
        if os.path.exists(results_path + '.tmp'):
            os.remove(results_path + '.tmp')
        raise SystemExit(f"eval.py: could not write {results_path} ({e.strerror}); "
                         f"the table above has the scores")
    print(f"results written to {results_path}")
