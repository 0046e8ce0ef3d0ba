# ICLR Sec. 3.5, Fig. 5 (sources: docs/experiments.md): which of K and V can be shared across layers, every
# two layers, at 82M (8 layers, 8 heads, d 512; the text gives no size: ours), paper_recipe.py's recipe.
# share_k / share_v: layers (1, 2), (3, 4), ... share only the keys / only the values (3/4 of the KV cache);
# cla shares both (1/2); svformer shares layer 1's values with every layer (9/16).
# Paper (curves only): "sharing values has less negative impact compared with sharing keys", which is what
# makes SVFormer work. Sharing layer 1's queries or keys with every layer (ICLR Sec. 4.8, Fig. 16):
# shared_qk_82m.py. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=vanilla --out_dir=out/sec3.5_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_k --out_dir=out/sec3.5_share_k
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_v --out_dir=out/sec3.5_share_v
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=cla --out_dir=out/sec3.5_cla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=svformer --out_dir=out/sec3.5_svformer
# The relative training loss (Fig. 5's curves: each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec3.5_vanilla out/sec3.5_share_k out/sec3.5_share_v out/sec3.5_cla out/sec3.5_svformer
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds; results/share_kv/README.md):
#   python lab/reproduce.py share_kv
# There, against the Transformer of the same seed: share_v -0.021 (t -8.6), share_k +0.006 (t 0.8), cla
# +0.006 (t 2.9), svformer -0.025 (t -2.2): sharing V hurts less than sharing K, as the paper says (here
# sharing V even helps).
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec3.5_share_v'
variant = 'share_v'
n_layer = 8
n_head = 8
n_embd = 512
