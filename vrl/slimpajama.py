"""
SlimPajama, the paper's data, for `python prepare.py --dataset=slimpajama` (which imports this module only
then): domain-weighted, sharded, the paper's tokenizer (or GPT-2's); from local files or the hub.
- Validation: SlimPajama's own split, the hub's or the validation/ folder of a local download, all of it by
  default (~500M tokens: "validation and test sets, 500M tokens each", SlimPajama-627B's dataset card). From
  local files without one, a document is held out when a hash of its text says so, up to the same 500M
  tokens. It is kept domain by domain, in files of its own (val_RedPajamaC4_00000.bin, ...; meta.json's
  val_domains), as the paper scores each domain on its own validation data and reports the unweighted mean
  over the 7; a smaller --val_tokens gives each domain an equal share of it. Training keeps the paper's mix
  (CommonCrawl 0.5, C4 0.2, ...). data.open_val_domains reads them.
- Local SlimPajama: --input is the folder it downloaded to (train/chunk1 ... chunk10/, validation/,
  test/; test/ is not read), or any .jsonl / .jsonl.zst files. The .zst files are read with
  `zstandard` (requirements-data.txt), and in natural order: chunk2 before chunk10. Wherever the
  files are, the result is data/slimpajama_<tokenizer> (neox, or gpt2).
- Speed: SlimPajama is tokenized in --num_proc processes, a file (or a batch of hub records) each,
  while this process takes their documents in stream order, so the output is the same for any
  --num_proc. The last shard takes in a tail under half a shard, so no shard is short.
"""

import collections
import concurrent.futures
import functools
import glob
import hashlib
import importlib.util
import itertools
import math
import multiprocessing
import os
import re

import numpy as np
from tqdm import tqdm

from vrl import datafiles
from vrl.tokenizer import bpe_tokenizer

SLIMPAJAMA_HUB = "cerebras/SlimPajama-627B"
SLIMPAJAMA_LICENSE = ("Apache 2.0 (SlimPajama-627B dataset card); its RedPajama sources keep their own terms "
                      "(Common Crawl, C4, GitHub, Books, ArXiv, Wikipedia, StackExchange)")
# fixed domain weights of the paper's training mix
SLIMPAJAMA_WEIGHTS = {
    "RedPajamaCommonCrawl": 0.5,
    "RedPajamaC4": 0.2,
    "RedPajamaGithub": 0.1,
    "RedPajamaBook": 0.05,
    "RedPajamaArXiv": 0.05,
    "RedPajamaWikipedia": 0.05,
    "RedPajamaStackExchange": 0.05,
}
SLIMPAJAMA_BATCH = 1024  # hub documents handed to a tokenizer process at a time
SLIMPAJAMA_VAL_TOKENS = 500_000_000  # the size of its validation split (see above)


def check_args(args, error):
    """prepare.py's command-line checks that only SlimPajama needs; error(message) ends the script."""
    if args.tokenizer == "char":
        error("--dataset=slimpajama is tokenized with BPE; drop --tokenizer (the paper's, neox) or "
              "use --tokenizer=gpt2")
    missing = [name for name in ("datasets", "zstandard") if importlib.util.find_spec(name) is None]
    # zstandard: the hub's files are .zst too
    if args.input is None and missing:
        error(f"streaming SlimPajama needs Hugging Face `datasets` and `zstandard` "
              f"(pip install datasets; pip install --no-deps -r requirements-data.txt), "
              f"missing: {', '.join(missing)}; or pass local SlimPajama files with --input=PATH")


def prepare_slimpajama(args, out_dir):
    tokenizer = bpe_tokenizer(args.tokenizer, args.tokenizer_file)
    # workers read the tokenizer from the file this process found (in the hub's cache, say)
    tokenize = functools.partial(tokenize_documents,
                                 tokenizer=(args.tokenizer, getattr(tokenizer, "path", None)))
    val_tokens = args.val_tokens
    if args.input:
        train_paths, val_paths = slimpajama_paths(args.input)
        if val_paths:
            train, val = ((functools.partial(encode_file, tokenize=tokenize), paths)
                          for paths in (train_paths, val_paths))
            source, split = os.path.abspath(args.input), "SlimPajama's validation split (validation/)"
        else:  # held out by a hash of the text, so the split does not depend on file order
            train, val = ((functools.partial(encode_file, tokenize=tokenize, held_out=held_out,
                                             val_fraction=args.val_fraction), train_paths)
                          for held_out in (False, True))
            source = os.path.abspath(args.input)
            split = f"documents whose text hash falls in the lowest {args.val_fraction}"
            val_tokens = val_tokens or SLIMPAJAMA_VAL_TOKENS  # not every held-out document of the corpus
    else:
        train, val = ((tokenize, batched(hub_documents(split), SLIMPAJAMA_BATCH))
                      for split in ("train", "validation"))
        source, split = f"{SLIMPAJAMA_HUB} (Hugging Face hub)", "SlimPajama's validation split"

    meta = {"source": source, "license": SLIMPAJAMA_LICENSE, "tokenizer": args.tokenizer,
            "vocab_size": tokenizer.vocab_size, **tokenizer.meta(), "split": split,
            "domain_weights": SLIMPAJAMA_WEIGHTS, "files": {}, "max_token": 0}
    # training: the paper's mix, in one run of shards; validation: all of it, or an equal share per domain, in
    # each domain's own files
    domains = list(SLIMPAJAMA_WEIGHTS)
    train_quotas = {domain: round(weight * args.max_tokens) for domain, weight in SLIMPAJAMA_WEIGHTS.items()}
    val_quotas = dict.fromkeys(domains, math.ceil(val_tokens / len(domains)) if val_tokens else math.inf)
    train_writer = datafiles.ShardWriter(out_dir, "train", args.shard_tokens)
    val_writers = {domain: datafiles.ShardWriter(out_dir, f"val_{domain}", args.shard_tokens)
                   for domain in domains}
    splits = [("train", train, train_quotas, dict.fromkeys(domains, train_writer)),
              ("val", val, val_quotas, val_writers)]
    for name, (work, items), quotas, writers in splits:
        tokens, documents = fill_domain_quotas(work, items, quotas, writers, args.num_proc, desc=name)
        for writer in dict.fromkeys(writers.values()):  # each writer once
            writer.close()
            meta["files"].update(writer.files)
            meta["max_token"] = max(meta["max_token"], writer.max_token)
        if not any(tokens.values()):
            raise SystemExit(f"prepare.py: no {name} documents of SlimPajama's domains in {source}; "
                             f"check --input")
        short = [domain for domain in quotas if tokens[domain] < quotas[domain] < math.inf]
        if short:
            print(f"note: the {name} data ran out before these domains filled their quotas: "
                  f"{', '.join(short)}")
        meta[f"{name}_tokens"] = sum(tokens.values())
        meta[f"{name}_documents"] = sum(documents.values())
        meta[f"{name}_domain_tokens"] = tokens
        meta[f"{name}_domain_documents"] = documents
    meta["val_domains"] = {domain: sorted(writer.files) for domain, writer in val_writers.items()
                           if writer.files}
    missing = [domain for domain in domains if domain not in meta["val_domains"]]
    if missing:
        print(f"note: no validation documents of {', '.join(missing)}: the validation loss is the mean over "
              f"the other domains")
    # every document ends with <|endoftext|>, so each one after it starts a document; starts index the
    # validation files one after another in sorted order (every domain's), as open_split returns them
    val = np.concatenate([np.fromfile(os.path.join(out_dir, name), dtype=np.uint16)
                          for name in sorted(meta["files"]) if name.startswith("val_")])
    meta["val_doc_starts"] = [0] + (np.flatnonzero(val[:-1] == tokenizer.eot_token) + 1).tolist()
    return meta


def fill_domain_quotas(work, items, quotas, writers, num_proc, desc):
    """Write whole documents, each to its domain's writer (writers: {domain: datafiles.ShardWriter}), while
    their domain is under its token quota; stop when all are full.

    work(item, skip) tokenizes the documents of one item (a file, or a batch of hub records); the items are
    worked on ahead, in num_proc processes, but which documents are taken is decided here, in stream order, so
    the result is the same for any num_proc. A domain overshoots its quota by less than one document."""
    tokens = dict.fromkeys(quotas, 0)
    documents = dict.fromkeys(quotas, 0)
    full = {domain for domain in quotas if quotas[domain] <= 0}
    with tqdm(total=sum(quotas.values()), desc=desc, unit="tok", unit_scale=True) as bar:  # inf: no total
        for domains, lengths, ids in in_order(work, items, full, num_proc):
            for domain, end, n in zip(domains, np.cumsum(lengths).tolist(), lengths.tolist()):
                if domain not in full:
                    writers[domain].write(ids[end - n:end])
                    tokens[domain] += n
                    documents[domain] += 1
                    bar.update(n)
                    if tokens[domain] >= quotas[domain]:
                        full.add(domain)
            if len(full) == len(quotas):
                break
    return tokens, documents


def in_order(work, items, full, num_proc):
    """work(item, skip) for each item, in item order, skip being the domains in `full` when the item is handed
    out (full only grows, so what a worker skips would not have been taken). num_proc > 1: worked on in that
    many processes, up to twice as many items ahead of the one awaited."""
    if num_proc == 1:
        yield from (work(item, frozenset(full)) for item in items)
        return
    # spawn: a fresh interpreter per worker, since forking a process that runs threads (tqdm's) can deadlock
    pool = concurrent.futures.ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("spawn"))
    pending = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(work, item, frozenset(full)))
            if len(pending) == 2 * num_proc:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # all quotas full, or a failure: drop the work not started
        pool.shutdown(cancel_futures=True)


def tokenize_documents(documents, skip, tokenizer):
    """(domains, lengths, ids) of the (domain, text) documents of the paper's domains not in skip, each text
    followed by <|endoftext|>: ids holds them all, one after another, as uint16. tokenizer: bpe_tokenizer's
    arguments."""
    tokenizer = bpe_tokenizer(*tokenizer)
    domains, encoded = [], []
    for domain, text in documents:
        if domain in SLIMPAJAMA_WEIGHTS and domain not in skip:
            domains.append(domain)
            encoded.append(np.array(tokenizer.encode_document(text), dtype=np.uint16))
    ids = np.concatenate(encoded) if encoded else np.empty(0, dtype=np.uint16)
    return domains, np.array([len(e) for e in encoded], dtype=np.int64), ids


# SlimPajama from local files (--input=PATH)


def slimpajama_paths(path):
    """(training files, validation files or None) of local SlimPajama: a .jsonl or .jsonl.zst file, a folder
    holding such files at any depth, or the dataset as downloaded, train/chunk1 ... chunk10/ beside
    validation/ (and test/, not read). Sorted with numbers in order: chunk2 before chunk10."""
    train_dir, val_dir = os.path.join(path, "train"), os.path.join(path, "validation")
    if not os.path.isdir(path):
        train, val = [path], None
    elif os.path.isdir(train_dir):
        train, val = jsonl_files(train_dir), jsonl_files(val_dir) if os.path.isdir(val_dir) else None
    else:
        train, val = jsonl_files(path), None
    if any(p.endswith(".zst") for p in train + (val or [])) and importlib.util.find_spec("zstandard") is None:
        raise SystemExit("prepare.py: SlimPajama's .jsonl.zst files are read with `zstandard`; install it "
                         "with `pip install --no-deps -r requirements-data.txt`")
    return train, val


def files_fingerprint(path):
    """[path, size, mtime] of each local SlimPajama file, for prepare.py's reruns: too big to hash on every
    run."""
    train, val = slimpajama_paths(path)
    return [[os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns] for p in train + (val or [])]


def jsonl_files(folder):
    paths = [path for pattern in ("*.jsonl", "*.jsonl.zst")
             for path in glob.glob(os.path.join(folder, "**", pattern), recursive=True)
             if os.path.isfile(path)]
    if not paths:
        raise SystemExit(f"prepare.py: no .jsonl or .jsonl.zst files in {folder}; pass SlimPajama's files, "
                         f"or the folder it downloaded to (the one holding train/)")
    return sorted(paths, key=lambda path: [int(part) if part.isdigit() else part
                                           for part in re.split(r"(\d+)", path)])


def encode_file(path, skip, tokenize, held_out=None, val_fraction=None):
    """tokenize (tokenize_documents) a local SlimPajama file's records: all of them (held_out=None), or those
    whose text hash puts them in validation (True) or in training (False)."""
    records = slimpajama_jsonl(path)
    return tokenize(((record_domain(r, path), r["text"]) for r in records
                     if held_out is None or in_validation(r["text"], val_fraction) == held_out), skip)


def slimpajama_jsonl(path):
    """SlimPajama records ({"text": ..., "meta": {"redpajama_set_name": ...}}) of a local
    .jsonl(.zst) file."""
    if not path.endswith(".zst"):
        yield from datafiles.jsonl_records(path, "text")
        return
    import zstandard  # slimpajama_paths checked that it is installed
    try:
        yield from datafiles.jsonl_records(path, "text")
    except zstandard.ZstdError as e:  # a damaged download
        raise SystemExit(f"prepare.py: {path} is not readable zstd data ({e}); download it again") from None


def record_domain(record, where):
    """The record's SlimPajama domain (meta.redpajama_set_name)."""
    if not isinstance(record.get("meta"), dict) or "redpajama_set_name" not in record["meta"]:
        raise SystemExit(f"prepare.py: {where} has a record without meta.redpajama_set_name; "
                         f"--dataset=slimpajama needs SlimPajama's record format")
    return record["meta"]["redpajama_set_name"]


def in_validation(text, val_fraction):
    """Deterministic hold-out: the first 8 bytes of the text's sha256 as a number in [0, 1)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction

# SlimPajama streamed from the Hugging Face hub


def hub_documents(split):
    """(domain, text) of SlimPajama's records streamed from the Hugging Face hub."""
    import datasets  # optional: parse_args checked that it is installed
    try:
        for record in datasets.load_dataset(SLIMPAJAMA_HUB, split=split, streaming=True):
            if not isinstance(record.get("text"), str):
                raise SystemExit(f"prepare.py: {SLIMPAJAMA_HUB} sent a record without a text field; "
                                 f"pass local SlimPajama files with --input=PATH")
            yield record_domain(record, SLIMPAJAMA_HUB), record["text"]
    except Exception as e:  # at any point of the stream: the network, the hub, the cache, a missing package
        reason = str(e).strip().split("\n")[0][:300]
        # ConnectionError, TimeoutError, ...
        network = "check the network, or " if isinstance(e, OSError) else ""
        raise SystemExit(f"prepare.py: streaming {SLIMPAJAMA_HUB} ({split}) failed: {type(e).__name__}"
                         f"{': ' + reason if reason else ''}; {network}pass local SlimPajama files with "
                         f"--input=PATH") from None


def batched(iterable, n):
    iterator = iter(iterable)
    while batch := list(itertools.islice(iterator, n)):
        yield batch
