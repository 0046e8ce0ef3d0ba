# Which tensor the first layer's residual goes to, at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe
# (sources: docs/experiments.md), all with Identity's weights (0.5, 0.5) in layers 2-8:
#   value      V'_n = 0.5 V1 + 0.5 V_n (ResFormer)       query  Q'_n = 0.5 Q1 + 0.5 Q_n
#   key        K'_n = 0.5 K1 + 0.5 K_n                   attention  A'_n = 0.5 A1 + 0.5 A_n (explicit softmax)
#   hidden     block n's attention reads 0.5 norm(H0) + 0.5 norm(x_n), H0 the embedding (or H1, block 1's
#              output, with --residual_from=second), so its Q, K and V each mix in H0's; the residual stream is
#              unchanged. Our reading of the latest version's "extra hidden residual" (docs/model.md).
# Paper: ICLR Sec. 4.3, Fig. 9 (Q, K, V; curves only): "only residual connections for values yield positive
# effects". Mean validation loss: Transformer 2.7389, value 2.7117 (ICLR A.6 Table 5); the latest version's
# ablation table (second-hand) has query 2.742, key 2.746, attention matrix 2.757, hidden residual from H0
# 2.781. The Q and K forms (0.5 / 0.5, as Identity's) are ours: the text writes none. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=vanilla --out_dir=out/sec4.4_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --out_dir=out/sec4.4_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --residual_type=query --out_dir=out/sec4.4_query_residual
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --residual_type=key --out_dir=out/sec4.4_key_residual
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --residual_type=attention --batch_size=16 --gradient_accumulation_steps=64 --eval_iters=112 --out_dir=out/sec4.4_attention_residual
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --residual_type=hidden --out_dir=out/sec4.4_hidden_from_h0
#   torchrun --standalone --nproc_per_node=8 train.py config/ablation_residual_type_82m.py --variant=resformer_identity --residual_type=hidden --residual_from=second --out_dir=out/sec4.4_hidden_from_h1
# The relative training loss (each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/sec4.4_vanilla out/sec4.4_resformer_identity out/sec4.4_query_residual out/sec4.4_key_residual out/sec4.4_attention_residual out/sec4.4_hidden_from_h0 out/sec4.4_hidden_from_h1
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds; results/residual_type/README.md):
#   python lab/reproduce.py residual_type
# There, against the Transformer of the same seed: value -0.026 (t -6.2); query +0.003, key +0.008, attention
# +0.014 (t 2.3); hidden -0.010 (t -1.9, unresolved). Only values help, as the paper says, except that the
# hidden residual is not worse than the Transformer there.
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
# The attention residual's explicit T x T attention, which that count leaves out, needs more: its run takes 16
# sequences a pass and 64 passes a step, the same 1024 sequences a step.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.4_resformer_identity'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
