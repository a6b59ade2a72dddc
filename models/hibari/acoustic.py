"""The hibari acoustic half: phoneme ids -> durations -> prosody -> the decoder's 130-channel
frames plus f0 (131 floats per 12.5 ms frame), batched with masks.

Two text encoders read the same ids: ``pn.text`` (192 channels) feeds the duration head and the
prosody stack, ``m.text`` (128 channels) is what the decoder hears. Each is an embedding, two
ConvNeXt blocks (kernel 5) and one pre-norm transformer layer (2 heads, no positional encoding:
the convolutions carry position) applied several times with the same weights (4 times in
``m.text``, 6 in ``pn.text``: the graph repeats the layer), then a LayerNorm.

Durations are counted by the graph in 25 ms steps (two decoder frames): ``exp(d) - 1`` rounded
half to even, at least 1, is the graph's own at speed 1.0. The graph divides by the speed
before that rounding, which let the error pile up over a sentence (docs/models.md, "Speaking
speed"); here the speed stretches the 1.0 steps as one piece instead (``models.durations``:
the running total rounded, at least one step each), so a sentence lasts its 1.0 length /
speed within half a step, and 1.0 stays the graph's. The prosody stack runs at that 25 ms
rate and emits 4 channels, which interleave into two 12.5 ms tracks: f0 (x100, Hz) and a
level track (x5). The decoder's input is the ``m.text`` encoding with each id's vector held
for its frames, then ``log(1 + relu(f0)) / 5`` and the level track.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.durations import scale_durations
from models.hibari.layers import ConvNeXtBlock, conv1d, gelu, layer_norm, lengths_mask, quant_linear
from models.hibari.weights import HibariWeights, QuantizedMatrix

_LOGGER = logging.getLogger(__name__)

N_VOCAB = 178
FRAMES_PER_STEP = 2  # decoder frames (12.5 ms) per duration step (25 ms)
DECODER_CHANNELS = 130
F0_SCALE = 100.0  # the prosody output's f0 track, in hundreds of Hz
LEVEL_SCALE = 5.0


@dataclass(frozen=True)
class AcousticConfig:
    """What the graph fixes; a different export would need different numbers."""

    text_layers: int = 4  # m.text: the shared transformer layer, applied 4 times
    prosody_text_layers: int = 6  # pn.text: applied 6 times
    heads: int = 2
    prosody_blocks: int = 6


class SelfAttentionLayer(nn.Module):
    """Pre-norm transformer layer (``nn.TransformerEncoderLayer(norm_first=True)``'s layout, GELU),
    int8 projections. ``(B, L, C) -> (B, L, C)``; ``key_mask`` ``(B, L)`` bool, True = valid."""

    def __init__(self, floats: dict[str, torch.Tensor], matrices: dict[str, QuantizedMatrix],
                 prefix: str, heads: int, exact: bool) -> None:
        super().__init__()
        dim = floats[prefix + ".norm1.weight"].shape[0]
        self.heads = heads
        self.head_dim = dim // heads
        self.norm1 = layer_norm(floats, prefix + ".norm1", dim)
        self.norm2 = layer_norm(floats, prefix + ".norm2", dim)
        self.in_proj = quant_linear(floats, matrices, prefix + ".self_attn", exact,
                                    bias="in_proj_bias", weight="in_proj_weight")
        self.out_proj = quant_linear(floats, matrices, prefix + ".self_attn.out_proj", exact)
        self.linear1 = quant_linear(floats, matrices, prefix + ".linear1", exact)
        self.linear2 = quant_linear(floats, matrices, prefix + ".linear2", exact)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.in_proj(self.norm1(x), mask)  # (B, L, 3C)
        q, k, v = (t.reshape(batch, length, self.heads, self.head_dim).transpose(1, 2)
                   for t in qkv.split(dim, dim=-1))  # (B, H, L, hd)
        scores = (q @ k.transpose(2, 3)) / (self.head_dim ** 0.5)  # (B, H, L, L)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None] <= 0, -torch.inf)
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, length, dim)
        x = x + self.out_proj(attended, mask)
        return x + self.linear2(gelu(self.linear1(self.norm2(x), mask)), mask)


class TextEncoder(nn.Module):
    """ids ``(B, L)`` -> ``(B, C, L)``."""

    def __init__(self, weights: HibariWeights, prefix: str, repeats: int, heads: int,
                 exact: bool) -> None:
        super().__init__()
        floats, matrices = weights.subset(prefix)
        self.emb = nn.Embedding.from_pretrained(floats["emb.weight"], freeze=True)
        self.convs = nn.ModuleList(ConvNeXtBlock(floats, matrices, f"convs.{i}", exact)
                                   for i in range(2))
        self.attn = SelfAttentionLayer(floats, matrices, "attn", heads, exact)
        self.repeats = repeats
        self.norm = layer_norm(floats, "norm", self.emb.embedding_dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.emb(ids).transpose(1, 2)  # (B, C, L)
        for conv in self.convs:
            x = conv(x, mask)
        x = x.transpose(1, 2)  # (B, L, C)
        for _ in range(self.repeats):
            x = self.attn(x, mask)
        return self.norm(x).transpose(1, 2)


@dataclass
class AcousticOutput:
    """``frames``: per segment ``(131, F)`` (130 decoder-input channels, then f0 in Hz);
    ``durations``: per segment, decoder frames per input id (they sum to F)."""

    frames: list[torch.Tensor]
    durations: list[list[int]]


class HibariAcoustic(nn.Module):
    """ids -> durations -> prosody -> 131-channel frames, for a padded batch."""

    def __init__(self, weights: HibariWeights, cfg: AcousticConfig | None = None,
                 exact: bool = True) -> None:
        super().__init__()
        self.cfg = cfg = cfg or AcousticConfig()
        self.text = TextEncoder(weights, "m.text.", cfg.text_layers, cfg.heads, exact)
        self.prosody_text = TextEncoder(weights, "pn.text.", cfg.prosody_text_layers, cfg.heads,
                                        exact)
        floats, matrices = weights.subset("pn.")
        self.dur_conv = conv1d(floats, "dur.0")  # 192 -> 192, kernel 3
        self.dur_out = conv1d(floats, "dur.2")  # 192 -> 1
        self.pro_in = conv1d(floats, "pro_in")
        self.pro = nn.ModuleList(ConvNeXtBlock(floats, matrices, f"pro.{i}", exact)
                                 for i in range(cfg.prosody_blocks))
        self.pro_out = conv1d(floats, "pro_out")  # 192 -> 4

    @property
    def device(self) -> torch.device:
        return self.dur_out.weight.device

    def durations(self, hidden: torch.Tensor, mask: torch.Tensor | None,
                  speed: float) -> torch.Tensor:
        """``(B, 192, L)`` -> steps of 25 ms per id ``(B, L)`` int64 (0 on padding): the
        graph's steps at speed 1.0, stretched by ``speed`` as one piece."""
        h = gelu(self.dur_conv(hidden if mask is None else hidden * mask))
        log_steps = self.dur_out(h)[:, 0]  # (B, L)
        steps = torch.round(torch.exp(log_steps) - 1.0).clamp(min=1.0).long()
        steps = steps if mask is None else steps * mask[:, 0].long()
        if speed == 1.0:
            return steps
        return torch.tensor([scale_durations(row, speed) for row in steps.tolist()],
                            dtype=torch.long, device=steps.device)

    @torch.inference_mode()
    def forward(self, id_lists: list[list[int]], speed: float = 1.0) -> AcousticOutput:
        """Each list is one segment's ids (with the 0 pads at both ends, as ``voice.ids`` gives)."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        device = self.device
        lengths = torch.tensor([len(ids) for ids in id_lists], device=device)
        ids = torch.zeros(len(id_lists), int(lengths.max()), dtype=torch.long, device=device)
        for row, seq in enumerate(id_lists):
            ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        batch, length = ids.shape
        mask = lengths_mask(lengths, length) if int(lengths.min()) < length else None

        text = self.text(ids, mask)  # (B, 128, L)
        prosody_text = self.prosody_text(ids, mask)  # (B, 192, L)
        steps = self.durations(prosody_text, mask, speed)  # (B, L)

        # Each id's vectors held for its steps: gather indices per segment, padded to the longest.
        n_steps = steps.sum(dim=1)  # (B,)
        longest = int(n_steps.max())
        index = torch.zeros(batch, longest, dtype=torch.long, device=device)
        for row in range(batch):
            index[row, : int(n_steps[row])] = torch.repeat_interleave(
                torch.arange(length, device=device), steps[row])
        step_mask = lengths_mask(n_steps, longest) if int(n_steps.min()) < longest else None
        text_steps = text.gather(2, index[:, None].expand(-1, text.shape[1], -1))  # (B,128,S)
        prosody_steps = prosody_text.gather(2, index[:, None].expand(-1, prosody_text.shape[1],
                                                                     -1))  # (B, 192, S)

        p = self.pro_in(prosody_steps)
        for block in self.pro:
            p = block(p, step_mask)
        p = self.pro_out(p)  # (B, 4, S): two tracks, two 12.5 ms values per step each
        tracks = p.reshape(batch, 2, 2, longest).transpose(2, 3).reshape(batch, 2, 2 * longest)
        f0 = tracks[:, 0] * F0_SCALE  # (B, F)
        level = tracks[:, 1] * LEVEL_SCALE
        held = text_steps[..., None].expand(-1, -1, -1, FRAMES_PER_STEP).reshape(
            batch, text.shape[1], FRAMES_PER_STEP * longest)  # (B, 128, F)
        frames = torch.cat([held, (torch.log(1.0 + F.relu(f0)) / 5.0)[:, None],
                            (level / 5.0)[:, None], f0[:, None]], dim=1)  # (B, 131, F)

        out_frames, out_durations = [], []
        for row in range(batch):
            n_frames = FRAMES_PER_STEP * int(n_steps[row])
            out_frames.append(frames[row, :, :n_frames].clone())
            out_durations.append([FRAMES_PER_STEP * int(s)
                                  for s in steps[row, : int(lengths[row])].tolist()])
        return AcousticOutput(out_frames, out_durations)
