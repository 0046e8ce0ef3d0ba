"""
Sample from a trained model.

    python sample.py --out_dir=out --start="ROMEO:" --num_samples=3 --max_new_tokens=500
    python sample.py --start=FILE:prompt.txt --temperature=0      # prompt from a file; greedy decoding
    python sample.py --stop="'\\n\\n'"                              # end each sample at its first blank line
    python sample.py --compile=True --max_new_tokens=2000         # torch.compile: slow start, faster tokens

The sample text alone goes to stdout (one sample streams as it is generated; several are drawn as one
batch and printed one after another). The settings overridden, the speed and the size of the KV cache,
next to what a vanilla Transformer of the same shape would need, go to stderr.
"""
import math
import os
import sys
import time
from contextlib import nullcontext

import torch

from configurator import configure
from vrl import cli, hardware, run_folder
from vrl.tokenizer import load_tokenizer

# -----------------------------------------------------------------------------
out_dir = 'out'  # the training run's folder
ckpt = 'ckpt.pt'  # file in out_dir: 'ckpt.pt' (latest) or 'best.pt' (best validation loss)
start = "\n"  # the prompt, or "FILE:prompt.txt"; with GPT-2 BPE an empty prompt starts a new document
num_samples = 1  # samples drawn together as one batch; a single one streams to stdout
max_new_tokens = 500  # tokens generated per sample
temperature = 0.8  # 1.0 = the model's distribution, < 1.0 = more conservative, 0 = greedy
top_k = 200  # sample among the top_k most likely tokens only
stop = ''  # end each sample before this text appears in what it generates ('' = never); EOT always ends one
seed = 1337
device = 'auto'  # 'auto' picks cuda, else cpu (mps only by name); or 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'  # 'auto' = bfloat16 on GPUs that have it, else float16 on CUDA, else float32; or name one
use_cache = True  # decode with the KV cache (False recomputes the whole context for every token)
compile = False  # torch.compile the model: once for the prompt and once for single tokens, not per step
config_keys = [k for k, v in globals().items() if not k.startswith('_')
               and isinstance(v, (bool, int, float, str, tuple, list, type(None)))]
cli.keep_going_without_stdout()  # `python sample.py --help | head` ends quietly
globals().update(configure({k: globals()[k] for k in config_keys}, sys.argv[1:], script=__file__,
                           log_to=sys.stderr))
# -----------------------------------------------------------------------------

if num_samples < 1:
    raise SystemExit(f"sample.py: num_samples={num_samples}; draw at least 1 sample")
if max_new_tokens < 1:
    raise SystemExit(f"sample.py: max_new_tokens={max_new_tokens}; generate at least 1 token")
if not 0 <= temperature < math.inf:
    raise SystemExit(f"sample.py: temperature={temperature}; use 0 for greedy or a positive finite value")
if 0 < temperature < 1e-6:  # dividing the logits by it overflows float32 from about 1e-37 on
    raise SystemExit(f"sample.py: temperature={temperature} is too small to divide the logits by; "
                     "use 0 for greedy decoding, which is what it amounts to, or at least 1e-6")
if top_k < 1:
    raise SystemExit(f"sample.py: top_k={top_k}; keep at least 1 token "
                     f"(a large value such as 50304 keeps all)")
if not 0 <= seed < 2 ** 64:
    raise SystemExit(f"sample.py: seed={seed}; use an integer from 0 to 2**64 - 1")
device = hardware.pick_device(device)
device_type = device.split(':')[0]
dtype = hardware.pick_dtype(dtype, device_type)
torch.manual_seed(seed)
ptdtype = {'bfloat16': torch.bfloat16, 'float16': torch.float16}.get(dtype)
ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=ptdtype)

path = os.path.join(out_dir, ckpt)
model, checkpoint = run_folder.load_checkpoint(path, device)  # GPT, or AblationGPT (ablations.py)
model.eval()
if compile:  # on a CPU a small model's tokens cost mostly per-call overhead: the C++ wrapper removes it
    model.compile(options={'cpp_wrapper': device_type == 'cpu'})
config = model.config
tokenizer = load_tokenizer(checkpoint['data_meta'])  # the training data's tokenizer, offline


# the prompt
if start.startswith('FILE:'):
    try:
        cli.refuse_pipe(start[5:], "sample.py: the prompt file", "save the prompt to a file, or pass "
                            "--start=TEXT")
        with open(start[5:], encoding='utf-8') as f:
            start = f.read()
    except OSError as e:
        raise SystemExit(f"sample.py: cannot read the prompt file {start[5:]} ({e.strerror}); "
                         f"check the path after FILE:")
    except UnicodeDecodeError:
        raise SystemExit(f"sample.py: the prompt file {start[5:]} is not UTF-8 text; "
                         f"convert it to UTF-8") from None
try:
    start_ids = tokenizer.encode(start)
except ValueError as e:  # a character-level vocabulary has only the training text's characters
    raise SystemExit(f"sample.py: the prompt has {e}; use only characters the model was trained on")
if not start_ids:
    if tokenizer.eot_token is None:
        raise SystemExit("sample.py: the prompt is empty and a character-level model has no "
                         "start-of-text token; give at least one character with --start")
    start_ids = [tokenizer.eot_token]  # a new document
if len(start_ids) > config.block_size:
    raise SystemExit(f"sample.py: the prompt is {len(start_ids)} tokens, longer than the model's "
                     f"block_size of {config.block_size}; shorten it")
prompt_text = tokenizer.decode(start_ids)
# the batch's memory, a lower bound checked before it is made: each sample's token ids (8 bytes each), its KV
# cache (up to block_size positions) and one step's logits (fp32)
length = len(start_ids) + max_new_tokens
cache = min(length, config.block_size) * model.kv_bytes_per_token(4 if dtype == 'float32' else 2) * use_cache
hardware.check_fits(num_samples * (8 * length + cache + 4 * config.vocab_size), device,
                   f"sample.py: num_samples={num_samples} samples of {len(start_ids)} + {max_new_tokens} "
                   f"tokens", "draw fewer samples at a time (num_samples) or fewer tokens (max_new_tokens)")
x = torch.tensor([start_ids] * num_samples, dtype=torch.long, device=device)


class Sample:
    """One sample's text, decoded as its tokens arrive, each token once: a token that ends inside a
    multi-byte character (BPE can split one, and a token may end inside the next one too) waits for the
    rest, and only the text's tail is searched for the stop text: the text is the whole sample's decode.
    new() gives the text that is final since it was last called: not a tail that may begin the stop
    text. finish() at the end decodes what still waits, as decoding the whole sample would (U+FFFD)."""

    def __init__(self):
        self.parts, self.pending, self.tail, self.finished, self.given = [], [], '', False, 0

    def add(self, token):
        if token == tokenizer.eot_token:  # end of document
            self.finish()
            return
        self.pending.append(token)
        piece = tokenizer.decode(self.pending)
        if not piece.endswith('\ufffd'):  # else it ends inside a character: wait for the rest
            self.take(piece)

    def finish(self):
        self.finished = True
        if self.pending:
            self.take(tokenizer.decode(self.pending))

    def take(self, piece):
        self.pending, self.tail = [], self.tail + piece
        if stop and stop in self.tail:
            self.tail, self.finished = self.tail[:self.tail.index(stop)], True
        keep = 0 if self.finished else len(stop) - 1  # what the next token may still make the stop text
        self.parts.append(self.tail[:len(self.tail) - keep])
        self.tail = self.tail[len(self.tail) - keep:]

    def new(self):
        text = ''.join(self.parts[self.given:])
        self.given = len(self.parts)
        return text

    def text(self):
        return ''.join(self.parts) + self.tail


# generate, all samples in one batch
samples = [Sample() for _ in range(num_samples)]
streaming = num_samples == 1
if streaming:
    print(prompt_text, end='', flush=True)
steps = 0
kv_cache = model.new_kv_cache(x.size(1) + max_new_tokens) if use_cache else None
t0 = time.time()
with ctx:
    # vocab_size: train.py pads the vocabulary, and those extra ids have no text
    for next_tokens in model.generate_tokens(x, max_new_tokens, temperature, top_k, use_cache, kv_cache,
                                             vocab_size=tokenizer.vocab_size):
        steps += 1
        for sample, token in zip(samples, next_tokens[:, 0].tolist()):
            if not sample.finished:
                sample.add(token)
        if streaming:
            print(samples[0].new(), end='', flush=True)
        if all(sample.finished for sample in samples):
            break
elapsed = time.time() - t0
for sample in samples:  # max_new_tokens reached
    sample.finish()

if streaming:
    print(samples[0].new() + samples[0].tail)
    print('---------------')
else:
    for sample in samples:
        print(prompt_text + sample.text())
        print('---------------')

tokens = steps * num_samples
print(f"generated {tokens:,} tokens ({num_samples} x {steps}) in {elapsed:.2f} s: "
      f"{tokens / elapsed:,.1f} tokens/s on {device}, {dtype}, kv cache {'on' if use_cache else 'off'}, "
      f"compile {compile}", file=sys.stderr)
if use_cache:
    kv_bytes = sum(t.numel() * t.element_size() for t in kv_cache.k + kv_cache.v + [getattr(kv_cache, 'tokens', None)]
                   if t is not None)  # (a bank of values caches token ids: ablations.py's TokenKVCache)
    # a vanilla Transformer caches K and V in every layer, for n_head heads (no GQA, no sharing)
    bytes_per_element = kv_cache.k[0].element_size()
    vanilla_bytes = (2 * config.n_layer * num_samples * config.n_head * kv_cache.max_seq_len
                     * (config.n_embd // config.n_head) * bytes_per_element)
    print(f"kv cache: {kv_bytes:,} bytes (vanilla same shape: {vanilla_bytes:,}; "
          f"{100 * kv_bytes / vanilla_bytes:.1f}%)", file=sys.stderr)
