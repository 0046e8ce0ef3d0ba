# ICLR Sec. 3.5, Fig. 5 (sources: docs/experiments.md): which of K and V can be shared across layers, every
# two layers, at 82M (8 layers, 8 heads, d 512; the text gives no size: ours), paper_recipe.py's recipe.
# share_k / share_v: layers (1, 2), (3, 4), ... share only the keys / only the values (3/4 of the KV cache);
# cla shares both (1/2); svformer shares layer 1's values with every layer (9/16).
# Paper (curves only): "sharing values has less negative impact compared with sharing keys", which is what
# makes SVFormer work; ICLR Sec. 4.8, Fig. 16 (layer 1's queries or keys shared by all layers) is not built.
# Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=vanilla --out_dir=out/sec3.5_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_k --out_dir=out/sec3.5_share_k
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_v --out_dir=out/sec3.5_share_v
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=cla --out_dir=out/sec3.5_cla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=svformer --out_dir=out/sec3.5_svformer
# Memory: about 56 GB eager, 19 GB compiled per GPU at 32 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec3.5_share_v'
variant = 'share_v'
n_layer = 8
n_head = 8
n_embd = 512
