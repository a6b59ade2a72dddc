"""Kokoro's two views of the phoneme ids: the PL-BERT (ALBERT) encoder that feeds the prosody
predictor, and the convolutional text encoder whose output the decoder reads (aligned).

ALBERT here is the small one Kokoro ships: embeddings of width 128 (word + position + token
type 0, LayerNorm eps 1e-12), projected to 768, then one transformer layer applied 12 times with
shared weights (12 heads of 64, post-norm, tanh-approximated GELU in the feed-forward of 2048).
A single unpadded sequence needs no attention mask (the graph's is all zeros then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.kokoro.layers import LEAKY_SLOPE, NORM_EPS, conv1d, linear, lstm
from models.kokoro.weights import KokoroWeights

_ALBERT = "encoder.bert"
_LAYER = _ALBERT + ".encoder.albert_layer_groups.0.albert_layers.0"


@dataclass(frozen=True)
class AlbertConfig:
    layers: int = 12  # applications of the one shared layer (the graph unrolls 12)
    heads: int = 12  # 768 / 64
    norm_eps: float = 1e-12  # ALBERT's LayerNorm epsilon, as in the graph


def _layer_norm(weights: KokoroWeights, prefix: str, eps: float) -> nn.LayerNorm:
    weight = weights[prefix + ".weight"]
    norm = nn.LayerNorm(weight.shape[0], eps=eps)
    norm.weight.data.copy_(weight)
    norm.bias.data.copy_(weights[prefix + ".bias"])
    return norm


class Albert(nn.Module):
    """``ids (B, T) -> (B, T, 768)``."""

    # Buffers, declared for the type checker (register_buffer sets them).
    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor

    def __init__(self, weights: KokoroWeights, config: AlbertConfig = AlbertConfig()) -> None:
        super().__init__()
        self.config = config
        embeddings = _ALBERT + ".embeddings"
        self.register_buffer("word", weights[embeddings + ".word_embeddings.weight"].clone())
        self.register_buffer("position", weights[embeddings + ".position_embeddings.weight"]
                             .clone())
        self.register_buffer("token_type", weights[embeddings + ".token_type_embeddings.weight"]
                             [0].clone())
        self.embedding_norm = _layer_norm(weights, embeddings + ".LayerNorm", config.norm_eps)
        self.mapping_in = linear(weights, _ALBERT + ".encoder.embedding_hidden_mapping_in")
        self.query = linear(weights, _LAYER + ".attention.query")
        self.key = linear(weights, _LAYER + ".attention.key")
        self.value = linear(weights, _LAYER + ".attention.value")
        self.dense = linear(weights, _LAYER + ".attention.dense")
        self.attention_norm = _layer_norm(weights, _LAYER + ".attention.LayerNorm",
                                          config.norm_eps)
        self.ffn = linear(weights, _LAYER + ".ffn")
        self.ffn_output = linear(weights, _LAYER + ".ffn_output")
        self.output_norm = _layer_norm(weights, _LAYER + ".full_layer_layer_norm",
                                       config.norm_eps)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        heads = self.config.heads

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, T, 768) -> (B, heads, T, 64)
            return t.view(batch, length, heads, width // heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(width // heads)
        context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, length, width)
        x = self.attention_norm(x + self.dense(context))
        hidden = F.gelu(self.ffn(x), approximate="tanh")
        return self.output_norm(x + self.ffn_output(hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.word[ids] + self.token_type + self.position[:length]
        x = self.mapping_in(self.embedding_norm(x))
        for _ in range(self.config.layers):
            x = self._layer(x)
        return x


class TextEncoder(nn.Module):
    """Embedding (512), three blocks of conv (k 5) -> LayerNorm over channels -> LeakyReLU,
    then a bidirectional LSTM. ``ids (B, T) -> (B, 512, T)``."""

    embedding: torch.Tensor  # a buffer (register_buffer sets it)

    def __init__(self, weights: KokoroWeights, prefix: str = "encoder.text_encoder") -> None:
        super().__init__()
        self.register_buffer("embedding", weights[prefix + ".embedding.weight"].clone())
        self.convs = nn.ModuleList(conv1d(weights, f"{prefix}.cnn.{i}.0") for i in range(3))
        self.norms = nn.ModuleList()
        for i in range(3):
            gamma = weights[f"{prefix}.cnn.{i}.1.gamma"]
            norm = nn.LayerNorm(gamma.shape[0], eps=NORM_EPS)
            norm.weight.data.copy_(gamma)
            norm.bias.data.copy_(weights[f"{prefix}.cnn.{i}.1.beta"])
            self.norms.append(norm)
        self.lstm = lstm(weights, prefix + ".lstm")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding[ids].transpose(1, 2)  # (B, 512, T)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = conv(x)
            x = F.leaky_relu(norm(x.transpose(1, 2)).transpose(1, 2), LEAKY_SLOPE)
        x = self.lstm(x.transpose(1, 2))  # (B, T, 512)
        return x.transpose(1, 2)
