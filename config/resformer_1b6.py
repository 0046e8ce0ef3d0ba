# The 1.6B point of model scaling, which only the latest version has (second-hand: "1.6B scale: trained on
# 200B tokens"; that version's abstract, arXiv v5, claims 16.11% / 20.3% savings from runs we could not read).
# The ICLR text's largest model is 468M (resformer_468m.py). Sources: docs/experiments.md.
# Model: an INFERRED shape, as the 1.6B shape is not in what we could read (the latest version's Table 14 may
# list it; we could not read it): 24 layers, 16 heads, d 2048, SwiGLU 7168 = 1.67B parameters.
# Data: 20B tokens (10,000 steps of 2M, paper_recipe.py's recipe) by default, comparable with the other sizes;
# the second-hand 200B is the second pair of runs (100,000 steps), and may not even have been SlimPajama. Each
# reads its sample once (train.py's data_order), so the 200B runs have a folder of their own, made first with
#   python prepare.py --dataset=slimpajama --max_tokens=210e9 --out_dir=data/slimpajama_200b
# The number to compare is val_loss_full: the unweighted mean over the 7 SlimPajama domains of each domain's
# loss on its whole validation split (val_loss is a fixed sample of it). Paper: no loss published. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=vanilla --out_dir=out/scale_vanilla_1b6
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=resformer_identity --out_dir=out/scale_resformer_1b6
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=vanilla --max_iters=100000 --lr_decay_iters=100000 --dataset=slimpajama_200b --out_dir=out/scale_vanilla_1b6_200B
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_1b6.py --variant=resformer_identity --max_iters=100000 --lr_decay_iters=100000 --dataset=slimpajama_200b --out_dir=out/scale_resformer_1b6_200B
# The relative training loss (ResFormer's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/scale_vanilla_1b6 out/scale_resformer_1b6
#   python lab/relative_loss.py out/scale_vanilla_1b6_200B out/scale_resformer_1b6_200B
# CPU counterpart (the Transformer against Identity ResFormer at four CPU sizes, 2-5 layers at d 64-160,
# character-level Shakespeare, 3 seeds; results/scaling/README.md); 200B tokens have none:
#   python lab/reproduce.py scaling
# Memory: about 57 GB eager, 47 GB compiled per GPU at 4 sequences of 2048 tokens a pass (docs/training.md).
# Most of it is the 1.67B parameters' weights, gradients, AdamW state and bf16 copies (18 bytes each); if 4 does
# not fit, take --batch_size=2 --gradient_accumulation_steps=512 (the same 1024 sequences a step) and
# --eval_iters=896 (the same validation sample: 128 batches of 2 = 256 windows a domain).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/scale_resformer_1b6'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 2048  # SwiGLU hidden defaults to 3.5 x n_embd = 7168
batch_size = 4  # sequences a GPU takes a pass: micro_batch's (paper_recipe.py), in its memory
gradient_accumulation_steps = 256  # so that a step still takes 256 x 4 = 1024 sequences
eval_iters = 448  # the recipe's validation sample: 64 batches of 4 = 256 windows a domain
ckpt_interval = 250  # a save every 250 steps (about 30 min): a kill, or a SIGTERM whose 30 s
#   cannot hold this size's save, loses at most that; a save (20 GB) stalls 25-90 s of 1,750 s
#   (docs/training.md, 'What a stop's save achieves')
