"""Hyper-Connections, mHC and MUDDFormer (ablations.py's CONNECTIONS): the checks the paper's variants pass
(test_model.py, tests/test_train.py) run on each, and what each method promises: its init, its constraints,
its parameter count. CPU only, tiny models."""
import pytest
import torch

import test_model
from ablations import AblationConfig, build_model, sinkhorn
from test_model import logits_of, random_tokens, tiny_config, tiny_model
from test_train import (TINY, TWO_PASSES, assert_same_weights, log, records, torchrun, train, train_here,
                        weights, workdir)  # noqa: F401 (workdir: the tiny corpus's fixture)

CASES = {
    'hyper_connections': dict(variant='hyper_connections'),
    'hyper_connections_static_rate_2': dict(variant='hyper_connections', hc_dynamic=False, hc_rate=2),
    'mhc': dict(variant='mhc'),
    'muddformer': dict(variant='muddformer'),
    # beside the value residual and GQA: the streams change, V1 still reaches every layer
    'hc_resformer_gqa': dict(hyper_connections='hc', value_residual=True, n_kv_head=2),
    'mhc_rate_2_resformer': dict(hyper_connections='mhc', hc_rate=2, value_residual=True),
    'muddformer_resformer_gqa': dict(muddformer=True, value_residual=True, n_kv_head=2),
}
# test_model.py's checks of every variant, each run here on CASES: training reaches every parameter, the
# config round-trips, cached decoding (chunks, single tokens, past block_size) equals the full forward,
# kv_bytes_per_token is what a cache holds; and on the three methods (10-30 s each), the compiled decoder
# compiles once, not per token
PAPER_CHECKS = [(case, check) for case in CASES for check in (
    test_model.test_every_variant_trains_and_every_parameter_gets_a_gradient,
    test_model.test_config_round_trips_through_asdict,
    test_model.test_incremental_decoding_matches_full_forward,
    test_model.test_greedy_generate_same_with_and_without_cache,
    test_model.test_kv_bytes_per_token_is_what_a_cache_holds)] + [
    (case, test_model.test_compiled_decoding_compiles_once_not_per_token)
    for case in ('hyper_connections', 'mhc', 'muddformer')]


@pytest.mark.parametrize('case, check', PAPER_CHECKS,
                         ids=[f'{case}-{check.__name__[5:]}' for case, check in PAPER_CHECKS])
def test_the_checks_of_every_variant_hold(case, check, monkeypatch):
    monkeypatch.setitem(test_model.ALL_CASES, case, CASES[case])
    check(case)


@pytest.mark.parametrize('case', CASES)
def test_the_kv_cache_is_the_transformers(case):
    """Each method changes only the inputs of a layer and the stream between layers: a layer caches its
    own K and V as before, so the cache holds what the Transformer's (or ResFormer's) holds."""
    kw = CASES[case]
    plain = dict(variant='resformer_identity' if kw.get('value_residual') else 'vanilla',
                 n_kv_head=kw.get('n_kv_head'))
    assert build_model(tiny_config(**kw)).kv_bytes_per_token() == \
        build_model(tiny_config(**plain)).kv_bytes_per_token()


def transformer_and(eps=1e-30, **kw):
    """The Transformer with sharpened weights and the model of kw on them (its own parameters at their
    init), float64; both with RMSNorm's eps ~0, so that a head reading n equal streams' sum, n times the
    Transformer's stream, normalizes it to the same vector."""
    vanilla = tiny_model(variant='vanilla', norm_eps=eps)
    model = build_model(tiny_config(norm_eps=eps, **kw)).double().eval()
    result = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert result.unexpected_keys == [] and result.missing_keys
    for block in model.blocks[1:]:  # MUDDFormer's norms of the K and V inputs start as the Q input's
        for norm in (getattr(block, 'norm_k', None), getattr(block, 'norm_v', None)):
            if norm is not None:
                norm.load_state_dict(block.norm_attn.state_dict())
    return vanilla, model


@pytest.mark.parametrize('kw', [dict(variant='hyper_connections'),
                                dict(variant='hyper_connections', hc_dynamic=False, hc_rate=3),
                                dict(variant='muddformer'), dict(variant='mhc')], ids=str)
def test_at_init_every_stream_is_the_transformers(kw):
    """HC (static and dynamic, any rate) starts with A_m = e_{k mod n}, A_r = I, B = 1 and MUDDFormer with
    a one-hot on the newest block's output: on the Transformer's weights each computes the Transformer; mHC
    does with its gates α at 0 (H_pre = 1/n, H_post = 1, H_res uniform). Moving a connection changes it."""
    vanilla, model = transformer_and(**kw)
    idx = random_tokens(vanilla)
    if kw['variant'] == 'mhc':
        with torch.no_grad():
            for block in model.blocks:
                block.hc_attn.gates.zero_()
                block.hc_mlp.gates.zero_()
    torch.testing.assert_close(logits_of(model, idx), logits_of(vanilla, idx), rtol=0, atol=1e-10)
    with torch.no_grad():
        if kw['variant'] == 'muddformer':
            model.blocks[1].dense_bias[0] += 0.5          # layer 3's queries read the embedding too
        elif kw['variant'] == 'mhc':
            model.blocks[1].hc_mlp.gates.fill_(1.0)
        else:
            model.blocks[1].hc_mlp.static_alpha[1] += 0.5  # A_r: stream 0 keeps 1.5 times itself
    assert (logits_of(model, idx) - logits_of(vanilla, idx)).abs().max() > 1e-2


def test_dynamic_connections_depend_on_the_token_and_static_ones_do_not():
    """DHC's weights are per token (tanh(norm(H) W) moves them once W trains); SHC's are the same for all."""
    dynamic = tiny_model(variant='hyper_connections')
    connection = dynamic.blocks[1].hc_attn
    streams = torch.randn(2, 5, 4, 32, dtype=torch.float64)
    _, _, beta = connection(streams)
    assert beta.shape == (2, 5, 4) and beta.flatten(0, 1).std(0).min() > 0
    static = tiny_model(variant='hyper_connections', hc_dynamic=False)
    assert static.blocks[1].hc_attn(streams)[2].shape == (4,)


def test_mhc_mappings_are_nonnegative_and_its_mixing_doubly_stochastic():
    """mHC's H_pre in (0, 1), H_post in (0, 2), H_res doubly stochastic, per token: its columns sum to 1
    exactly (Sinkhorn scales them last), its rows to 1 within 1e-5 once the gates have grown 30-fold (at
    100-fold, 20 iterations leave rows 3% off: the approximation mHC-lite, arXiv 2601.05732, points out);
    products over depth stay doubly stochastic."""
    model = tiny_model(variant='mhc')
    connection = model.blocks[2].hc_mlp
    with torch.no_grad():
        connection.gates.fill_(0.3)
    pre, post, res = connection.mappings(5 * torch.randn(2, 7, 4, 32, dtype=torch.float64))
    assert ((0 < pre) & (pre < 1)).all() and ((0 < post) & (post < 2)).all() and (res >= 0).all()
    assert res.flatten(0, 1).std(0).max() > 0.1  # one matrix a token
    ones = torch.ones(2, 7, 4, dtype=torch.float64)
    torch.testing.assert_close(res.sum(-2), ones, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.sum(-1), ones, rtol=0, atol=1e-5)
    product = res[0, 0] @ res[0, 1] @ res[1, 2] @ res[1, 3]
    torch.testing.assert_close(product.sum(0), ones[0, 0], rtol=0, atol=1e-12)
    torch.testing.assert_close(product.sum(1), ones[0, 0], rtol=0, atol=1e-4)
    torch.testing.assert_close(sinkhorn(torch.zeros(3, 3)), torch.full((3, 3), 1 / 3))


@pytest.mark.parametrize('n_layer', [4, 8])
def test_parameter_counts_are_the_docstrings_formulas(n_layer):
    """Extra parameters over the Transformer (C = 32 wide): HC 2L (n² + 2n) static, and C (n + 3) + 2 more
    a layer dynamic; mHC 2L (nC (n² + 2n) + n² + 2n + 3); MUDDFormer C h_n + h_n W_n + W_n a block, W_n =
    ways (n + 1), h_n the hidden width rounded past a multiple of 64, and 2C for the K and V norms."""
    C, L = 32, n_layer
    vanilla = build_model(tiny_config(variant='vanilla', n_layer=L)).num_params()

    def extra(**kw):
        return build_model(tiny_config(n_layer=L, **kw)).num_params() - vanilla

    for n in (2, 4):
        assert extra(variant='hyper_connections', hc_dynamic=False, hc_rate=n) == 2 * L * (n * n + 2 * n)
        assert extra(variant='hyper_connections', hc_rate=n) == 2 * L * (n * n + 2 * n + C * (n + 3) + 2)
        assert extra(variant='mhc', hc_rate=n) == 2 * L * (n * C * (n * n + 2 * n) + n * n + 2 * n + 3)

    def mudd(m):
        ways = 1 if m == L else 4
        W = ways * (m + 1)
        hidden = (W * (4 if m == L else 1) // 64 + 1) * 64
        return C * hidden + hidden * W + W + (2 * C if m > 1 else 0)

    assert extra(variant='muddformer') == sum(mudd(m) for m in range(1, L + 1))


@pytest.mark.parametrize('case', ['hyper_connections', 'mhc', 'muddformer'])
def test_the_training_forward_compiles_whole(case):
    """torch.compile traces the training forward and backward in one graph (fullgraph; the 'eager'
    backend, to check the tracing in seconds): the same loss and gradients as uncompiled."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(tiny_config(**CASES[case]))
    idx = random_tokens(model, T=16)
    compiled = torch.compile(model, backend='eager', fullgraph=True)
    losses, grads = [], []
    for m in (model, compiled):
        model.zero_grad()
        losses.append(m(idx, targets=idx.roll(-1, dims=1)))
        losses[-1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert torch.equal(*losses) and all(map(torch.equal, *grads))
    torch._dynamo.reset()


@pytest.mark.parametrize('case, message', [
    (dict(hyper_connections='bogus'), "hyper_connections='bogus'; use 'none', 'hc' or 'mhc'"),
    (dict(hc_rate=2), "set hyper_connections='hc' or 'mhc'"),
    (dict(hyper_connections='hc', hc_rate=0), 'hc_rate=0 must be a positive int'),
    (dict(variant='mhc', hc_rate=1), 'use hc_rate >= 2 and hc_dynamic=True'),
    (dict(variant='mhc', hc_dynamic=False), 'use hc_rate >= 2 and hc_dynamic=True'),
    (dict(variant='muddformer', denseformer=True), 'muddformer and denseformer each rebuild'),
    (dict(variant='hyper_connections', muddformer=True), 'hyper_connections and muddformer'),
    (dict(variant='hyper_connections', h0_residual=False), 'drop them'),
    (dict(muddformer=True, value_residual=True, residual_type='hidden'), 'drop them'),
    (dict(variant='mhc', value_residual=True), "variant='mhc' sets value_residual=False"),
], ids=str)
def test_bad_settings_are_one_line_errors(case, message):
    with pytest.raises(ValueError) as e:
        AblationConfig(**case)
    assert message in str(e.value) and '\n' not in str(e.value)


# ------------------------------------------------------------------------------------- through train.py

RUNS = {'hyper_connections': ['--variant=hyper_connections', '--hc_rate=2'],
        'hyper_connections_static': ['--variant=hyper_connections', '--hc_dynamic=False'],
        'mhc': ['--variant=mhc'], 'muddformer': ['--variant=muddformer']}


@pytest.mark.parametrize('run', RUNS)
def test_train_py_resumes_exactly(workdir, run):
    """python train.py --variant=NAME: 6 steps straight == 3 steps, stop, resume to 6: the same log record
    for record and the same weights, bit for bit."""
    common = [*RUNS[run], '--max_iters=6', '--eval_interval=3', '--lr_decay_iters=6']
    train(workdir, f'--out_dir=out_{run}_straight', *common)
    train(workdir, f'--out_dir=out_{run}_resumed', *common, '--max_iters=3')
    train(workdir, f'--out_dir=out_{run}_resumed', *common, '--init_from=resume')
    assert records(workdir, f'out_{run}_resumed') == records(workdir, f'out_{run}_straight')
    assert_same_weights(weights(workdir, f'out_{run}_resumed'), weights(workdir, f'out_{run}_straight'))


@pytest.mark.parametrize('run', ['hyper_connections', 'mhc', 'muddformer'])
def test_ddp_matches_single_process(workdir, run):
    """torchrun with 2 CPU ranks (gloo) learns what one process does from the same global batches: every
    connection parameter gets its gradient on every rank (DDP would stop on an unused one)."""
    common = [*TINY, *TWO_PASSES, *RUNS[run], '--max_iters=3', '--eval_interval=3', '--lr_decay_iters=3']
    train_here(workdir, [*common, f'--out_dir=out_{run}_single'])
    result = torchrun(workdir, *common, f'--out_dir=out_{run}_ddp')
    assert 'weights across 2 ranks differ by at most 0' in result.stdout
    single, ddp = (log(workdir, f'out_{run}_{how}', 'train_loss') for how in ('single', 'ddp'))
    assert list(single) == list(ddp) == [1, 2, 3]
    assert all(abs(single[s] - ddp[s]) < 1e-5 for s in single), (single, ddp)
    one, two = (weights(workdir, f'out_{run}_{how}') for how in ('single', 'ddp'))
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, atol=1e-5, rtol=0)
