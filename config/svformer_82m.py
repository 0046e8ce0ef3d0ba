# SVFormer vs GQA vs CLA at 82M (paper Sec. 4: KV-efficient methods against sequence length at a fixed
# 2M-token batch). This file: SVFormer at sequence length 2048. The comparison:
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=custom --n_kv_head=2 --out_dir=out/gqa_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=cla --out_dir=out/cla_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --n_kv_head=2 --out_dir=out/svformer_gqa_82m
# Longer sequences at the same tokens per step, e.g. 8192: --block_size=8192 --batch_size=8 --gradient_accumulation_steps=32
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/svformer_82m'
variant = 'svformer'
n_layer = 8
n_head = 8
n_embd = 512
