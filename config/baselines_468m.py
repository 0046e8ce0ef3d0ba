# Sec. 4.2: ResFormer against the other cross-layer baselines at 468M (24 layers, 16 heads, d 1024, SwiGLU
# 3584), the paper's recipe. Paper (WikiText perplexity / mean zero-shot accuracy over ARC-E, ARC-C, HellaSwag,
# PIQA, OpenBookQA; second-hand numbers):
#   Transformer                24.8 / 40.6
#   NeuTRENO (λ = 0.4)         24.3 / 41.4
#   DenseFormer                24.0 / 40.8
#   Identity ResFormer         23.8 / 41.3
#   Learnable ResFormer        23.7 / 42.3
#   Learnable ResFormer Plus   23.2 / 42.0
# train.py reports validation loss; perplexity and downstream accuracy need an evaluation harness run on the
# checkpoints (not part of this repository). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=vanilla --out_dir=out/sec4.2_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=neutreno --out_dir=out/sec4.2_neutreno
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=denseformer --out_dir=out/sec4.2_denseformer
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_identity --out_dir=out/sec4.2_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_learnable --out_dir=out/sec4.2_resformer_learnable
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_learnable_plus --out_dir=out/sec4.2_resformer_learnable_plus
# Memory: micro_batch_size = 8 sequences of 2048 tokens per GPU, about 39-49 GB (16 would need 71-90 GB; paper_recipe.py
# says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.2_resformer_identity'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 1024
micro_batch_size = 8  # 16 micro-steps per GPU on 8 GPUs; the step is the recipe's
