# ICLR Sec. 4.8, Fig. 16 (sources: docs/experiments.md): layer 1's queries or keys shared with every layer, as
# SVFormer shares its values, at 82M (8 layers, 8 heads, d 512; the text gives no size: ours), paper_recipe.py's
# recipe. shared_query: layers 2-8 have no W_Q and attend with layer 1's Q1; shared_key: no W_K, layer 1's K1
# (λ = (1, 0) in layers 2-8, SVFormer's, on the queries or the keys); svformer: no W_V, layer 1's V1.
# Paper (curves only): sharing the first layer's queries or keys "significantly impacts model performance,
# similar to the results in Fig. 5" (ICLR Sec. 4.8); its legend: "Components to share: Value, Query, Key".
# Pairs of layers sharing K or V (ICLR Fig. 5): share_kv_82m.py. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/shared_qk_82m.py --variant=vanilla --out_dir=out/sec4.8_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/shared_qk_82m.py --variant=svformer --out_dir=out/sec4.8_svformer
#   torchrun --standalone --nproc_per_node=8 train.py config/shared_qk_82m.py --variant=shared_query --out_dir=out/sec4.8_shared_query
#   torchrun --standalone --nproc_per_node=8 train.py config/shared_qk_82m.py --variant=shared_key --out_dir=out/sec4.8_shared_key
# The relative training loss (Fig. 16's curves: each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.8_vanilla out/sec4.8_svformer out/sec4.8_shared_query out/sec4.8_shared_key
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds; results/shared_qk/README.md):
#   python lab/reproduce.py shared_qk
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# Each of the three shared variants drops 7 of the 8 layers' W_Q, W_K or W_V: the same count.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.8_svformer'
variant = 'svformer'
n_layer = 8
n_head = 8
n_embd = 512
