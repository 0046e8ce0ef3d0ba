# Sec. 4.4: the value residual taken from layer 2's values V2 instead of V1, at 82M (8 layers, 8 heads, d 512).
# residual_source=1 mixes V2 into layers 3-8 (layers 1 and 2 unchanged): V'_n = λ1 V2 + λ2 V_n.
# Paper: residuals from V2 give little (Identity from V1: 2.712 against the Transformer's 2.739). Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_identity --residual_source=1 --out_dir=out/sec4.4_identity_from_v2
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_source_82m.py --variant=resformer_learnable_plus --residual_source=1 --out_dir=out/sec4.4_plus_from_v2
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
