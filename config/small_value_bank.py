# Which context-free value wins where a token table costs real parameters: the value_bank comparison on GPT-2 BPE
# Shakespeare (vocabulary 50,304), at small_svformer.py's shape, a few minutes a run on 2 CPU cores. The bank of
# values (arXiv 2606.02780; docs/model.md) replaces W_V in layers 3-4 by two 50,304 x 128 tables: 26.7M parameters
# against the Transformer's 13.8M, and KV bytes per token (16-bit) 1,544 against 2,048 (no values in layers 3-4,
# one token id). The widened Transformer has the bank's parameters in its SwiGLU. With 3 seeds and the tables:
#   python lab/reproduce.py value_bank --scale=bpe   (this shape, and the same at 8 layers)
# One seed by hand (for 8 layers add --n_layer=8; the widened Transformer then takes --ffn_hidden=6720):
#   python train.py config/small_value_bank.py --value_bank=False --out_dir=out/bpe_vanilla
#   python train.py config/small_value_bank.py --value_bank=False --variant=resformer_identity --out_dir=out/bpe_resformer
#   python train.py config/small_value_bank.py --value_bank=False --variant=svformer --out_dir=out/bpe_svformer
#   python train.py config/small_value_bank.py --value_bank=False --value_embeds=True --out_dir=out/bpe_value_embeds
#   python train.py config/small_value_bank.py --out_dir=out/bpe_value_bank
#   python train.py config/small_value_bank.py --variant=resformer_identity --out_dir=out/bpe_value_bank_resformer
#   python train.py config/small_value_bank.py --value_bank=False --ffn_hidden=8811 --out_dir=out/bpe_vanilla_wide
# Prepare the data first: python prepare.py --tokenizer=gpt2
# Results, 3 seeds at 4 and 8 layers: results/value_bank_bpe/README.md, read in results/README.md.
import os
exec(open(os.path.join(os.path.dirname(__file__), 'small_svformer.py')).read())  # its data and shape
variant = 'vanilla'
value_bank = True
eval_interval = 50
eval_iters = 20
