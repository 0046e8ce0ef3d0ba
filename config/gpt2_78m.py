# ICLR Sec. 4.7, Fig. 15c (sources: docs/experiments.md): SVFormer against the Transformer on GPT-2's blocks
# instead of Llama's, at the official GPT-2 78M's shape (code: scripts/run_gpt2_baseline_78M.sh, Hugging Face's
# GPT-2 with the script's overrides): 8 layers, 8 heads, d 512, a GELU (tanh) MLP of 2048 = 4d, LayerNorm with
# biases, biased projections, 2048 learned positions instead of RoPE, an untied LM head. backbone='gpt2' builds
# these blocks (ablations.py), initialised as Hugging Face's GPT-2: N(0, 0.02), the residual projections
# N(0, 0.02 / sqrt(2 x 8)), biases 0. 77.8M parameters with our vocabulary padded to 50,304 (77.75M at the
# code's 50,277). Recipe: paper_recipe.py's, which is also the script's (1024 x 2048 tokens a step, 10,000
# steps, 6e-4 -> 6e-5, warmup 120, AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0, bf16).
# Dropout: the official run leaves Hugging Face's GPT-2 default, 0.1 on the residual branches, the embedding
# and the attention probabilities, on: the script never sets them, while its Llama scripts set 0 and the paper
# says it trains without dropout. We keep dropout 0, as every other config (ours). --dropout=0.1 comes close to
# the official run: ours drops the token embedding before the positions are added, GPT-2 the sum.
# Paper (curves only): "Llama-like models and GPT2-like models exhibit similar critical points and final
# losses" (Fig. 15c; legend "Llama 82M, GPT2 78M"). The code has no GPT-2 SVFormer: ours shares V1 as the Llama
# one does. The Llama pair is svformer_82m.py's 2,048-token runs (out/sec4.6_vanilla_T2048,
# out/sec4.6_svformer_T2048). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_78m.py --variant=vanilla --out_dir=out/sec4.7_gpt2_vanilla_78m
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_78m.py --variant=svformer --out_dir=out/sec4.7_gpt2_svformer_78m
#   -- with the official run's dropout, 0.1:
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_78m.py --variant=vanilla --dropout=0.1 --out_dir=out/sec4.7_gpt2_vanilla_78m_dropout0.1
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_78m.py --variant=svformer --dropout=0.1 --out_dir=out/sec4.7_gpt2_svformer_78m_dropout0.1
# The relative training loss (SVFormer's smoothed training loss minus the Transformer's of the same blocks) and
# the step where the two cross (the critical point), on each backbone:
#   python lab/relative_loss.py out/sec4.7_gpt2_vanilla_78m out/sec4.7_gpt2_svformer_78m
#   python lab/relative_loss.py out/sec4.6_vanilla_T2048 out/sec4.6_svformer_T2048
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds: the Transformer and SVFormer on
# Llama's blocks and on GPT-2's; results/backbone/README.md):
#   python lab/reproduce.py backbone
# Memory: about 112 GB eager, 38 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# bench.py counts GPT-2's 77.8M parameters, but each layer's activations as a Llama block's with a SwiGLU of
# 2048 (GPT-2's GELU MLP keeps fewer): likely above what these blocks take.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.7_gpt2_vanilla_78m'
variant = 'vanilla'
backbone = 'gpt2'
n_layer = 8
n_head = 8
n_embd = 512  # GPT-2's MLP defaults to 4 x n_embd = 2048 (ffn_hidden unset)
