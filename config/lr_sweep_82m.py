# Transformer vs Identity ResFormer at 82M (8 layers, 8 heads, d 512) across peak learning rates,
# paper_recipe.py's recipe otherwise (sources: docs/experiments.md). Paper, the latest version (second-hand):
# "experiments with different learning rates demonstrate that the performance gain is not merely due to
# shortcut connections accelerating training convergence"; its grid and numbers are not known to us. This
# sweep (1e-4, 3e-4, 6e-4, 1e-3, 2e-3, each decaying to a tenth as the recipe's 6e-4 -> 6e-5) brackets the
# recipe's 6e-4; its first three are ICLR Fig. 15a's SVFormer rates. log_grad_norms=True logs every
# parameter's gradient norm (blocks.0.attn.c_v.weight is layer 1's W_V, blocks.*.attn.c_proj.weight the
# W_O's). Its control, layer 1 alone at a higher rate: control_layer1_lr_82m.py. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=vanilla --learning_rate=1e-4 --min_lr=1e-5 --out_dir=out/sec4.3_vanilla_lr1e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=resformer_identity --learning_rate=1e-4 --min_lr=1e-5 --out_dir=out/sec4.3_resformer_identity_lr1e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=vanilla --learning_rate=3e-4 --min_lr=3e-5 --out_dir=out/sec4.3_vanilla_lr3e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=resformer_identity --learning_rate=3e-4 --min_lr=3e-5 --out_dir=out/sec4.3_resformer_identity_lr3e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=vanilla --learning_rate=6e-4 --min_lr=6e-5 --out_dir=out/sec4.3_vanilla_lr6e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=resformer_identity --learning_rate=6e-4 --min_lr=6e-5 --out_dir=out/sec4.3_resformer_identity_lr6e-4
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=vanilla --learning_rate=1e-3 --min_lr=1e-4 --out_dir=out/sec4.3_vanilla_lr1e-3
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=resformer_identity --learning_rate=1e-3 --min_lr=1e-4 --out_dir=out/sec4.3_resformer_identity_lr1e-3
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=vanilla --learning_rate=2e-3 --min_lr=2e-4 --out_dir=out/sec4.3_vanilla_lr2e-3
#   torchrun --standalone --nproc_per_node=8 train.py config/lr_sweep_82m.py --variant=resformer_identity --learning_rate=2e-3 --min_lr=2e-4 --out_dir=out/sec4.3_resformer_identity_lr2e-3
# The relative training loss (ResFormer's smoothed training loss minus the Transformer's at each rate), e.g.:
#   python lab/relative_loss.py out/sec4.3_vanilla_lr6e-4 out/sec4.3_resformer_identity_lr6e-4
#   python lab/relative_loss.py out/sec4.3_vanilla_lr2e-3 out/sec4.3_resformer_identity_lr2e-3
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds, 1e-3 to 8e-3; results/lr/README.md):
#   python lab/reproduce.py lr
# There ResFormer is ahead at every rate, clearly from 1e-3 to 4e-3 (t -3.5 to -6.2), unresolved at 8e-3
# (t -1.5).
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.3_resformer_identity_lr6e-4'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
log_grad_norms = True
