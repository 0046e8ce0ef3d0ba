"""
Prepared data and the order it is read in. open_dataset is train.py's one call: load_meta, open_split and
open_val_domains check meta.json and the .bin files as they open them (every listed file present at its
recorded size, every validation token id inside the vocabulary); prepare_command names the command that
makes a folder. Batches depend on the seed and the step alone (seeded), so a resumed run and a run on
any number of ranks read the same windows: drawn at random as nanoGPT does, or each once an epoch
(WindowOrder). validation_sets says what each evaluation scores.
"""
import fnmatch
import functools
import json
import math
import os

import numpy as np
import torch

from vrl import cli


META_KEYS = ("tokenizer", "vocab_size", "files", "max_token")  # what readers rely on


# what preparing SlimPajama takes (docs/tools.md: the disk measured, the time projected for a 64-core node)
SLIMPAJAMA_COST = ("about 42 GB of disk and, projected, 12-15 minutes of tokenizing on a 64-core node after "
                   "the download; `python lab/bench.py --node_check --nproc=8` checks a node without it")


class Dataset:
    """What train.py reads: meta (meta.json), train (the training split's token arrays, np.memmap),
    by_domain (whether the validation split is kept by domain: SlimPajama), val and val_full
    (validation_sets'), dir, prepare_command, and places(step, global_batch) (WindowOrder's)."""

    def __init__(self, data_dir, block_size, seed, data_order, steps, global_batch, eval_iters, batch_size,
                 every_window):
        self.dir, self.prepare_command = data_dir, prepare_command(data_dir)
        self.meta = load_meta(data_dir, 'train.py')
        self.train = open_split(data_dir, 'train')
        val_domains = open_val_domains(data_dir)
        self.by_domain = val_domains is not None
        windows = WindowOrder(self.train, block_size, seed, data_dir, data_order, val_domains)
        windows.refuse_a_second_epoch(steps, global_batch, self.meta)
        self.places = windows.places
        self.val, self.val_full = validation_sets(data_dir, val_domains, eval_iters, batch_size,
                                                  block_size, every_window)


def open_dataset(data_dir, block_size, seed, data_order, steps, global_batch, eval_iters, batch_size,
                 every_window):
    """train.py's data, checked (a missing or damaged file stops it with one line naming the prepare.py
    command): the windows of block_size + 1 tokens a step reads, global_batch of them, in the seeded
    order data_order asks for (refused where 'epoch' would read one twice in that many steps), and the
    validation windows each evaluation scores (eval_iters batches of batch_size; every window too where
    every_window, eval_full, asks). See Dataset for what it holds."""
    return Dataset(data_dir, block_size, seed, data_order, steps, global_batch, eval_iters, batch_size,
                   every_window)


def load_meta(data_dir, script="prepare.py"):
    """meta.json of a folder prepare.py finished, checked to be whole and consistent. script: who says a
    missing folder is missing (train.py says what preparing SlimPajama takes)."""
    path = os.path.join(data_dir, "meta.json")
    if os.path.isdir(data_dir) and not os.access(data_dir, os.R_OK | os.X_OK):
        raise SystemExit(f"{script}: the data folder {data_dir} is unreadable (permission denied); "
                         "check its permissions")
    if not os.path.exists(path):
        cost = f" ({SLIMPAJAMA_COST})" if "slimpajama" in prepare_command(data_dir) else ""
        raise SystemExit(f"{script}: {path} not found; prepare the data first with "
                         f"`{prepare_command(data_dir)}`{cost}")
    cli.refuse_pipe(path, "prepare.py:", f"run `{prepare_command(data_dir)}` again")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise SystemExit(f"prepare.py: {path} is unreadable ({type(e).__name__}); "
                         f"run `{prepare_command(data_dir)}` again") from None
    missing = [key for key in META_KEYS if key not in meta] if isinstance(meta, dict) else list(META_KEYS)
    if missing:
        raise SystemExit(f"prepare.py: {path} has no {', '.join(missing)} (damaged, or from an older "
                         f"prepare.py); run `{prepare_command(data_dir)}` again")
    counts = [meta["vocab_size"], meta["max_token"], *meta["files"].values()] \
        if isinstance(meta["files"], dict) else []
    if not counts or not all(isinstance(n, int) and n >= 0 for n in counts):
        raise SystemExit(f"prepare.py: {path} has malformed vocab_size, max_token or files; "
                         f"run `{prepare_command(data_dir)}` again")
    if meta["max_token"] >= meta["vocab_size"]:
        raise SystemExit(f"prepare.py: {path} records token id {meta['max_token']} in a vocabulary of "
                         f"{meta['vocab_size']}; run `{prepare_command(data_dir)}` again")
    if meta["tokenizer"] == "char" and len(meta.get("chars", "")) != meta["vocab_size"]:
        raise SystemExit(f"prepare.py: {path} lists {len(meta.get('chars', ''))} characters for a "
                         f"vocabulary of {meta['vocab_size']} (damaged); run `{prepare_command(data_dir)}` "
                         "again")
    return meta


def open_split(data_dir, split):
    """The token arrays of a split ('train' or 'val'): {split}.bin, or shards {split}_00000.bin, ...,
    each checked against meta.json (see this section's heading). For SlimPajama's 'val' that is every
    domain's files; open_val_domains gives them domain by domain."""
    meta = load_meta(data_dir)
    names = sorted(name for name in meta["files"] if fnmatch.fnmatch(name, f"{split}*.bin"))
    return open_files(data_dir, meta, names, split)


def open_val_domains(data_dir):
    """{domain: token arrays} of a folder whose validation split is kept domain by domain (SlimPajama:
    meta.json's "val_domains" maps each domain to its files val_<domain>_00000.bin, ...), so each domain is
    scored on its own, as the paper does; None for a single corpus (Shakespeare, --input text)."""
    meta = load_meta(data_dir)
    if "val_domains" not in meta:
        return None
    return {domain: open_files(data_dir, meta, sorted(names), "val")
            for domain, names in sorted(meta["val_domains"].items())}


def open_files(data_dir, meta, names, split):
    again = f"run `{prepare_command(data_dir)}` again"
    if not names:
        raise SystemExit(f"prepare.py: {os.path.join(data_dir, 'meta.json')} lists no {split} files; {again}")
    arrays = []
    for name in names:
        path = os.path.join(data_dir, name)
        if name not in meta["files"]:
            raise SystemExit(f"prepare.py: meta.json in {data_dir} lists {name} under val_domains but not "
                             f"under files; {again}")
        if os.path.exists(path) and not os.path.isfile(path):
            raise SystemExit(f"prepare.py: {path} is not a regular file (a folder, a pipe or a device); "
                             f"{again}")
        if not os.path.isfile(path):
            raise SystemExit(f"prepare.py: {path} not found; {again}")
        size, expected = os.path.getsize(path), 2 * meta["files"][name]
        if size == 0:
            raise SystemExit(f"prepare.py: {path} is empty; {again}")
        if size % 2:
            raise SystemExit(f"prepare.py: {path} has an odd number of bytes ({size:,}), so it is not uint16 "
                             f"token ids; {again}")
        if size != expected:
            raise SystemExit(f"prepare.py: {path} holds {size // 2:,} tokens, meta.json says "
                             f"{expected // 2:,}; {again}")
        try:
            arrays.append(np.memmap(path, dtype=np.uint16, mode="r"))
        except OSError as e:  # no read permission, an I/O error
            raise SystemExit(f"prepare.py: {path} is unreadable ({e.strerror or e}); check its "
                             f"permissions, or {again}") from None
    if split == "val":  # small enough to scan every token
        largest = max(int(array.max()) for array in arrays)
        if largest >= meta["vocab_size"]:
            raise SystemExit(f"prepare.py: the {split} data in {data_dir} holds token id {largest}, "
                             f"outside the vocabulary of {meta['vocab_size']}; {again}")
        # uint32 token ids below 65,536 read as uint16 are pairs (id, 0): every odd place a 0, which
        # prepare.py's uint16 text never makes (meta.json's counts may have been edited to match)
        if any(len(array) >= 64 and not array[1::2].any() and array[::2].any() for array in arrays):
            raise SystemExit(f"prepare.py: the {split} data in {data_dir} has token id 0 at every odd "
                             f"place, as uint32 (or wider) token ids read as prepare.py's uint16 do; "
                             f"{again}")
    return arrays


def prepare_command(data_dir):
    """The command that makes data_dir, for error messages."""
    name = os.path.basename(os.path.normpath(data_dir))
    known = {"shakespeare_char": "python prepare.py",
             "shakespeare_gpt2": "python prepare.py --tokenizer=gpt2",
             "slimpajama_neox": "python prepare.py --dataset=slimpajama",
             "slimpajama_gpt2": "python prepare.py --dataset=slimpajama --tokenizer=gpt2"}
    if name in known:
        return known[name]
    tokenizer = next((f" --tokenizer={t}" for t in ("gpt2", "neox") if name.endswith(f"_{t}")), "")
    return f"python prepare.py --input=YOUR_CORPUS{tokenizer} --out_dir={data_dir}"


def seeded(seed, *keys):
    """A seed derived from `seed` and integer keys: batches and dropout depend on the step alone, not on RNG
    state carried across steps, so a resumed run and a run on any number of ranks draw the same ones."""
    return hash((seed, *keys)) & (2 ** 63 - 1)  # int tuples hash identically in every process


def window_starts(shard, block_size):
    """Where a shard's windows of block_size + 1 tokens that share no target start: every block_size tokens,
    each overlapping the next by the token that is its last target and the next one's first input, so every
    token but a shard's first is a target once. (The paper's 2,048-token chunks share no token.)"""
    return range(0, len(shard) - block_size, block_size)


def windows_of(shards, block_size):
    return [(s, i) for s, shard in enumerate(shards) for i in window_starts(shard, block_size)]


class WindowOrder:
    """Where each step's global batch of training windows lies, as (shard, start) pairs, from the seed and
    the step alone. order 'random': drawn with replacement, each shard as often as its room (nanoGPT's);
    'epoch': every window once, in a seeded random order (the paper's one epoch, ICLR Sec. 4.1.2);
    'epochs': a new order each epoch. Checks first that each training shard holds a window."""

    def __init__(self, shards, block_size, seed, data_dir, data_order, val_domains):
        if any(len(shard) <= block_size + 1 for shard in shards):
            raise SystemExit(f"train.py: a training shard in {data_dir} holds no more than "
                             f"block_size + 1 = {block_size + 1} tokens; lower block_size")
        self.block_size, self.seed, self.data_dir = block_size, seed, data_dir
        self.data_order, self.by_domain = data_order, val_domains is not None
        # 'auto': the paper's one epoch on data kept by domain (SlimPajama), nanoGPT's draw elsewhere
        self.kind = data_order if data_order != 'auto' else 'epoch' if self.by_domain else 'random'
        self.room = torch.tensor([len(shard) - block_size - 1 for shard in shards], dtype=torch.float64)
        # the windows numbered shard after shard: shard s holds numbers first_window[s] onwards
        self.first_window = np.cumsum([0] + [len(window_starts(shard, block_size)) for shard in shards])
        self.windows = int(self.first_window[-1])
        self.order = functools.lru_cache(maxsize=2)(self.order)  # the epoch at hand, and the next one

    def order(self, epoch):
        """A seeded random order of the windows: 9.8M numbers, 78 MB, at 20B tokens."""
        generator = torch.Generator().manual_seed(seeded(self.seed, -1, epoch))  # steps are never -1
        return torch.randperm(self.windows, generator=generator).numpy()

    def places(self, step, global_batch):
        """(shard, start) of the windows of the step's global batch."""
        if self.kind == 'random':
            generator = torch.Generator().manual_seed(seeded(self.seed, step))
            which = torch.multinomial(self.room, global_batch, replacement=True, generator=generator)
            starts = (torch.rand(global_batch, generator=generator, dtype=torch.float64) * self.room[which])
            return list(zip(which.tolist(), starts.long().tolist()))
        epochs, index = np.divmod(np.arange(step * global_batch, (step + 1) * global_batch), self.windows)
        number = np.array([self.order(epoch)[i] for epoch, i in zip(epochs.tolist(), index.tolist())])
        shard = np.searchsorted(self.first_window, number, side='right') - 1
        return list(zip(shard.tolist(), ((number - self.first_window[shard]) * self.block_size).tolist()))

    def refuse_a_second_epoch(self, max_iters, global_batch, data_meta):
        """data_order='epoch' reads each window once at most: a run that reads more stops here, naming the
        prepare.py command that makes enough (SlimPajama) or the fix."""
        if self.kind != 'epoch' or max_iters * global_batch <= self.windows:
            return
        needed = max_iters * global_batch * self.block_size
        # 0.1% to spare (a shard's last, partial window is none), rounded up to 3 digits: 21e9 for 10k steps
        unit = 10 ** max(int(math.log10(needed)) - 2, 0)
        enough = math.ceil(needed * 1.001 / unit) * unit
        more = (f"`python prepare.py --dataset=slimpajama --tokenizer={data_meta['tokenizer']} "
                f"--max_tokens={enough:_} --out_dir={self.data_dir}`" if self.by_domain else "more text")
        raise SystemExit(f"train.py: {max_iters} steps of {global_batch} windows read "
                         f"{max_iters * global_batch:,} windows of {self.block_size} tokens "
                         f"({needed:,} tokens), but the training split of {self.data_dir} holds "
                         f"{self.windows:,}, each read once (data_order={self.data_order!r}); prepare enough with "
                         f"{more}, or allow repeats with --data_order=epochs")


def validation_sets(data_dir, val_domains, eval_iters, batch_size, block_size, every_window=False):
    """(val_sets, full_val_sets), each {name: (shards, windows)}. val_sets, what every evaluation scores: the
    validation split's eval_iters x batch_size windows, evenly spaced; or, where the data keeps it by domain
    (SlimPajama), each domain's, as the paper scores them, sharing as many equally in whole batches (so
    training's micro-batches divide them). full_val_sets: every window of every domain, which the last
    evaluation of a run also scores, as the paper reports (ICLR A.6; the official src/training_args.py's
    max_eval_samples=None); for a single corpus none, unless every_window (eval_full) asks for its
    every window (so Shakespeare's runs, and their results, stay as they were)."""
    def sample(shards, places, count, what):
        if not places:
            raise SystemExit(f"train.py: {what} holds no window of block_size + 1 = {block_size + 1} tokens; "
                             "lower block_size")
        if len(places) < count:
            raise SystemExit(f"train.py: {what} has {len(places)} windows of {block_size} tokens, fewer than "
                             f"the {count} evaluation takes; lower eval_iters or batch_size")
        return shards, [places[round(k * (len(places) - 1) / max(count - 1, 1))] for k in range(count)]

    if val_domains is None:
        val_split = open_split(data_dir, 'val')
        places = windows_of(val_split, block_size)
        val_sets = {'val': sample(val_split, places, eval_iters * batch_size, 'the validation split')}
        return val_sets, ({'val': (val_split, places)} if every_window else {})
    share = -(-eval_iters // len(val_domains)) * batch_size
    full_val_sets = {name: (shards, windows_of(shards, block_size)) for name, shards in val_domains.items()}
    return ({name: sample(shards, places, share, f"the validation split of domain {name}")
             for name, (shards, places) in full_val_sets.items()}, full_val_sets)
