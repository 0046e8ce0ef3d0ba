# Fig. 2 (model scaling), the 180M point: Transformer vs Identity ResFormer, mean validation loss over the
# 7 SlimPajama domains after 10,000 steps of 2M tokens (20B tokens).
# Model: the paper's 180M model: 12 layers, 12 heads, d 768, SwiGLU 2688.
# Paper: Transformer 2.5015, Identity ResFormer 2.4692.
# Across 82M-1.6B the paper reads off Fig. 2 that ResFormer matches the Transformer's loss with 16.11% fewer
# parameters and 20.3% less training data (v3 of the paper: 10.4% and 13.6%); the data saving comes from the
# loss-vs-tokens curves, i.e. the val_loss that train.py logs every 1000 steps.
# Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_180m.py --variant=vanilla --out_dir=out/fig2_vanilla_180m
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_180m.py --variant=resformer_identity --out_dir=out/fig2_resformer_180m
# Any other variant the same way (e.g. --variant=svformer).
# Memory: micro_batch_size = 16 sequences of 2048 tokens per GPU, about 35-44 GB (32 would need 67-84 GB; paper_recipe.py
# says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/fig2_resformer_180m'
variant = 'resformer_identity'
n_layer = 12
n_head = 12
n_embd = 768  # SwiGLU hidden defaults to 3.5 x n_embd = 2688
micro_batch_size = 16  # 8 micro-steps per GPU on 8 GPUs; the step is the recipe's
