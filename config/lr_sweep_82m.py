# Sec. 4.3: Transformer vs Identity ResFormer at 82M (8 layers, 8 heads, d 512) across learning rates.
# Paper: Identity ResFormer has the lower validation loss at every learning rate tested, and its layer-1 W_V
# gradient norm is ~2x the Transformer's (its W_O gradient norm ~1.5x). The paper's exact learning-rate grid is
# not restated here; this sweep (1e-4, 3e-4, 6e-4, 1e-3, 2e-3, each decaying to a tenth, as the recipe's 6e-4 -> 6e-5)
# brackets its 6e-4. log_grad_norms=True logs every parameter's gradient norm (blocks.0.attn.c_v.weight is
# layer 1's W_V, blocks.*.attn.c_proj.weight the W_O's). Runs:
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
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.3_resformer_identity_lr6e-4'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
log_grad_norms = True
