"""VITS acoustic half, for inference: phoneme ids -> latent ``z`` for the HiFi-GAN decoder.

The text encoder (``enc_p``), the stochastic duration predictor (``dp``, run in reverse) and the
normalising flow (``flow``, in reverse) of VITS (Kim, Kong & Son, 2021) as Piper trains and
exports them, written as plain modules whose parameter names match the torch names kept in a
Piper ``.onnx`` (weights come from :func:`models.neural.voice_file.read_onnx_weights`). No training
code: the posterior encoder and the forward (training) flows are not here.

The model is split along its seams as Piper's own ``vits`` package is: this module holds the
config and the acoustic model (text encoder, duration predictor, :class:`VitsAcoustic`); the
transformer is in ``models.neural.attentions``, the flows in ``models.neural.flows``, their
building blocks (layer norm, DDS convolutions, WaveNet) in ``models.neural.modules``, and the
masks, length buckets and weight loader both halves share in ``models.neural.commons``.

Batches are padded; masks keep every item's result what it would be alone. The noise is drawn
per item from a CPU generator seeded with that item's seed, first the duration noise
``(2, L_i)`` then the latent noise ``(inter_channels, T_i)``, so neither the batch nor the
device changes an item's noise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from models.durations import scale_durations
from models.neural.attentions import Encoder
from models.neural.commons import (
    bucket_groups,
    default_max_batch,
    load_state,
    pad_step,
    sequence_mask,
)
from models.neural.flows import ConvFlow, ElementwiseAffine, Flip, ResidualCouplingBlock
from models.neural.modules import DDSConv
from models.neural.voice_file import OnnxWeights, read_onnx_weights

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class VitsConfig:
    """Shape of a VITS acoustic half; Piper's "medium" quality values as defaults."""

    n_vocab: int = 256  # rows of the phoneme embedding (the voice's num_symbols)
    inter_channels: int = 192  # channels of the latent z handed to the decoder
    hidden_channels: int = 192
    filter_channels: int = 768  # the text encoder's feed-forward width
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3  # the text encoder's feed-forward convolutions
    window_size: int = 4  # relative-position attention reaches +-4 phonemes
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_layers: int = 3  # dilated depth-separable convolutions per DDSConv
    dp_n_flows: int = 4  # spline flows; the first is unused in reverse (VITS drops it)
    dp_num_bins: int = 10
    dp_tail_bound: float = 5.0
    flow_n_flows: int = 4  # residual coupling layers, each followed by a flip
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    flow_n_layers: int = 4  # WaveNet layers per coupling
    n_speakers: int = 1
    gin_channels: int = 0  # speaker embedding width; 0 for one-speaker voices

    @classmethod
    def from_weights(cls, w: OnnxWeights) -> VitsConfig:
        """Read every size off the weights' shapes and the convolutions' attributes."""
        n_vocab, hidden = w.get("enc_p.emb.weight").shape
        rel = w.get("enc_p.encoder.attn_layers.0.emb_rel_k").shape  # (1, 2 * window + 1, d_k)
        ffn = w.get("enc_p.encoder.ffn_layers.0.conv_1.weight").shape  # (filter, hidden, k)
        dp_proj = w.get("dp.flows.3.proj.weight").shape  # (half * (3 * bins - 1), filter, 1)
        flow_in = w.get("flow.flows.0.enc.in_layers.0.weight").shape  # (2 * hidden, hidden, k)
        dilation_rate = 1
        if w.count("flow.flows.0.enc.in_layers.{}.weight") > 1:
            dilation_rate = int(w.conv_attrs["flow.flows.0.enc.in_layers.1"]["dilations"][0])
        n_speakers, gin = w.get("emb_g.weight").shape if w.has("emb_g.weight") else (1, 0)
        return cls(
            n_vocab=int(n_vocab),
            inter_channels=int(w.get("enc_p.proj.weight").shape[0] // 2),
            hidden_channels=int(hidden),
            filter_channels=int(ffn[0]),
            n_heads=int(hidden // rel[2]),
            n_layers=w.count("enc_p.encoder.attn_layers.{}.conv_q.weight"),
            kernel_size=int(ffn[2]),
            window_size=int((rel[1] - 1) // 2),
            dp_filter_channels=int(w.get("dp.pre.weight").shape[0]),
            dp_kernel_size=int(w.get("dp.convs.convs_sep.0.weight").shape[2]),
            dp_n_layers=w.count("dp.convs.convs_sep.{}.weight"),
            dp_n_flows=sum(w.has(f"dp.flows.{2 * i + 1}.pre.weight") for i in range(32)) + 1,
            dp_num_bins=int((dp_proj[0] + 1) // 3),
            flow_n_flows=sum(w.has(f"flow.flows.{2 * i}.pre.weight") for i in range(32)),
            flow_kernel_size=int(flow_in[2]),
            flow_dilation_rate=dilation_rate,
            flow_n_layers=w.count("flow.flows.0.enc.in_layers.{}.weight"),
            n_speakers=int(n_speakers),
            gin_channels=int(gin),
        )


class TextEncoder(nn.Module):
    """Phoneme ids -> hidden states and the prior's mean and log-std per phoneme."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.hidden_channels = cfg.hidden_channels
        self.inter_channels = cfg.inter_channels
        self.emb = nn.Embedding(cfg.n_vocab, cfg.hidden_channels)
        self.encoder = Encoder(cfg.hidden_channels, cfg.filter_channels, cfg.n_heads,
                               cfg.n_layers, cfg.kernel_size, cfg.window_size)
        self.proj = nn.Conv1d(cfg.hidden_channels, 2 * cfg.inter_channels, 1)

    def forward(
        self, ids: torch.Tensor, x_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ids`` ``(B, L)``, ``x_mask`` ``(B, 1, L)`` -> hidden ``(B, H, L)``, mean and log-std
        ``(B, inter, L)``."""
        x = self.emb(ids) * math.sqrt(self.hidden_channels)  # (B, L, H)
        x = self.encoder(x.transpose(1, 2) * x_mask, x_mask)
        stats = self.proj(x) * x_mask
        mean, log_std = torch.split(stats, self.inter_channels, dim=1)
        return x, mean, log_std


class StochasticDurationPredictor(nn.Module):
    """Log-durations per phoneme from noise, through spline flows conditioned on the text."""

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        filters = cfg.dp_filter_channels
        self.pre = nn.Conv1d(cfg.hidden_channels, filters, 1)
        self.convs = DDSConv(filters, cfg.dp_kernel_size, cfg.dp_n_layers)
        self.proj = nn.Conv1d(filters, filters, 1)
        if cfg.gin_channels:
            self.cond = nn.Conv1d(cfg.gin_channels, filters, 1)
        # Index layout of the trained module list: affine, then (spline, flip) pairs. In reverse
        # VITS skips the first spline flow, so the export has no weights for it.
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for i in range(cfg.dp_n_flows):
            flows.append(
                nn.Identity()
                if i == 0
                else ConvFlow(filters, cfg.dp_kernel_size, cfg.dp_n_layers, cfg.dp_num_bins,
                              cfg.dp_tail_bound)
            )
            flows.append(Flip())
        self.flows = nn.ModuleList(flows)

    def reverse(
        self, x: torch.Tensor, x_mask: torch.Tensor, noise: torch.Tensor,
        g: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, H, L)``, ``noise`` ``(B, 2, L)`` (already scaled) -> log-durations
        ``(B, 1, L)``."""
        x = self.pre(x)
        if g is not None:
            x = x + self.cond(g)
        x = self.proj(self.convs(x, x_mask)) * x_mask
        order = list(reversed(self.flows))
        order = order[:-2] + [order[-1]]  # the skipped spline flow, then the affine one
        z = noise
        for flow in order:
            z = flow.reverse(z, x_mask, g=x)  # type: ignore[operator]  # a flow module
        return z[:, :1]


class VitsStages(Protocol):
    """The tensor stages of :class:`VitsAcoustic`, as an inference engine runs them."""

    def encode_stage(self, ids: torch.Tensor, x_mask: torch.Tensor, dp_noise: torch.Tensor,
                     g: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def flow_stage(self, z_p: torch.Tensor, y_mask: torch.Tensor,
                   g: torch.Tensor | None = None) -> torch.Tensor: ...


class VitsOutput(NamedTuple):
    """What :meth:`VitsAcoustic.infer` returns."""

    z: torch.Tensor  # (B, inter_channels, T_max) float32, zero past each item's frames
    frame_lengths: torch.Tensor  # (B,) int64: frames per item (audio = frames * hop samples)
    durations: torch.Tensor  # (B, L_max) int64: frames per phoneme id, 0 past each item


class _Priors(NamedTuple):
    """What the encode stage hands the flow stage, per item of the batch."""

    durations: list[torch.Tensor]  # (L_i,) int64: frames per phoneme id
    means: list[torch.Tensor]  # (inter_channels, L_i): the prior's mean per phoneme id
    log_stds: list[torch.Tensor]  # (inter_channels, L_i): its log-std


class VitsAcoustic(nn.Module):
    """Phoneme ids -> latent ``z`` (VITS ``enc_p`` + ``dp`` + ``flow`` in reverse).

    Build with :meth:`from_checkpoint` (a Piper ``.onnx``); the module is in eval mode and
    every call runs under ``torch.inference_mode``.
    """

    def __init__(self, cfg: VitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.enc_p = TextEncoder(cfg)
        self.dp = StochasticDurationPredictor(cfg)
        self.flow = ResidualCouplingBlock(
            cfg.inter_channels, cfg.hidden_channels, cfg.flow_kernel_size,
            cfg.flow_dilation_rate, cfg.flow_n_layers, cfg.flow_n_flows, cfg.gin_channels)
        if cfg.n_speakers > 1:
            self.emb_g = nn.Embedding(cfg.n_speakers, cfg.gin_channels)
        # What runs the two tensor stages (:meth:`encode_stage`, :meth:`flow_stage`): None,
        # these modules in eager torch; or the same stages compiled by an inference engine
        # (models/engine.py). The noise, the durations and the alignment stay here either way.
        self.stages: VitsStages | None = None

    @property
    def device(self) -> torch.device:
        return self.enc_p.proj.weight.device

    def encode_stage(
        self, ids: torch.Tensor, x_mask: torch.Tensor, dp_noise: torch.Tensor,
        g: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Text encoder and duration predictor: ``ids`` ``(B, L)`` (zero past each item),
        ``x_mask`` ``(B, 1, L)``, ``dp_noise`` ``(B, 2, L)`` already scaled by ``noise_w`` ->
        the prior's mean and log-std ``(B, inter, L)`` and log-durations ``(B, 1, L)``."""
        hidden, mean, log_std = self.enc_p(ids, x_mask)
        return mean, log_std, self.dp.reverse(hidden, x_mask, dp_noise, g=g)

    def flow_stage(self, z_p: torch.Tensor, y_mask: torch.Tensor,
                   g: torch.Tensor | None = None) -> torch.Tensor:
        """The flow in reverse: prior sample ``z_p`` ``(B, inter, T)`` (noise already in it),
        ``y_mask`` ``(B, 1, T)`` -> latent ``z`` ``(B, inter, T)``, zero past each item."""
        return self.flow.reverse(z_p * y_mask, y_mask, g=g) * y_mask

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> VitsAcoustic:
        """Load the acoustic half of a Piper ``.onnx`` onto ``device``, in eval mode.

        Raises:
            VoiceFileError: the file is missing, unreadable, or lacks a weight this needs.
        """
        return cls.from_weights(read_onnx_weights(path), device)

    @classmethod
    def from_weights(cls, weights: OnnxWeights, device: str | torch.device = "cpu"
                     ) -> VitsAcoustic:
        """Build from weights already read with :func:`read_onnx_weights`."""
        model = cls(VitsConfig.from_weights(weights))
        prefixes = ("enc_p.", "dp.", "flow.", "emb_g.")
        state = {k: v for k, v in weights.tensors.items() if k.startswith(prefixes)}
        load_state(model, state, weights.source)
        return model.to(device).eval()

    def _speaker_ids(self, sid: torch.Tensor | Sequence[int] | None, batch: int) -> list[int]:
        if sid is None:
            return [0] * batch
        speakers = [int(s) for s in torch.as_tensor(sid).reshape(-1).tolist()]
        if len(speakers) != batch:
            raise ValueError(f"need {batch} speaker ids, got {len(speakers)}")
        if any(not 0 <= s < self.cfg.n_speakers for s in speakers):
            raise ValueError(f"speaker ids must be in 0..{self.cfg.n_speakers - 1}: {speakers}")
        return speakers

    def _speaker_embedding(self, speakers: list[int], group: list[int]) -> torch.Tensor | None:
        """``(G, gin, 1)`` speaker embeddings of ``group``'s items; None for one speaker."""
        if self.cfg.n_speakers <= 1:
            return None
        sid = torch.tensor([speakers[i] for i in group], dtype=torch.long, device=self.device)
        return self.emb_g(sid).unsqueeze(-1)

    @torch.inference_mode()
    def infer(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        seeds: Sequence[int] | None = None,
        sid: torch.Tensor | Sequence[int] | None = None,
        noise_scale: float = 0.667,
        length_scale: float = 1.0,
        noise_w: float = 0.8,
        max_batch: int | None = None,
        speed: float = 1.0,
    ) -> VitsOutput:
        """Latents for a padded batch.

        Args:
            ids: ``(B, L_max)`` int64 phoneme ids (see ``models.neural.voice_file.ids_for``).
            lengths: ``(B,)`` ids per item.
            seeds: one integer per item for its noise; the same seed and ids give the same
                ``z`` bit for bit, whatever else is in the batch. Default 0 for every item.
            sid: ``(B,)`` speaker indices for a multi-speaker voice (default speaker 0).
            noise_scale, length_scale, noise_w: as in the voice's config (``length_scale`` > 1
                is slower speech): each phoneme's frames are the ceiling of its scaled
                duration, as Piper gives them.
            speed: > 1 faster; stretches those frames as one piece
                (:func:`models.durations.scale_durations`), so the length is the speed's
                factor of 1.0's (dividing ``length_scale`` would round each phoneme up on
                its own, and a sentence's ceilings add up: docs/models.md, "Speaking speed").
            max_batch: items per sub-batch; default
                :func:`models.neural.commons.default_max_batch` for the device.

        Items run in sub-batches of similar length, each padded to its bucket
        (:func:`models.neural.commons.bucket_length`; on CPU a multiple of
        ``models.neural.commons.CPU_PAD_STEP``): kernels' rounding
        depends on the padded length, so padding an item to its own bucket rather than to
        the batch's longest keeps its result independent of the other items (bit for bit
        with one item per sub-batch).
        """
        ids = torch.as_tensor(ids, dtype=torch.long)
        host_lengths, item_seeds = self._check_batch(ids, lengths, seeds)
        speakers = self._speaker_ids(sid, len(host_lengths))
        generators = [torch.Generator().manual_seed(s) for s in item_seeds]
        max_batch = max_batch or default_max_batch(self.device)
        priors = self._encode(ids, host_lengths, speakers, generators, noise_w,
                              (length_scale, speed), max_batch)
        frames = [max(1, int(d.sum())) for d in priors.durations]
        z_items = self._flow(priors, frames, speakers, generators, noise_scale, max_batch)
        return self._assemble(z_items, frames, priors.durations, host_lengths, ids.shape[1])

    @staticmethod
    def _check_batch(ids: torch.Tensor, lengths: torch.Tensor, seeds: Sequence[int] | None
                     ) -> tuple[list[int], list[int]]:
        """Each item's length and seed as host ints, checked against ``ids`` ``(B, L_max)``."""
        batch, max_len = ids.shape
        host_lengths = [int(n) for n in torch.as_tensor(lengths).reshape(-1).tolist()]
        item_seeds = [0] * batch if seeds is None else [int(s) for s in seeds]
        if len(item_seeds) != batch or len(host_lengths) != batch:
            raise ValueError(f"need {batch} seeds and lengths, got {len(item_seeds)}, "
                             f"{len(host_lengths)}")
        if min(host_lengths, default=1) < 1 or max(host_lengths, default=0) > max_len:
            raise ValueError(f"lengths must be in 1..{max_len}, got {host_lengths}")
        return host_lengths, item_seeds

    def _encode(self, ids: torch.Tensor, lengths: list[int], speakers: list[int],
                generators: list[torch.Generator], noise_w: float,
                scales: tuple[float, float], max_batch: int) -> _Priors:
        """Text encoder and durations, per bucket of phoneme lengths; draws each item's
        duration noise ``(2, L_i)`` from its generator. ``scales``: the length scale and the
        speed, as ``infer`` takes them."""
        length_scale, speed = scales
        device, stages = self.device, self.stages or self
        batch, max_len = ids.shape
        priors = _Priors([torch.empty(0)] * batch, [torch.empty(0)] * batch,
                         [torch.empty(0)] * batch)
        for group, padded in bucket_groups(lengths, max_batch, pad_step(device)):
            n = [lengths[i] for i in group]
            x = ids[group, :padded] if padded <= max_len else F.pad(ids[group],
                                                                     (0, padded - max_len))
            x_mask = sequence_mask(torch.tensor(n), padded).unsqueeze(1).float().to(device)
            g = self._speaker_embedding(speakers, group)
            noise = torch.zeros(len(group), 2, padded)
            for k, i in enumerate(group):
                noise[k, :, : n[k]] = torch.randn(2, n[k], generator=generators[i])
            mean, log_std, log_w = stages.encode_stage(
                x.to(device) * x_mask[:, 0].long(), x_mask, noise.to(device) * noise_w, g)
            w_ceil = torch.ceil(torch.exp(log_w) * x_mask * length_scale)[:, 0]  # (G, L)
            for k, i in enumerate(group):
                ceilings = w_ceil[k, : n[k]].long()
                priors.durations[i] = ceilings if speed == 1.0 else torch.tensor(
                    scale_durations(ceilings.tolist(), speed), dtype=torch.long,
                    device=ceilings.device)
                priors.means[i] = mean[k, :, : n[k]]
                priors.log_stds[i] = log_std[k, :, : n[k]]
        return priors

    def _flow(self, priors: _Priors, frames: list[int], speakers: list[int],
              generators: list[torch.Generator], noise_scale: float, max_batch: int
              ) -> list[torch.Tensor]:
        """The prior sampled per frame and the flow, per bucket of frame lengths: each item's
        ``z`` ``(inter_channels, T_i)``."""
        device, stages = self.device, self.stages or self
        z_items: list[torch.Tensor] = [torch.empty(0)] * len(frames)
        for group, padded in bucket_groups(frames, max_batch, pad_step(device)):
            z_p = torch.zeros(len(group), self.cfg.inter_channels, padded, device=device)
            for k, i in enumerate(group):
                sample = self._sample_prior(priors.means[i], priors.log_stds[i],
                                            priors.durations[i], frames[i], generators[i],
                                            noise_scale)
                z_p[k, :, : sample.shape[1]] = sample
            y_mask = sequence_mask(torch.tensor([frames[i] for i in group]), padded)
            y_mask = y_mask.unsqueeze(1).float().to(device)
            g = self._speaker_embedding(speakers, group)
            z = stages.flow_stage(z_p, y_mask, g)
            for k, i in enumerate(group):
                z_items[i] = z[k, :, : frames[i]]
        return z_items

    def _sample_prior(self, mean: torch.Tensor, log_std: torch.Tensor, durations: torch.Tensor,
                      frames: int, generator: torch.Generator, noise_scale: float
                      ) -> torch.Tensor:
        """One item's prior sample ``(inter_channels, t)``: each frame takes the prior of the
        phoneme whose span covers it; draws the item's latent noise
        ``(inter_channels, frames)`` from its generator."""
        mean_frames = torch.repeat_interleave(mean, durations, dim=1)
        log_std_frames = torch.repeat_interleave(log_std, durations, dim=1)
        noise = torch.randn(self.cfg.inter_channels, frames, generator=generator).to(self.device)
        t = mean_frames.shape[1]  # == frames unless every duration rounded to 0
        return mean_frames + noise[:, :t] * torch.exp(log_std_frames) * noise_scale

    def _assemble(self, z_items: list[torch.Tensor], frames: list[int],
                  durations: list[torch.Tensor], lengths: list[int], max_len: int
                  ) -> VitsOutput:
        """The items' latents and durations padded back into one batch."""
        device, batch = self.device, len(z_items)
        z = torch.zeros(batch, self.cfg.inter_channels, max(frames), device=device)
        duration_table = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        for i in range(batch):
            z[i, :, : frames[i]] = z_items[i]
            duration_table[i, : lengths[i]] = durations[i]
        frame_lengths = torch.tensor(frames, dtype=torch.long, device=device)
        return VitsOutput(z=z, frame_lengths=frame_lengths, durations=duration_table)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, **kwargs) -> VitsOutput:
        return self.infer(ids, lengths, **kwargs)

