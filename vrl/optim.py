"""
The optimizers train.py builds for a GPT (model.py): nanoGPT's AdamW, with weight decay on matrices and
embeddings only (never norms, λ or DenseFormer α), or Muon on the hidden matrices beside it
(muon=True, docs/training.md).
"""
import torch
import torch.nn as nn


def hidden_matrices(model):
    """The blocks' linear weights, attention and MLP projections: what Muon trains (muon=True)."""
    return [m.weight for m in model.blocks.modules() if isinstance(m, nn.Linear)]


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, lr_scales=(), muon=None):
    """AdamW over model's parameters. lr_scales: (parameter name, multiplier) pairs trained at multiplier x
    the schedule's rate (v5 Sec. 4.3's control); each group's 'lr_scale' says. muon: (Muon's peak rate, its
    adjust_lr_fn) to train the hidden matrices with torch.optim.Muon instead; the rest stays with AdamW, as
    Muon's authors (and nanochat, modded-nanogpt) do."""
    scales = dict(lr_scales)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    unknown = sorted(set(scales) - set(params))
    if unknown:
        raise ValueError(f"lr_scales names {', '.join(unknown)}, not parameters of this model "
                         f"(names like blocks.0.attn.c_v.weight)")
    hidden = {id(w) for w in hidden_matrices(model)} if muon else set()
    # the decayed and the undecayed group first and always: saved optimizer states have them so
    groups = {(True, 1.0): [], (False, 1.0): []}
    muon_groups = {}
    for name, p in params.items():
        key = (p.dim() >= 2, float(scales.get(name, 1.0)))
        (muon_groups if id(p) in hidden else groups).setdefault(key, []).append(p)
    adamw = torch.optim.AdamW([{'params': ps, 'weight_decay': weight_decay if decays else 0.0,
                                'lr_scale': scale} for (decays, scale), ps in groups.items()],
                              lr=learning_rate, betas=betas, eps=1e-8, fused=device_type in ('cuda', 'cpu'))
    if not muon:
        return adamw
    # the schedule's peak becomes Muon's through lr_scale; its decoupled decay (rate x decay) takes off
    # what AdamW's does a step: only the update differs
    muon_lr, adjust_lr_fn = muon
    groups = [{'params': ps, 'lr_scale': scale * muon_lr / learning_rate} for (_, scale), ps in
              muon_groups.items()]
    decay = weight_decay * learning_rate / muon_lr
    return MuonAndAdamW(torch.optim.Muon(groups, lr=muon_lr, weight_decay=decay, adjust_lr_fn=adjust_lr_fn),
                        adamw)


class MuonAndAdamW:
    """Muon and AdamW stepped as one optimizer: what train.py's loop, its loss scaler and its checkpoints use
    of an optimizer (param_groups, step, zero_grad, state_dict) covers both, Muon's groups first."""

    def __init__(self, muon, adamw):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self):  # read anew: loading a state replaces each optimizer's groups
        return self.muon.param_groups + self.adamw.param_groups

    def step(self):
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self):
        return {'muon': self.muon.state_dict(), 'adamw': self.adamw.state_dict()}

    def load_state_dict(self, state):
        self.muon.load_state_dict(state['muon'])
        self.adamw.load_state_dict(state['adamw'])
