# ICLR Sec. 4.2, Fig. 7 Right, and A.3, Fig. 22 (sources: docs/experiments.md): ResFormer against the other
# cross-layer baselines at 82M (8 layers, 8 heads, d 512), paper_recipe.py's recipe. NeuTRENO adds
# λ (V1 - V_n) to each layer's attention output (ICLR Eqn. 8): λ = 0.4 alone, 0.2 with ResFormer (ICLR A.3;
# the official code). Fig. 22 sweeps NeuTRENO's λ over 0.2, 0.4, 0.6, 0.8; the text gives no model size for
# it: 82M, our choice.
# Paper (relative training loss, curves): ResFormer beats DenseFormer and NeuTRENO, and ResFormer + NeuTRENO
# improves further (Fig. 7 Right); λ = 0.4 is NeuTRENO's best (Fig. 22). The latest version's 468M comparison:
# baselines_468m.py. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=vanilla --out_dir=out/sec4.2_vanilla_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=resformer_identity --out_dir=out/sec4.2_resformer_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=denseformer --out_dir=out/sec4.2_denseformer_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=neutreno --out_dir=out/sec4.2_neutreno_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=neutreno_resformer --out_dir=out/sec4.2_neutreno_resformer_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=custom --neutreno_lambda=0.2 --out_dir=out/a3_neutreno_l0.2
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=custom --neutreno_lambda=0.6 --out_dir=out/a3_neutreno_l0.6
#   torchrun --standalone --nproc_per_node=8 train.py config/baselines_82m.py --variant=custom --neutreno_lambda=0.8 --out_dir=out/a3_neutreno_l0.8
# The relative training loss (Fig. 7 Right and Fig. 22: each run's smoothed training loss minus the
# Transformer's):
#   python lab/relative_loss.py out/sec4.2_vanilla_82m out/sec4.2_resformer_82m out/sec4.2_denseformer_82m out/sec4.2_neutreno_82m out/sec4.2_neutreno_resformer_82m
#   python lab/relative_loss.py out/sec4.2_vanilla_82m out/a3_neutreno_l0.2 out/sec4.2_neutreno_82m out/a3_neutreno_l0.6 out/a3_neutreno_l0.8
# CPU counterpart (4 layers, d 128, character-level Shakespeare, 3 seeds: NeuTRENO at λ = 0.2, 0.4, 0.6, 0.8,
# NeuTRENO + ResFormer, ResFormer and DenseFormer; results/neutreno/README.md):
#   python lab/reproduce.py neutreno
# Memory: about 110 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/sec4.2_resformer_82m'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
