# ICLR Sec. 4.6 (sources: docs/experiments.md): SVFormer against the Transformer and the other KV-cache
# savers as the training sequence grows, paper_recipe.py's recipe at about 2M tokens a step at every length
# (ICLR A.5 Table 3): 512 x 4096, 2,048 x 1024, 8,192 x 256, 32,000 x 64, 64,000 x 32 sequences (the last two
# 2,048,000 tokens); batch_size, a GPU's sequences a pass, = those / gradient_accumulation_steps (16 passes a
# step over all GPUs). Model: 82M (8 layers, 8 heads, d 512), our choice: the text gives no size for Figs. 13
# and 14 (its Fig. 7 Left length study is 82M).
# KV cache against the Transformer's: SVFormer 9/16 (keys in 8 layers, values in 1); GQAk, our reading of the
# paper's undefined name, keeps 8/k of the 8 KV heads: GQA2 1/2, GQA8 1/8; CLA2 (K and V shared by pairs of
# layers) 1/2; SVFormer+GQA4 9/64; CLA2+GQA4 1/8.
# Paper (curves, no final numbers): SVFormer trails GQA at 2,048 and beats GQA and CLA at 64,000, and it
# combines with GQA (Fig. 13); it learns faster early and is overtaken later, the later the longer the
# sequence (Fig. 14: the step of that crossing grows exponentially with the length). Its learning-rate and
# warmup study: svformer_hparams_82m.py; against model size: resformer_82m/180m/468m.py; on GPT-2's blocks:
# gpt2_78m.py. Runs:
#   -- Fig. 14: SVFormer against the Transformer at each length
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=vanilla --block_size=512 --batch_size=256 --out_dir=out/sec4.6_vanilla_T512
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --block_size=512 --batch_size=256 --out_dir=out/sec4.6_svformer_T512
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=vanilla --block_size=2048 --batch_size=64 --out_dir=out/sec4.6_vanilla_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --block_size=2048 --batch_size=64 --out_dir=out/sec4.6_svformer_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=vanilla --block_size=8192 --batch_size=16 --out_dir=out/sec4.6_vanilla_T8192
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --block_size=8192 --batch_size=16 --out_dir=out/sec4.6_svformer_T8192
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=vanilla --block_size=32000 --batch_size=4 --out_dir=out/sec4.6_vanilla_T32000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --block_size=32000 --batch_size=4 --out_dir=out/sec4.6_svformer_T32000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=vanilla --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_vanilla_T64000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_svformer_T64000
#   -- Fig. 13 Left, about 1/2 of the KV cache, at 2,048 and 64,000 (with SVFormer above): GQA2, CLA2
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=custom --n_kv_head=4 --block_size=2048 --batch_size=64 --out_dir=out/sec4.6_gqa2_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=cla --block_size=2048 --batch_size=64 --out_dir=out/sec4.6_cla2_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=custom --n_kv_head=4 --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_gqa2_T64000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=cla --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_cla2_T64000
#   -- Fig. 13 Right, about 1/8 of the KV cache, at 64,000: SVFormer+GQA4, GQA8, CLA2+GQA4
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=svformer --n_kv_head=2 --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_svformer_gqa4_T64000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=custom --n_kv_head=1 --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_gqa8_T64000
#   torchrun --standalone --nproc_per_node=8 train.py config/svformer_82m.py --variant=cla --n_kv_head=2 --block_size=64000 --batch_size=2 --out_dir=out/sec4.6_cla2_gqa4_T64000
# The relative training loss (Fig. 13 and 14 Left: each run's smoothed training loss minus the Transformer's at
# its length) and the critical point (Fig. 14 Right: the step where the Transformer overtakes SVFormer, the
# curve's zero crossing; at 64,000 the paper extrapolates it by a line through the last 1,000 points):
#   python lab/relative_loss.py out/sec4.6_vanilla_T512 out/sec4.6_svformer_T512
#   python lab/relative_loss.py out/sec4.6_vanilla_T2048 out/sec4.6_svformer_T2048 out/sec4.6_gqa2_T2048 out/sec4.6_cla2_T2048
#   python lab/relative_loss.py out/sec4.6_vanilla_T8192 out/sec4.6_svformer_T8192
#   python lab/relative_loss.py out/sec4.6_vanilla_T32000 out/sec4.6_svformer_T32000
#   python lab/relative_loss.py out/sec4.6_vanilla_T64000 out/sec4.6_svformer_T64000 out/sec4.6_gqa2_T64000 out/sec4.6_cla2_T64000 out/sec4.6_svformer_gqa4_T64000 out/sec4.6_gqa8_T64000 out/sec4.6_cla2_gqa4_T64000
# CPU counterparts (character-level Shakespeare, 4 layers, 3 seeds; results/<suite>/README.md): SVFormer,
# ResFormer and the Transformer at 64-512 tokens and 2,048 tokens a step (Fig. 14 Left, with Fig. 7 Left), and
# SVFormer, GQA, SVFormer + GQA and CLA at 128 and 512 tokens (Fig. 13):
#   python lab/reproduce.py lengths
#   python lab/reproduce.py kv
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# batch_size is what a GPU takes a pass: 128,000-131,072 tokens at every length (256 x 512 ... 2 x 64,000), 16
# passes a step over all GPUs (2 each on 8), and fused (flash) attention keeps memory linear in the length:
# about as much at each.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.6_svformer_T2048'
variant = 'svformer'
n_layer = 8
n_head = 8
n_embd = 512
