# Sec. 4.2, Fig. 6 of the ICLR text (sources: docs/experiments.md): model scaling, the 468M point.
# Transformer vs Identity ResFormer after 10,000 steps of 2M tokens (20B), paper_recipe.py's recipe; the paper's
# number is val_loss_full, the mean of the 7 SlimPajama domains' whole-split losses (val_loss: a sample).
# Model: the paper's 468M model: 24 layers, 16 heads, d 1024, SwiGLU 3584 (ICLR Table 4).
# Paper (ICLR A.6 Table 5, the 7-domain mean): Transformer 2.2806, Identity ResFormer 2.2537.
# ICLR Fig. 6 (82M, 180M, 320M, 468M): ResFormer matches the Transformer's loss with 10.4% fewer
# parameters; evaluated every 2B tokens (1000 steps; train.py's val_loss_full, every validation window), the
# 468M ResFormer needs 13.6% less data. The arXiv v4 and v5 abstracts say 13.3% / 15.4% and 16.11% / 20.3%
# (v5's scaling runs reach 1.6B, second-hand). The 320M shape is not in what we could read (the latest
# version's Table 14 may list it; we could not read it): no config. SVFormer at these sizes is ICLR Sec. 4.7,
# Fig. 15d: it needs 12.2% more parameters to match the Transformer's loss. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_468m.py --variant=vanilla --out_dir=out/sec4.2_vanilla_468m
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_468m.py --variant=resformer_identity --out_dir=out/sec4.2_resformer_468m
#   torchrun --standalone --nproc_per_node=8 train.py config/resformer_468m.py --variant=svformer --out_dir=out/sec4.7_svformer_468m
# The relative training loss (each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.2_vanilla_468m out/sec4.2_resformer_468m out/sec4.7_svformer_468m
# CPU counterparts (character-level Shakespeare, 3 seeds, 2-5 layers at d 64-160; results/<suite>/README.md):
# the Transformer against Identity ResFormer at four sizes, with the parameter and token savings (Fig. 6),
# and against SVFormer at the same sizes (Fig. 15d):
#   python lab/reproduce.py scaling
#   python lab/reproduce.py svformer
# Memory: about 72 GB eager, 45 GB compiled per GPU at 16 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.2_resformer_468m'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 1024  # SwiGLU hidden defaults to 3.5 x n_embd = 3584
batch_size = 16  # sequences a GPU takes a pass: micro_batch's (paper_recipe.py), in its memory
gradient_accumulation_steps = 64  # so that a step still takes 64 x 16 = 1024 sequences
eval_iters = 112  # the recipe's validation sample: 16 batches of 16 = 256 windows a domain
ckpt_interval = 250  # a save every 250 steps (about 10 min): a kill loses at most that; a save
#   (5.6 GB) stalls about 17 s of 575 s, 3% (docs/training.md, 'What a stop's save achieves')
