# Fig. 2 (model scaling), the 82M point: Transformer vs Identity ResFormer, mean validation loss over the
# 7 SlimPajama domains after 10,000 steps of 2M tokens (20B tokens).
# Model: the paper's 82M model: 8 layers, 8 heads, d 512, SwiGLU 1792.
# Paper: Transformer 2.7389, Identity ResFormer 2.7117.
# Across 82M-1.6B the paper reads off Fig. 2 that ResFormer matches the Transformer's loss with 16.11% fewer
# parameters and 20.3% less training data (v3 of the paper: 10.4% and 13.6%); the data saving comes from the
# loss-vs-tokens curves, i.e. the val_loss that train.py logs every 1000 steps.
# Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=vanilla --out_dir=out/fig2_vanilla_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_82m.py --variant=resformer_identity --out_dir=out/fig2_resformer_82m
# Any other variant the same way (e.g. --variant=svformer).
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/fig2_resformer_82m'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512  # SwiGLU hidden defaults to 3.5 x n_embd = 1792
