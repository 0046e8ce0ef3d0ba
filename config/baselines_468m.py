# The latest version's main table (second-hand; sources: docs/experiments.md): ResFormer against the other
# cross-layer baselines at 468M (24 layers, 16 heads, d 1024, SwiGLU 3584; ICLR Table 4), paper_recipe.py's
# recipe. The ICLR text compares these baselines at 82M, by training loss only (baselines_82m.py).
# Paper (second-hand: WikiText perplexity / mean zero-shot accuracy, %; its tasks are not known to us):
#   Transformer                24.8 / 40.6
#   NeuTRENO (λ = 0.4)         24.3 / 41.4
#   DenseFormer                24.0 / 40.8
#   Identity ResFormer         23.8 / 41.3
#   Learnable ResFormer        23.7 / 42.3
#   Learnable ResFormer Plus   23.2 / 42.0
# NeuTRENO sits between the Transformer and Identity ResFormer on perplexity only: on mean accuracy it is
# above Identity (41.4 against 41.3). DenseFormer sits between them on both.
# Downstream tasks: hellaswag,openbookqa,winogrande,arc_easy,arc_challenge,piqa,wikitext (eval.py's default)
# The mean is over the six accuracy tasks, unweighted (the ICLR Table 1 arithmetic), in plain acc (Table 1's
# OpenBookQA scores sit below chance, where only plain acc puts small models); eval.py prints acc_norm's mean
# beside it. WikiText's word perplexity stays out of the mean. Runs, then evaluations:
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=vanilla --out_dir=out/main468m_vanilla
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=neutreno --out_dir=out/main468m_neutreno
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=denseformer --out_dir=out/main468m_denseformer
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_identity --out_dir=out/main468m_resformer_identity
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_learnable --out_dir=out/main468m_resformer_learnable
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_468m.py --variant=resformer_learnable_plus --out_dir=out/main468m_resformer_learnable_plus
#   python lab/eval.py --out_dir=out/main468m_vanilla
#   python lab/eval.py --out_dir=out/main468m_neutreno
#   python lab/eval.py --out_dir=out/main468m_denseformer
#   python lab/eval.py --out_dir=out/main468m_resformer_identity
#   python lab/eval.py --out_dir=out/main468m_resformer_learnable
#   python lab/eval.py --out_dir=out/main468m_resformer_learnable_plus
# The relative training loss (each run's smoothed training loss minus the Transformer's):
#   python lab/relative_loss.py out/main468m_vanilla out/main468m_neutreno out/main468m_denseformer out/main468m_resformer_identity out/main468m_resformer_learnable out/main468m_resformer_learnable_plus
# CPU counterpart (every variant at 4 layers, d 128, character-level Shakespeare, 3 seeds, validation loss
# only: models that small score at chance downstream; results/variants/README.md):
#   python lab/reproduce.py variants
# Memory: about 72 GB eager, 45 GB compiled per GPU at 16 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/main468m_resformer_identity'
variant = 'resformer_identity'
n_layer = 24
n_head = 16
n_embd = 1024
batch_size = 16  # sequences a GPU takes a pass: micro_batch's (paper_recipe.py), in its memory
gradient_accumulation_steps = 64  # so that a step still takes 64 x 16 = 1024 sequences
eval_iters = 112  # the recipe's validation sample: 16 batches of 16 = 256 windows a domain
