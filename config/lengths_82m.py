# ICLR Sec. 4.2, Fig. 7 Left, and Sec. 4.4, Table 1 (sources: docs/experiments.md): Transformer vs Identity
# ResFormer at 82M (8 layers, 8 heads, d 512) trained at 2,048, 32,000 and 64,000 tokens a sequence, about 2M
# tokens a step (ICLR A.5 Table 3: 1024, 64 and 32 sequences), paper_recipe.py's recipe otherwise. Table 1
# does not name its model size: 82M is our choice, the size of Fig. 7 Left's length study.
# Paper: ResFormer ahead at every length all through training (Fig. 7 Left, curves). Table 1, zero-shot acc.:
#                  length  HellaSwag  OpenBookQA  WinoGrande  ARC-c  ARC-e  PIQA   Avg
#   Transformer    2,048   0.263      0.142       0.492       0.199  0.331  0.572  0.333
#   ResFormer      2,048   0.273      0.148       0.512       0.182  0.414  0.604  0.355
#   Transformer   64,000   0.267      0.142       0.485       0.179  0.322  0.570  0.328
#   ResFormer     64,000   0.274      0.136       0.513       0.184  0.407  0.588  0.350
# Downstream tasks: hellaswag,openbookqa,winogrande,arc_easy,arc_challenge,piqa,wikitext (eval.py's default)
# Avg = the unweighted mean of the six accuracies (the paper's arithmetic), in plain acc: the paper does not name
# its metric, but its OpenBookQA column (0.136-0.148) is below a 4-way choice's chance, where only plain acc puts
# models this small. eval.py headlines that mean and prints acc_norm's beside it. WikiText's word perplexity
# (not in Table 1) stays out of the mean. Runs, then evaluations:
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=vanilla --out_dir=out/sec4.2_vanilla_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=resformer_identity --out_dir=out/sec4.2_resformer_T2048
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=vanilla --block_size=32000 --batch_size=4 --out_dir=out/sec4.2_vanilla_T32000
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=resformer_identity --block_size=32000 --batch_size=4 --out_dir=out/sec4.2_resformer_T32000
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=vanilla --block_size=64000 --batch_size=2 --out_dir=out/sec4.2_vanilla_T64000
#   torchrun --standalone --nproc_per_node=8 train.py config/lengths_82m.py --variant=resformer_identity --block_size=64000 --batch_size=2 --out_dir=out/sec4.2_resformer_T64000
#   python lab/eval.py --out_dir=out/sec4.2_vanilla_T2048
#   python lab/eval.py --out_dir=out/sec4.2_resformer_T2048
#   python lab/eval.py --out_dir=out/sec4.2_vanilla_T64000
#   python lab/eval.py --out_dir=out/sec4.2_resformer_T64000
# The relative training loss (Fig. 7 Left: ResFormer's smoothed training loss minus the Transformer's at each
# length):
#   python lab/relative_loss.py out/sec4.2_vanilla_T2048 out/sec4.2_resformer_T2048
#   python lab/relative_loss.py out/sec4.2_vanilla_T32000 out/sec4.2_resformer_T32000
#   python lab/relative_loss.py out/sec4.2_vanilla_T64000 out/sec4.2_resformer_T64000
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds: the Transformer, ResFormer and
# SVFormer at 64-512 tokens, 2,048 tokens a step; results/lengths/README.md):
#   python lab/reproduce.py lengths
# Table 1's zero-shot accuracy has none: models that small score at chance.
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# batch_size is what a GPU takes a pass: 128,000-131,072 tokens at every length (64 x 2,048, 4 x 32,000,
# 2 x 64,000), 16 passes a step over all GPUs, and fused (flash) attention keeps memory linear in the
# length: about as much at each.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.2_resformer_T2048'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
