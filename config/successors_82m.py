# Beyond the paper: the value residual against its successors at 82M (8 layers, 8 heads, d 512),
# paper_recipe.py's recipe, each method at its own paper's defaults (ablations.py's SUCCESSORS,
# whose docstrings give the sources and our choices). Untested on a GPU: no run of this file has
# been made. SATFormer (arXiv 2605.03953): V'_n = V_n + relu(W_α h_n) ⊙ V1, one gate per token and
# KV head in layers 2-8; gated_resformer: our static control of it, one learned gate per layer and
# KV head; Attention Residuals (arXiv 2603.15031): each sublayer reads a softmax over depth of the
# embedding and every earlier sublayer's output; Block AttnRes over block sums, one layer a block
# here (8 blocks, the paper's N = 8); Depth-Attention (arXiv 2606.05014): before attending over the
# sequence, layer n mixes layers 1 .. n's values at each position by a softmax of its query against
# their keys, and caches the mixed values (no parameters). None adds more than 0.04% parameters,
# nor any KV cache.
# The successors that rebuild the residual stream (ablations.py's CONNECTIONS): Hyper-Connections
# (arXiv 2409.19606; 4 streams, dynamic), mHC (arXiv 2512.24880) and MUDDFormer (arXiv 2502.12170)
# add 0.07%, 0.96% and 0.34% parameters here and no KV cache; --variant=hyper_connections, mhc or
# muddformer (--hc_rate=N, --hc_dynamic=False for static hyper-connections).
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md),
# the Transformer's estimate; hyper-connections and mHC keep 4 streams of activations (more; not measured).
# SATFormer's other options: --variant=satformer --value_gate=sigmoid (or tanh) and
# --value_gate_last_k=k (the last k layers alone). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=vanilla --out_dir=out/successors_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=resformer_identity --out_dir=out/successors_resformer
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=satformer --out_dir=out/successors_satformer
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=gated_resformer --out_dir=out/successors_gated_resformer
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=attn_res --out_dir=out/successors_attn_res
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=attn_res_block --out_dir=out/successors_attn_res_block
#   torchrun --standalone --nproc_per_node=8 train.py config/successors_82m.py --variant=depth_attention --out_dir=out/successors_depth_attention
# The relative training loss (each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/successors_vanilla out/successors_resformer out/successors_satformer out/successors_gated_resformer out/successors_attn_res out/successors_attn_res_block out/successors_depth_attention
# CPU counterpart (4 and 8 layers, d 128, character-level Shakespeare, 3 seeds; GPT-2 BPE with
# --scale=bpe):
#   python lab/reproduce.py successors
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/successors_satformer'
variant = 'satformer'
n_layer = 8
n_head = 8
n_embd = 512
