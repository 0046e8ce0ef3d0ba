# Fig. 2 (model scaling), the 468M point: Transformer vs Identity ResFormer, mean validation loss over the
# 7 SlimPajama domains after 10,000 steps of 2M tokens (20B tokens).
# Model: the paper's 468M model: 24 layers, 16 heads, d 1024, SwiGLU 3584.
# Paper: Transformer 2.2806, Identity ResFormer 2.2537.
# Across 82M-1.6B the paper reads off Fig. 2 that ResFormer matches the Transformer's loss with 16.11% fewer
# parameters and 20.3% less training data (v3 of the paper: 10.4% and 13.6%); the data saving comes from the
# loss-vs-tokens curves, i.e. the val_loss that train.py logs every 1000 steps.
# Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_468m.py --variant=vanilla --out_dir=out/fig2_vanilla_468m
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_468m.py --variant=resformer_identity --out_dir=out/fig2_resformer_468m
# Any other variant the same way (e.g. --variant=svformer).
# Memory: micro_batch_size = 8 sequences of 2048 tokens per GPU, about 39-49 GB (16 would need 71-90 GB; paper_recipe.py
# says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/fig2_resformer_468m'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 1024  # SwiGLU hidden defaults to 3.5 x n_embd = 3584
micro_batch_size = 8  # 16 micro-steps per GPU on 8 GPUs; the step is the recipe's
