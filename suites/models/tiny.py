"""Small complete models for the shipped `models.yaml` suite.

Each model is deterministic in eval mode: no dropout, no sampling in `forward`, and
`forward` takes only tensors. Weights come from the framework's seeded construction
and are stored in the goldens. Every model stays well under 100k parameters.

The attention and layer-norm modules at the bottom exist in two implementations
each (fused torch op vs written out by hand) with identical parameter layouts, so a
`template_compare_pair` can check one against the other.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class SelfAttention(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        return tuple(z.reshape(shape).transpose(1, 2) for z in (q, k, v))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        out = self.attend(*self.heads(x))
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class ManualSelfAttention(SelfAttention):
    """Same parameters as SelfAttention; softmax(q k^T / sqrt(d)) v written out."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            t = q.shape[-2]
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(dim=-1) @ v


class ManualLayerNorm(nn.Module):
    """nn.LayerNorm over the last dimension, written out (same parameter names)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block: attention and a GELU MLP, both residual."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, d_ff: int = 64):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SmallCNN(nn.Module):
    """Conv-BN-ReLU stages, max pooling, global average pooling and a classifier."""

    def __init__(self, in_channels: int = 3, n_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, groups=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1, groups=2 * width), nn.Hardswish(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MixerBlock(nn.Module):
    """MLP-Mixer block: an MLP across tokens, then an MLP across channels."""

    def __init__(self, n_tokens: int = 16, d_model: int = 32, token_hidden: int = 32, channel_hidden: int = 64):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.token_mlp = nn.Sequential(nn.Linear(n_tokens, token_hidden), nn.GELU(),
                                       nn.Linear(token_hidden, n_tokens))
        self.norm2 = nn.LayerNorm(d_model)
        self.channel_mlp = nn.Sequential(nn.Linear(d_model, channel_hidden), nn.GELU(),
                                         nn.Linear(channel_hidden, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class GRUSequenceModel(nn.Module):
    """Token ids -> embedding -> 2-layer GRU -> per-step logits and a pooled class score."""

    def __init__(self, vocab: int = 50, d_embed: int = 16, hidden: int = 32, n_classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_embed)
        self.gru = nn.GRU(d_embed, hidden, num_layers=2, batch_first=True)
        self.step_head = nn.Linear(hidden, vocab)
        self.cls_head = nn.Linear(hidden, n_classes)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.gru(self.embed(tokens))
        return self.step_head(out), self.cls_head(h[-1])


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to a memory, and an MLP (pre-norm)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = SelfAttention(d_model, n_heads, causal=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.cross_attn = nn.MultiheadAttention(d_model, n_heads, dropout=0.0, batch_first=True)
        self.norm3 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.SiLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x))
        q = self.norm2(x)
        x = x + self.cross_attn(q, memory, memory, need_weights=False)[0]
        return x + self.mlp(self.norm3(x))


class TinyAttentionDecoder(nn.Module):
    """Token + learned position embeddings, decoder layers, final norm, tied LM head."""

    def __init__(self, vocab: int = 64, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                 d_ff: int = 64, max_len: int = 16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x, memory)
        return self.norm(x) @ self.tok.weight.t()


class ResidualMLP(nn.Module):
    """A residual MLP with RMSNorm and SiLU gating (a SwiGLU feed-forward)."""

    def __init__(self, d_model: int = 32, d_ff: int = 64, n_blocks: int = 2):
        super().__init__()
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(n_blocks))
        self.gates = nn.ModuleList(nn.Linear(d_model, 2 * d_ff, bias=False) for _ in range(n_blocks))
        self.downs = nn.ModuleList(nn.Linear(d_ff, d_model, bias=False) for _ in range(n_blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, gate, down in zip(self.norms, self.gates, self.downs):
            a, b = gate(norm(x)).chunk(2, dim=-1)
            x = x + down(F.silu(a) * b)
        return x
