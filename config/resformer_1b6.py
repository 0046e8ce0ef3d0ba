# The 1.6B point of model scaling, which only the latest version has (second-hand: "1.6B scale: trained on
# 200B tokens"; that version's abstract, arXiv v5, claims 16.11% / 20.3% savings from runs we could not read).
# The ICLR text's largest model is 468M (resformer_468m.py). Sources: docs/experiments.md.
# Model: an INFERRED shape, published nowhere: 24 layers, 16 heads, d 2048, SwiGLU 7168 = 1.67B parameters.
# Data: 20B tokens (10,000 steps of 2M, paper_recipe.py's recipe) by default, comparable with the other sizes;
# the second-hand 200B is the second pair of runs (100,000 steps), and may not even have been SlimPajama. Each
# reads its sample once (train.py's data_order), so the 200B runs have a folder of their own, made first with
#   python prepare.py --dataset=slimpajama --max_tokens=210e9 --out_dir=data/slimpajama_200b
# val_loss is the mean over the 7 SlimPajama domains' own validation losses. Paper: no loss published. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=vanilla --out_dir=out/scale_vanilla_1b6
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=resformer_identity --out_dir=out/scale_resformer_1b6
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=vanilla --max_iters=100000 --lr_decay_iters=100000 --dataset=slimpajama_200b --out_dir=out/scale_vanilla_1b6_200B
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=resformer_identity --max_iters=100000 --lr_decay_iters=100000 --dataset=slimpajama_200b --out_dir=out/scale_resformer_1b6_200B
# Memory: about 57 GB eager, 47 GB compiled per GPU at 4 sequences of 2048 tokens a pass (docs/training.md).
# Most of it is the 1.67B parameters' weights, gradients, AdamW state and bf16 copies (18 bytes each); if 4 does
# not fit, take micro_batch_size=2.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/scale_resformer_1b6'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 2048  # SwiGLU hidden defaults to 3.5 x n_embd = 7168
micro_batch_size = 4  # 32 micro-steps per GPU on 8 GPUs; the step is the recipe's
