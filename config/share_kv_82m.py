# Table 1: which of K and V can be shared across layers, at 82M (8 layers, 8 heads, d 512), the paper's recipe.
# share_k / share_v: layers (1, 2), (3, 4), ... share only the keys / only the values (3/4 of the KV cache);
# cla shares both (1/2); svformer shares layer 1's values with every layer (9/16).
# Paper: sharing V costs less loss than sharing K, which is what makes SVFormer work. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=vanilla --out_dir=out/table1_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_k --out_dir=out/table1_share_k
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=share_v --out_dir=out/table1_share_v
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=cla --out_dir=out/table1_cla
#   torchrun --standalone --nproc_per_node=8 train.py config/share_kv_82m.py --variant=svformer --out_dir=out/table1_svformer
# Memory: micro_batch_size = 32 sequences of 2048 tokens per GPU, about 45-60 GB (paper_recipe.py says how estimated).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/table1_share_v'
variant = 'share_v'
n_layer = 8
n_head = 8
n_embd = 512
