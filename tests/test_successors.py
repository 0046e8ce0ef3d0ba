"""The value residual's successors (ablations.py's SUCCESSORS): SATFormer, our static-gate control
of it, Attention Residuals, Block AttnRes and Depth-Attention. Each against what it must equal (the Transformer or
ResFormer where its gate or query makes it so, a naive reference written here), cached decoding
against the full forward, train.py's exact resume and 2-rank DDP, and torch.compile. Tiny models on
the CPU, as test_model.py's."""
import math

import pytest
import torch
import torch.nn.functional as F

from ablations import CONNECTIONS, SUCCESSORS, AblationConfig, Carry, build_model
from test_model import logits_of, random_tokens, tiny_config, tiny_model, trainable
from test_train import (TINY, TWO_PASSES, assert_same_weights, log, records, torchrun, train,
                        weights, workdir)  # noqa: F401 (workdir: the fixture)

torch.set_num_threads(1)

# every named successor, and its options: the gates, the last k layers, GQA, blocks of 2 and of 3 of
# 4 layers (the last one partial), GPT-2's blocks, AttnRes over ResFormer's layers, and
# Depth-Attention under GQA
CASES = {name: dict(variant=name) for name in SUCCESSORS} | {
    'satformer_sigmoid_gqa': dict(variant='satformer', value_gate='sigmoid', n_kv_head=2),
    'satformer_tanh_last_2': dict(value_gate='tanh', value_gate_last_k=2),
    'gated_resformer_gqa': dict(variant='gated_resformer', n_kv_head=2),
    'attn_res_block_2': dict(variant='attn_res_block', attn_res_block=2),
    'attn_res_block_3': dict(variant='attn_res_block', attn_res_block=3),
    'attn_res_gpt2': dict(variant='attn_res', backbone='gpt2'),
    'attn_res_resformer_gqa': dict(variant='resformer_identity', attn_res='full', n_kv_head=2),
    'depth_attention_gqa': dict(variant='depth_attention', n_kv_head=2),
}


@pytest.mark.parametrize('case', CASES)
def test_each_trains_and_every_parameter_gets_a_gradient(case):
    """A finite loss near uniform at init, and a finite gradient for every parameter (DDP needs
    them all)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(**CASES[case]))
    idx = random_tokens(model, T=16)
    loss = model(idx, targets=idx.roll(-1, dims=1))
    assert torch.isfinite(loss) and abs(loss.item() - math.log(64)) < 1.0
    loss.backward()
    for name, p in trainable(model):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize('case', CASES)
def test_incremental_decoding_matches_full_forward(case):
    """Chunks of 5, 1, 1, 1 and 4 tokens through the KV cache give the full forward's logits."""
    model = tiny_model(**CASES[case])
    idx = random_tokens(model, T=12)
    cache = model.new_kv_cache(12)
    pieces = [logits_of(model, idx[:, a:b], kv_cache=cache)
              for a, b in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 12)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), logits_of(model, idx), rtol=0, atol=1e-5)


@pytest.mark.parametrize('case', CASES)
def test_greedy_generate_same_with_and_without_cache(case):
    """The same tokens with and without the cache, also past block_size (16), where both crop the
    context."""
    model = tiny_model(**CASES[case])
    idx = random_tokens(model, T=6)
    cached = model.generate(idx, 20, temperature=0, use_cache=True)
    plain = model.generate(idx, 20, temperature=0, use_cache=False)
    assert cached.shape == (2, 26) and torch.equal(cached, plain)


@pytest.mark.parametrize('case', CASES)
def test_kv_cache_is_the_transformers(case):
    """None of them caches more than the Transformer (SATFormer caches its mixed V'_n in V_n's
    place), and kv_bytes_per_token is what a filled cache holds."""
    model = build_model(tiny_config(**CASES[case])).eval()
    cache = model.new_kv_cache(16)
    logits_of(model, random_tokens(model, T=5), kv_cache=cache)
    held = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    assert held == model.kv_bytes_per_token(element_size=4) * 2 * 16
    vanilla = build_model(tiny_config(n_kv_head=model.config.n_kv_head))
    assert model.kv_bytes_per_token() == vanilla.kv_bytes_per_token()


def without(state, word):
    return {k: v for k, v in state.items() if word not in k}


def test_satformer_with_a_closed_gate_is_the_transformer():
    """W_α = 0 closes every ReLU gate: SATFormer then computes the Transformer, bit for bit."""
    model = tiny_model(variant='satformer')
    with torch.no_grad():
        for block in model.blocks[1:]:
            block.attn.value_gate.c_alpha.weight.zero_()
    vanilla = tiny_model(variant='vanilla')
    vanilla.load_state_dict(without(model.state_dict(), 'value_gate'))
    idx = random_tokens(model)
    assert torch.equal(logits_of(model, idx), logits_of(vanilla, idx))


@pytest.mark.parametrize('gate', ['relu', 'sigmoid', 'tanh'])
def test_satformer_values_are_v_n_plus_the_gated_v1(gate):
    """Layer n attends over V_n + gate(W_α h_n) ⊙ V1, h_n its normed input, one α per token and KV
    head (GQA here); layer 1 and, with last_k = 2, layer 2 of 4 take no V1."""
    model = tiny_model(value_gate=gate, value_gate_last_k=2, n_kv_head=2)
    assert [b.attn.value_gate is None for b in model.blocks] == [True, True, False, False]
    stats = {}
    logits_of(model, random_tokens(model), stats=stats)
    v1, hd = stats['values'][0], model.config.n_embd // model.config.n_head
    for n in (2, 3, 4):
        block = model.blocks[n - 1]
        h = block.norm_attn(stats['hidden'][n - 2])  # block n's input is block n-1's output
        v = block.attn.c_v(h).view(*h.shape[:2], 2, hd).transpose(1, 2)
        if n > 2:
            alpha = getattr(torch, gate)(block.attn.value_gate.c_alpha(h))  # (B, T, H_kv)
            v = v + alpha.transpose(1, 2).unsqueeze(-1) * v1
        torch.testing.assert_close(stats['values'][n - 1], v, rtol=0, atol=1e-12)


def test_gated_resformer_starts_as_resformer_with_half_of_v1():
    """The static gate starts at relu(0.5): V_n + 0.5 V1, the value residual with λ = (0.5, 1)."""
    model = tiny_model(variant='gated_resformer')
    with torch.no_grad():
        for block in model.blocks[1:]:
            block.attn.value_gate.beta.fill_(0.5)  # sharpen nudged it
    resformer = tiny_model(value_residual=True, lambdas=[(0, 1)] + [(0.5, 1)] * 3)
    resformer.load_state_dict(without(model.state_dict(), 'value_gate'))
    idx = random_tokens(model)
    torch.testing.assert_close(logits_of(model, idx), logits_of(resformer, idx), rtol=0, atol=1e-12)


def naive_attn_res(model, idx):
    """Attention Residuals from the paper's equations, written from the sublayers' outputs alone:
    sublayer s (the attention of layer (s+1)//2 when s is odd, its MLP when even; s = 2L + 1: the
    final norm) reads softmax_i(w_s · rms(v_i)) over v_0 = the embedding, each completed block's
    summed outputs and the current block's partial sum, P sublayers a block."""
    cfg, B, T = model.config, *idx.shape
    P = 2 if cfg.attn_res == 'block' and not cfg.attn_res_block else 2 * max(cfg.attn_res_block, 1)
    P = 1 if cfg.attn_res == 'full' else P
    emb, outputs = model.wte(idx), []
    carry, rope = Carry(idx, idx, emb, None), (model.rope_cos[:T], model.rope_sin[:T])

    def read(query):
        done = len(outputs) // P
        sources = [emb] + [sum(outputs[j * P:(j + 1) * P]) for j in range(done)]
        if len(outputs) % P:
            sources.append(sum(outputs[done * P:]))
        if query is None:
            assert len(sources) == 1
            return emb
        v = torch.stack(sources)
        keys = F.rms_norm(v, (cfg.n_embd,), eps=cfg.norm_eps)
        w = torch.einsum('d,sbtd->sbt', query, keys).softmax(0)
        return torch.einsum('sbt,sbtd->btd', w, v)

    for n, block in enumerate(model.blocks, start=1):
        query = block.attn_res_attn.query if n > 1 else None
        y, heads = block.attn(block.norm_attn(read(query)), rope, model.lambdas[n - 1], carry, None)
        carry.layers.append(heads)
        outputs.append(y)
        outputs.append(block.mlp(block.norm_mlp(read(block.attn_res_mlp.query))))
    return model.lm_head(model.norm_f(read(model.blocks[-1].attn_res_out.query)))


@pytest.mark.parametrize('case', ['attn_res', 'attn_res_block', 'attn_res_block_2',
                                  'attn_res_block_3'])
def test_attn_res_matches_naive_reference(case):
    """With random pseudo-queries, the model computes the paper's depth attention, its blocks and
    the final norm's read."""
    model = tiny_model(**CASES[case])
    idx = random_tokens(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('.query'):
                p.normal_()
        want = naive_attn_res(model, idx)
    torch.testing.assert_close(logits_of(model, idx), want, rtol=0, atol=1e-10)


def test_attn_res_at_init_averages_its_sources_uniformly():
    """Pseudo-queries start at 0: layer 1's MLP reads the mean of the embedding and its attention's
    output (0.5 each), where the Transformer's residual stream would read their sum."""
    model = tiny_model(variant='attn_res')
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('.query'):
                p.zero_()
    stats = {}
    idx = random_tokens(model)
    logits_of(model, idx, stats=stats)
    block, emb = model.blocks[0], model.wte(idx)
    rope = (model.rope_cos[:12], model.rope_sin[:12])
    carry = Carry(idx, idx, emb, None)
    y = block.attn(block.norm_attn(emb), rope, model.lambdas[0], carry, None)[0]
    torch.testing.assert_close(stats['hidden'][0], (emb + y) / 2, rtol=0, atol=1e-12)


@pytest.mark.parametrize('n_kv_head', [4, 2])
def test_depth_attention_values_match_naive_reference(n_kv_head):
    """Layer n >= 2 attends over V'_n(t) = Σ_{m<=n} softmax_m(q_n(t) · k_m(t) / √d_h) V_m(t), written
    here per position and KV head from each layer's own projections, without RoPE (a dot product at
    one position ignores it), q_n(t) the mean of the KV head's group of queries; layer 1 keeps V_1."""
    model = tiny_model(variant='depth_attention', n_kv_head=n_kv_head)
    idx = random_tokens(model)
    stats = {}
    logits_of(model, idx, stats=stats)
    (B, T), hd = idx.shape, model.config.n_embd // model.config.n_head
    group = model.config.n_head // n_kv_head
    inputs = [model.wte(idx)] + stats['hidden'][:-1]  # block n's input is block n-1's output
    q, k, v = [], [], []
    for block, x in zip(model.blocks, inputs):
        h = block.norm_attn(x)
        q.append(block.attn.c_q(h).view(B, T, n_kv_head, group, hd).mean(dim=3))
        k.append(block.attn.c_k(h).view(B, T, n_kv_head, hd))
        v.append(block.attn.c_v(h).view(B, T, n_kv_head, hd))
    torch.testing.assert_close(stats['values'][0], v[0].transpose(1, 2), rtol=0, atol=0)
    for n in range(2, len(model.blocks) + 1):
        want = torch.empty_like(v[0])
        for b in range(B):
            for t in range(T):
                for g in range(n_kv_head):
                    scores = torch.stack([q[n - 1][b, t, g] @ k[m][b, t, g] for m in range(n)])
                    a = (scores / math.sqrt(hd)).softmax(dim=0)
                    want[b, t, g] = sum(a[m] * v[m][b, t, g] for m in range(n))
        got = stats['values'][n - 1]
        # RoPE's tables carry float32's rounding (cos² + sin² = 1 to 1e-7): 1e-6, not float64's 1e-12
        torch.testing.assert_close(got, want.transpose(1, 2), rtol=0, atol=1e-6)
        assert (got - v[n - 1].transpose(1, 2)).abs().max() > 0.1  # the mixing moved V_n


def test_satformer_takes_another_gate_and_last_k():
    """--variant=satformer --value_gate=tanh --value_gate_last_k=2: SATFormer with those options."""
    config = tiny_config(variant='satformer', value_gate='tanh', value_gate_last_k=2)
    assert (config.value_gate, config.value_gate_last_k) == ('tanh', 2)
    model = build_model(config)
    assert [b.attn.value_gate is not None for b in model.blocks] == [False, False, True, True]


@pytest.mark.parametrize('kw, words', [
    (dict(variant='satformer', value_residual=True), 'value_residual'),
    (dict(value_gate='relu', share_kv='v'), 'share_kv'),
    (dict(value_gate_last_k=2), 'set value_gate'),
    (dict(value_gate='relu', value_gate_last_k=5), 'n_layer=4'),
    (dict(value_gate='gelu'), 'value_gate'),
    (dict(attn_res='full', denseformer=True), 'denseformer'),
    (dict(variant='resformer_identity', attn_res='full', residual_type='hidden'), 'hidden'),
    (dict(variant='resformer_identity', value_gate='relu'), "variant='satformer'"),
    (dict(attn_res='full', attn_res_block=2), "attn_res='block'"),
    (dict(attn_res='block', attn_res_block=-1), 'attn_res_block'),
    (dict(variant='depth_attention', value_residual=True), 'value_residual'),
    (dict(depth_attention=True, share_kv='k'), 'share_kv'),
    (dict(depth_attention=True, value_bank=True), 'value_bank'),
    (dict(depth_attention=True, n_layer=1), 'n_layer >= 2'),
])
def test_bad_successor_settings_are_one_line_value_errors(kw, words):
    with pytest.raises(ValueError) as e:
        AblationConfig(**(dict(n_layer=4, n_head=4, n_embd=32, vocab_size=64) | kw))
    assert '\n' not in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.parametrize('variant', SUCCESSORS)
def test_compiled_training_and_cached_decoding_match_eager(variant):
    """torch.compile traces the training forward and the cached decoder whole (fullgraph; the
    'eager' backend checks the tracing in seconds): the same gradients and greedy tokens as the
    uncompiled model."""
    torch._dynamo.reset()
    model, compiled = tiny_model(variant=variant), tiny_model(variant=variant)
    compiled.compile(backend='eager', fullgraph=True)
    idx = random_tokens(model, T=16)
    for m in (model, compiled):
        m.train()
        m(idx, targets=idx.roll(-1, dims=1)).backward()
        m.eval()
    for (name, p), q in zip(model.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-12, msg=name)
    want = model.generate(idx[:, :5], 4, temperature=0)
    cache = compiled.new_kv_cache(16)
    assert torch.equal(compiled.generate(idx[:, :5], 4, temperature=0, kv_cache=cache), want)
    torch._dynamo.reset()


@pytest.mark.parametrize('variant', SUCCESSORS)
def test_train_py_resumes_exactly_and_ddp_matches_one_process(workdir, variant):
    """python train.py --variant=NAME: 6 steps straight == 3 steps, then resumed to 6 (the same
    log records and weights, bit for bit); torchrun with 2 CPU ranks learns the same losses and
    weights as one process."""
    common = [f'--variant={variant}', '--n_layer=3', *TWO_PASSES, '--eval_interval=3',
              '--lr_decay_iters=6']
    train(workdir, f'--out_dir=out_{variant}', *common, '--max_iters=6')
    train(workdir, f'--out_dir=out_{variant}_resumed', *common, '--max_iters=3')
    train(workdir, f'--out_dir=out_{variant}_resumed', *common, '--max_iters=6',
          '--init_from=resume')
    straight, resumed = f'out_{variant}', f'out_{variant}_resumed'
    assert records(workdir, resumed) == records(workdir, straight)
    assert_same_weights(weights(workdir, resumed), weights(workdir, straight))
    result = torchrun(workdir, *TINY, *common, '--max_iters=6', f'--out_dir=out_{variant}_ddp')
    assert 'weights across 2 ranks differ by at most 0' in result.stdout
    single, ddp = (log(workdir, out, 'train_loss') for out in (straight, f'out_{variant}_ddp'))
    assert list(single) == list(ddp) == list(range(1, 7))
    assert all(abs(single[s] - ddp[s]) < 1e-5 for s in single), (single, ddp)
    ddp_weights = weights(workdir, f'out_{variant}_ddp')
    for name, tensor in weights(workdir, straight).items():
        torch.testing.assert_close(ddp_weights[name], tensor, atol=1e-5, rtol=0)


def test_the_successors_suite_pairs_every_successor_with_the_transformer_at_two_depths():
    """lab/reproduce.py successors: the Transformer, Identity ResFormer and every successor at the
    scale's depth and at 8 layers, each paired with the Transformer of its depth, then a Transformer
    widened to the parameters of each successor that adds more than 1% (at the cpu scale mHC's
    streams and MUDDFormer's mixes do; at the bpe scale the token table dwarfs all but mHC's at 8 layers). CPU scales
    only: building the gpu scale's models, even on the meta device, takes seconds."""
    from lab import reproduce
    assert set(reproduce.SUCCESSORS) == set(SUCCESSORS) | set(CONNECTIONS)
    matched = {}
    for scale in ('cpu', 'bpe'):
        groups = reproduce.suite_groups('successors', scale)
        for depth, _ in reproduce.two_depths(scale):
            big = [v for v in reproduce.SUCCESSORS
                   if reproduce.added_params(scale, depth, dict(variant=v)) > 0.01]
            matched[scale, depth] = big
            widths = [reproduce.matched_ffn(scale, depth, dict(variant=v)) for v in big]
            assert [(label, baseline) for label, _, baseline in groups if label.endswith(f' L{depth}')] \
                == [(f'{v} L{depth}', f'vanilla L{depth}') for v in (
                    'vanilla', 'resformer_identity', *reproduce.SUCCESSORS,
                    *[f'vanilla ffn={w}' for w in widths])]
    assert matched == {('cpu', 4): ['mhc', 'muddformer'], ('cpu', 8): ['mhc', 'muddformer'],
                       ('bpe', 4): [], ('bpe', 8): ['mhc']}
