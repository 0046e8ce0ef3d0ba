# Beyond the paper: does the value residual survive Muon? The paper trains with AdamW; modded-nanogpt's
# speedrun records pair Muon with value residuals. The paper's 82M Transformer and Identity ResFormer (8 layers,
# 8 heads, d 512, SwiGLU 1792: ICLR Table 4) with muon=True: torch.optim.Muon for the blocks' linear
# weights, AdamW for the embeddings, the LM head, norms and λ; otherwise paper_recipe.py's recipe, to set
# beside resformer_82m.py's AdamW runs (ICLR A.6 Table 5: Transformer 2.7389, Identity ResFormer 2.7117).
# Muon's rate: no sweep at this size has been run here, so Moonshot's rule ("Muon is Scalable for LLM
# Training", arXiv 2502.16982; torch.optim.Muon's 'match_rms_adamw'): the update scaled to AdamW's RMS
# (0.2 sqrt(max(rows, cols))), so that AdamW's tuned rate and weight decay carry over unchanged. Runs:
#   torchrun --standalone --nproc_per_node=8 train.py config/muon_82m.py --variant=vanilla --out_dir=out/muon_vanilla_82m
#   torchrun --standalone --nproc_per_node=8 train.py config/muon_82m.py --variant=resformer_identity --out_dir=out/muon_resformer_82m
# The relative training loss (ResFormer's smoothed training loss minus the Transformer's, under Muon):
#   python lab/relative_loss.py out/muon_vanilla_82m out/muon_resformer_82m
# CPU counterparts (character-level Shakespeare at 4 and 8 layers, and GPT-2 BPE with --scale=bpe): Muon's rate
# swept in Keller Jordan's 'original' scaling for each variant, then the variants with AdamW and with Muon at
# the sweep's best rate (results/muon_lr/, results/optimizer/README.md): under Muon the gain shrinks.
#   python lab/reproduce.py muon_lr --seeds=1
#   python lab/reproduce.py optimizer
# Memory: about 109 GB eager, 37 GB compiled per GPU at 64 sequences of 2048 tokens a pass (docs/training.md).
import os
exec(open(os.path.join(os.path.dirname(__file__), 'paper_recipe.py')).read())
out_dir = 'out/muon_resformer_82m'
variant = 'resformer_identity'
n_layer = 8
n_head = 8
n_embd = 512
muon = True
muon_adjust_lr = 'match_rms_adamw'
muon_lr = learning_rate  # 6e-4, the recipe's AdamW rate; weight decay 0.1 as AdamW's
