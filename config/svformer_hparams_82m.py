# ICLR Sec. 4.7, Fig. 15a and 15b (sources: docs/experiments.md): SVFormer's gap to the Transformer under
# other peak learning rates (1e-4, 3e-4, 6e-4, each decaying to a tenth as the recipe's 6e-4 -> 6e-5) and
# warmups (120, 1,200 steps). The text gives no model size or length for these: 82M at 2,048 tokens, our
# choice, so 6e-4 with warmup 120 is the 2,048 pair of svformer_82m.py. paper_recipe.py's recipe otherwise.
# Paper (curves, no final numbers): a smaller learning rate helps SVFormer more; warmup matters comparatively
# little. Fig. 15c (SVFormer on GPT-2 78M's blocks against Llama 82M's): gpt2_78m.py; Fig. 15d (model
# size): resformer_82m/180m/468m.py. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=vanilla --learning_rate=1e-4 --min_lr=1e-5 --out_dir=out/sec4.7_vanilla_lr1e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=svformer --learning_rate=1e-4 --min_lr=1e-5 --out_dir=out/sec4.7_svformer_lr1e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=vanilla --learning_rate=3e-4 --min_lr=3e-5 --out_dir=out/sec4.7_vanilla_lr3e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=svformer --learning_rate=3e-4 --min_lr=3e-5 --out_dir=out/sec4.7_svformer_lr3e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=vanilla --warmup_iters=1200 --out_dir=out/sec4.7_vanilla_warmup1200
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_hparams_82m.py --variant=svformer --warmup_iters=1200 --out_dir=out/sec4.7_svformer_warmup1200
# The relative training loss (SVFormer's smoothed training loss minus the Transformer's at the same rate or
# warmup; the recipe's pair, 6e-4 with warmup 120, is svformer_82m.py's 2,048-token runs):
#   python lab/relative_loss.py out/sec4.7_vanilla_lr1e-4 out/sec4.7_svformer_lr1e-4
#   python lab/relative_loss.py out/sec4.7_vanilla_lr3e-4 out/sec4.7_svformer_lr3e-4
#   python lab/relative_loss.py out/sec4.6_vanilla_T2048 out/sec4.6_svformer_T2048
#   python lab/relative_loss.py out/sec4.7_vanilla_warmup1200 out/sec4.7_svformer_warmup1200
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds: four learning rates, warmup 50 and
# 500, four sizes; results/svformer/README.md):
#   python lab/reproduce.py svformer
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.7_svformer_lr1e-4'
variant = 'svformer'
n_layer = 8
n_head = 8
n_embd = 512
learning_rate = 1e-4
min_lr = 1e-5
