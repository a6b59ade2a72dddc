"""HiFi-GAN generator of a VITS voice, for inference: latent ``z`` -> waveform.

The ``dec`` module of VITS (Kong, Kim & Bae, 2020, as VITS and Piper use it): ``conv_pre``,
transposed-convolution upsampling with multi-receptive-field residual blocks, ``conv_post``,
``tanh``, and a ``cond`` layer adding a speaker embedding for multi-speaker voices. Weight norm
is already folded into the exported weights, so the layers here are plain convolutions whose
names match the torch names kept in a Piper ``.onnx``.

A padded batch gives each item what it would get alone: every convolution's input is zeroed
past the item's end, which is what the zero padding of a lone item's convolutions sees.
:meth:`HifiganDecoder.decode_windowed` renders a long latent in windows with context frames on
each side, for bounded memory and for streaming.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from models.neural.commons import (
    bucket_groups,
    default_max_batch,
    load_state,
    pad_step,
    sequence_mask,
)
from models.neural.voice_file import HOP_LENGTH, OnnxWeights, VoiceFileError, read_onnx_weights

_LOGGER = logging.getLogger(__name__)

LRELU_SLOPE = 0.1


@dataclass(frozen=True)
class HifiganConfig:
    """Shape of the generator; Piper's "medium" quality values as defaults."""

    in_channels: int = 192  # the latent's channels
    upsample_initial_channel: int = 256
    upsample_rates: tuple[int, ...] = (8, 8, 4)  # product = hop length (256)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    upsample_paddings: tuple[int, ...] = (4, 4, 2)  # (kernel - rate) // 2
    resblock: str = "2"  # "1": convs1/convs2 pairs per dilation; "2": one conv per dilation
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    post_bias: bool = False
    n_speakers: int = 1
    gin_channels: int = 0

    @property
    def hop_length(self) -> int:
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop

    @classmethod
    def from_weights(cls, w: OnnxWeights) -> HifiganConfig:
        """Read every size off the weights' shapes and the convolutions' attributes."""
        pre = w.get("dec.conv_pre.weight").shape  # (initial, in, 7)
        n_ups = w.count("dec.ups.{}.weight")
        rates, kernels, paddings = [], [], []
        for i in range(n_ups):
            attrs = w.conv_attrs.get(f"dec.ups.{i}", {})
            kernel = int(w.get(f"dec.ups.{i}.weight").shape[2])
            rate = int(attrs.get("strides", [kernel // 2])[0])
            kernels.append(kernel)
            rates.append(rate)
            paddings.append(int(attrs.get("pads", [(kernel - rate) // 2])[0]))
        n_blocks = w.count("dec.resblocks.{}.convs.0.weight")
        resblock = "2"
        if n_blocks == 0:
            n_blocks = w.count("dec.resblocks.{}.convs1.0.weight")
            resblock = "1"
        if n_ups == 0 or n_blocks == 0 or n_blocks % n_ups:
            raise VoiceFileError(w.source, f"decoder has {n_ups} upsamplers, {n_blocks} resblocks")
        per_stage = n_blocks // n_ups
        layer = "convs" if resblock == "2" else "convs1"
        kernel_sizes, dilations = [], []
        for j in range(per_stage):
            kernel_sizes.append(int(w.get(f"dec.resblocks.{j}.{layer}.0.weight").shape[2]))
            n_convs = w.count(f"dec.resblocks.{j}.{layer}.{{}}.weight")
            dilations.append(tuple(
                int(w.conv_attrs.get(f"dec.resblocks.{j}.{layer}.{k}", {}).get("dilations", [1])[0])
                for k in range(n_convs)
            ))
        n_speakers, gin = w.get("emb_g.weight").shape if w.has("emb_g.weight") else (1, 0)
        return cls(
            in_channels=int(pre[1]),
            upsample_initial_channel=int(pre[0]),
            upsample_rates=tuple(rates),
            upsample_kernel_sizes=tuple(kernels),
            upsample_paddings=tuple(paddings),
            resblock=resblock,
            resblock_kernel_sizes=tuple(kernel_sizes),
            resblock_dilation_sizes=tuple(dilations),
            post_bias=w.has("dec.conv_post.bias"),
            n_speakers=int(n_speakers),
            gin_channels=int(gin),
        )


def _same_conv(channels: int, kernel_size: int, dilation: int) -> nn.Conv1d:
    return nn.Conv1d(channels, channels, kernel_size, dilation=dilation,
                     padding=(kernel_size * dilation - dilation) // 2)


class ResBlock2(nn.Module):
    """One dilated convolution per dilation, each residual: the "medium"/"low" voices' block."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(_same_conv(channels, kernel_size, d) for d in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for conv in self.convs:
            xt = F.leaky_relu(x, LRELU_SLOPE)
            if mask is not None:
                xt = xt * mask
            x = x + conv(xt)
        return x if mask is None else x * mask


class ResBlock1(nn.Module):
    """A dilated then an undilated convolution per dilation: the "high" voices' block."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_same_conv(channels, kernel_size, d) for d in dilations)
        self.convs2 = nn.ModuleList(_same_conv(channels, kernel_size, 1) for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for conv1, conv2 in zip(self.convs1, self.convs2, strict=True):
            xt = F.leaky_relu(x, LRELU_SLOPE)
            if mask is not None:
                xt = xt * mask
            xt = F.leaky_relu(conv1(xt), LRELU_SLOPE)
            if mask is not None:
                xt = xt * mask
            x = x + conv2(xt)
        return x if mask is None else x * mask


@dataclass(frozen=True)
class Window:
    """One window of :meth:`HifiganDecoder.decode_windowed`, in frames: render
    ``[lo, hi)``, keep ``[start, end)``."""

    lo: int
    start: int
    end: int
    hi: int

    @classmethod
    def whole(cls, n_frames: int) -> Window:
        """The window that is a whole latent of ``n_frames`` frames, no context."""
        return cls(0, 0, n_frames, n_frames)


def plan_windows(n_frames: int, window: int, context: int, growth: int = 1) -> list[Window]:
    """Cut ``n_frames`` into windows with ``context`` frames each side (fewer at the ends of
    the latent): the first of ``window`` frames, each next ``growth`` times the one before."""
    if window < 1 or context < 0 or growth < 1:
        raise ValueError(f"window and growth must be >= 1 and context >= 0, "
                         f"got {window}, {growth}, {context}")
    plan, start, size = [], 0, window
    while start < n_frames:
        end = min(n_frames, start + size)
        plan.append(Window(max(0, start - context), start, end, min(n_frames, end + context)))
        start, size = end, size * growth
    return plan


def stream_windows(n_frames: int, window: int, context: int, growth: int = 1) -> list[Window]:
    """``plan_windows``, with a last window shorter than half its size joined to the one before
    (a few frames of tail would cost a whole context's rendering for a chunk too short to
    matter); the first window, which first audio waits for, keeps its size. The windows a
    neural vocoder streams a segment in."""
    plan = plan_windows(n_frames, window, context, growth)
    size = window * growth ** (len(plan) - 1)
    short = window // 2 if len(plan) == 2 else size // 2
    if len(plan) > 1 and plan[-1].end - plan[-1].start < short:
        before, tail = plan[-2], plan[-1]
        plan[-2:] = [Window(before.lo, before.start, tail.end, tail.hi)]
    return plan


class PhaseConvTranspose1d(nn.ConvTranspose1d):
    """A transposed convolution (the same parameters and state dict) computed as an ordinary
    one: output sample ``q * stride + r`` is a short correlation of the input around frame
    ``q`` with the kernel taps of phase ``r``, so one ``Conv1d`` into ``stride`` phases per
    output channel, interleaved, gives the same numbers with the same multiplications. CPU
    engines run ordinary convolutions far faster than transposed ones (OpenVINO: the two
    8x upsamplers took 58 of a 400-frame decode's 262 ms as transposed convolutions and 37 ms
    as this; docs/benchmarks.md, "Inference engines").

    For the upsamplers whose output is exactly ``stride`` times the input (``kernel - 2 *
    padding == stride``, every VITS voice's); any other shape runs as the transposed
    convolution it is.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        kernel, stride, pad = self._sizes()
        self.phased = (kernel - 2 * pad == stride and self.groups == 1
                       and self.dilation == (1,) and self.output_padding == (0,))
        # The ordinary convolution's weight and bias: buffers, so they move with the module,
        # derived again whenever a state dict is loaded (weights changed in place otherwise
        # are not seen). Derived outside forward, so a trace holds them as constants.
        self.register_buffer("phase_weight", None, persistent=False)
        self.register_buffer("phase_bias", None, persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.derive_phases())
        self.derive_phases()

    def _sizes(self) -> tuple[int, int, int]:
        """(kernel, stride, padding) of this one-dimensional layer, as numbers."""
        padding = self.padding
        if isinstance(padding, str):  # torch's type allows "same"; a transposed one has none
            raise ValueError(f"padding {padding!r}: a transposed convolution takes numbers")
        return int(self.kernel_size[0]), int(self.stride[0]), int(padding[0])

    @torch.no_grad()
    def derive_phases(self) -> None:
        """``phase_weight`` ``(out * stride, in, taps)`` and ``phase_bias`` from the weights."""
        if not self.phased:
            return
        kernel, stride, pad = self._sizes()
        # Output q * stride + r takes input q + a - m through kernel tap m * stride + b, where
        # (a, b) = divmod(r + pad, stride): offsets a - m around frame q.
        taps = {}
        for r in range(stride):
            a, b = divmod(r + pad, stride)
            for m in range(-(-(kernel - b) // stride)):
                taps[(r, a - m)] = m * stride + b
        low, high = min(d for _, d in taps), max(d for _, d in taps)
        w = self.weight.detach()  # (in, out, kernel)
        phases = w.new_zeros(self.out_channels, stride, self.in_channels, high - low + 1)
        for (r, offset), k in taps.items():
            phases[:, r, :, offset - low] = w[:, :, k].t()
        self.phase_weight = phases.reshape(-1, self.in_channels, high - low + 1)
        self.phase_bias = (self.bias.detach().repeat_interleave(stride)
                           if self.bias is not None else None)
        self.phase_padding = (-low, high)

    def forward(self, x: torch.Tensor, output_size=None) -> torch.Tensor:
        if not self.phased or output_size is not None:
            return super().forward(x, output_size)
        y = F.conv1d(F.pad(x, self.phase_padding), self.phase_weight, self.phase_bias)
        batch, _, frames = y.shape  # y: (B, out * stride, T)
        stride = self.stride[0]
        # -1, not frames * stride: traced for a compiled graph, that product of sizes is an
        # integer op of its own, and NNCF's int8 quantisers are placed by op order, so the
        # traced graph must run the same ops as the eager module it was calibrated on.
        return (y.view(batch, self.out_channels, stride, frames).transpose(2, 3)
                .reshape(batch, self.out_channels, -1))


class DecoderStages(Protocol):
    """The tensor stage of :class:`HifiganDecoder`, as an inference engine runs it."""

    def decode_stage(self, z: torch.Tensor, lengths: torch.Tensor,
                     sid: torch.Tensor | None = None) -> torch.Tensor: ...


class HifiganDecoder(nn.Module):
    """Latent ``z`` ``(B, in_channels, T)`` -> float32 audio ``(B, T * hop)`` in [-1, 1].

    Build with :meth:`from_checkpoint` (a Piper ``.onnx``); eval mode, ``inference_mode``.
    """

    def __init__(self, cfg: HifiganConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(cfg.in_channels, cfg.upsample_initial_channel, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        block = ResBlock2 if cfg.resblock == "2" else ResBlock1
        channels = cfg.upsample_initial_channel
        for rate, kernel, padding in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes,
                                         cfg.upsample_paddings, strict=True):
            self.ups.append(PhaseConvTranspose1d(channels, channels // 2, kernel, rate, padding))
            channels //= 2
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(block(channels, k, d))
        self.conv_post = nn.Conv1d(channels, 1, 7, padding=3, bias=cfg.post_bias)
        if cfg.gin_channels:
            self.cond = nn.Conv1d(cfg.gin_channels, cfg.upsample_initial_channel, 1)
        if cfg.n_speakers > 1:
            # The speaker table lives at the top of a VITS model; the decoder keeps a copy so
            # the vocoder pool needs only speaker ids.
            self.emb_g = nn.Embedding(cfg.n_speakers, cfg.gin_channels)
        # What runs :meth:`decode_stage`: None, these modules in eager torch; or the same
        # stage compiled by an inference engine (models/engine.py).
        self.stages: DecoderStages | None = None

    @property
    def hop_length(self) -> int:
        return self.cfg.hop_length

    @property
    def device(self) -> torch.device:
        return self.conv_pre.weight.device

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu"
                        ) -> HifiganDecoder:
        """Load the decoder of a Piper ``.onnx`` onto ``device``, in eval mode.

        Raises:
            VoiceFileError: the file is missing, unreadable, or lacks a weight this needs.
        """
        return cls.from_weights(read_onnx_weights(path), device)

    @classmethod
    def from_weights(cls, weights: OnnxWeights, device: str | torch.device = "cpu"
                     ) -> HifiganDecoder:
        """Build from weights already read with :func:`read_onnx_weights`."""
        cfg = HifiganConfig.from_weights(weights)
        if cfg.hop_length != HOP_LENGTH:
            _LOGGER.warning("%s: decoder hop is %d, not %d", weights.source, cfg.hop_length,
                            HOP_LENGTH)
        model = cls(cfg)
        state = {k[len("dec."):]: v for k, v in weights.tensors.items() if k.startswith("dec.")}
        if cfg.n_speakers > 1:
            state["emb_g.weight"] = weights.get("emb_g.weight")
        load_state(model, state, weights.source)
        return model.to(device).eval()

    @torch.inference_mode()
    def decode(
        self,
        z: torch.Tensor,
        lengths: torch.Tensor | Sequence[int] | None = None,
        sid: torch.Tensor | Sequence[int] | None = None,
        max_batch: int | None = None,
    ) -> torch.Tensor:
        """Waveforms for a padded batch of latents.

        Items run in sub-batches of similar length (at most ``max_batch``, default
        :func:`models.neural.commons.default_max_batch`), each padded to its bucket
        (:func:`models.neural.commons.bucket_length`; on CPU a multiple of ``CPU_PAD_STEP``
        frames) and masked, so an item's audio does not depend on the other items.

        Args:
            z: ``(B, in_channels, T_max)`` (or ``(in_channels, T)`` for one item).
            lengths: ``(B,)`` frames per item; default every item is ``T_max`` long.
            sid: ``(B,)`` speaker indices for a multi-speaker voice.

        Returns:
            float32 ``(B, T_max * hop)`` (``(T * hop,)`` for one unbatched item), zero past each
            item's ``lengths[i] * hop`` samples.
        """
        single = z.dim() == 2
        if single:
            z = z.unsqueeze(0)
        batch, channels, max_frames = z.shape
        if lengths is None:
            frames = [max_frames] * batch
        else:
            frames = [int(n) for n in torch.as_tensor(lengths).reshape(-1).tolist()]
        if len(frames) != batch or any(not 0 <= n <= max_frames for n in frames):
            raise ValueError(f"lengths must be {batch} values in 0..{max_frames}, got {frames}")
        if sid is None:
            speakers = [0] * batch
        else:
            speakers = [int(s) for s in torch.as_tensor(sid).reshape(-1).tolist()]
        hop = self.hop_length
        audio = torch.zeros(batch, max_frames * hop, device=self.device)
        max_batch = max_batch or default_max_batch(self.device)
        for group, padded in bucket_groups([max(1, n) for n in frames], max_batch,
                                           pad_step(self.device)):
            padded_z = torch.zeros(len(group), channels, padded, device=self.device)
            for k, i in enumerate(group):
                padded_z[k, :, : frames[i]] = z[i, :, : frames[i]].to(self.device, torch.float32)
            lengths_g = torch.tensor([frames[i] for i in group], device=self.device)
            sid_g = None
            if self.cfg.n_speakers > 1:
                sid_g = torch.tensor([speakers[i] for i in group], dtype=torch.long,
                                     device=self.device)
            out = (self.stages or self).decode_stage(padded_z, lengths_g, sid_g)
            for k, i in enumerate(group):
                audio[i, : frames[i] * hop] = out[k, : frames[i] * hop]
        return audio[0] if single else audio

    def decode_stage(self, z: torch.Tensor, lengths: torch.Tensor,
                     sid: torch.Tensor | None = None) -> torch.Tensor:
        """``z`` ``(G, C, T)`` with each item's frames ``lengths`` ``(G,)`` (and speakers
        ``sid`` ``(G,)`` for a multi-speaker voice) -> ``(G, T * hop)``, masked per item."""
        # Each upsampled mask repeats the one before: the same 0/1 as a mask of lengths * rate
        # over size * rate, without arithmetic on sizes (traced, it would add integer ops the
        # eager module does not run, and NNCF places int8 quantisers by op order).
        masks = [sequence_mask(lengths, z.shape[2]).unsqueeze(1).float()]
        for rate in self.cfg.upsample_rates:
            masks.append(masks[-1].repeat_interleave(rate, dim=2))
        x = self.conv_pre(z * masks[0])
        if self.cfg.n_speakers > 1 and sid is not None:
            x = x + self.cond(self.emb_g(sid).unsqueeze(-1))
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE) * masks[i])
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            total = blocks[0](x, masks[i + 1])
            for block in blocks[1:]:
                total = total + block(x, masks[i + 1])
            x = total / self.num_kernels
        x = F.leaky_relu(x) * masks[-1]  # torch's default slope (0.01) here, as in VITS
        return torch.tanh(self.conv_post(x))[:, 0] * masks[-1][:, 0]

    def forward(self, z: torch.Tensor, lengths=None, sid=None) -> torch.Tensor:
        return self.decode(z, lengths, sid)

    @torch.inference_mode()
    def decode_windowed(
        self,
        z: torch.Tensor,
        window: int = 32,
        context: int = 16,
        sid: int | None = None,
        max_batch: int | None = None,
    ) -> torch.Tensor:
        """One latent ``(in_channels, T)`` -> ``(T * hop,)`` audio, rendered in windows.

        Each window of ``window`` frames is rendered with ``context`` frames of latent on each
        side and only its own samples kept; 16 frames of context reproduce whole-segment
        decoding to about 1e-6 (8 frames: about 1e-3). The windows go through :meth:`decode`
        as one padded batch (``max_batch`` as there).
        """
        if z.dim() != 2:
            raise ValueError(f"z must be (channels, frames), got {tuple(z.shape)}")
        plan = plan_windows(int(z.shape[1]), window, context)
        if not plan:
            return torch.zeros(0, device=self.device)
        lengths = [w.hi - w.lo for w in plan]
        batch = z.new_zeros(len(plan), z.shape[0], max(lengths))
        for i, w in enumerate(plan):
            batch[i, :, : lengths[i]] = z[:, w.lo : w.hi]
        sids = None if sid is None else [sid] * len(plan)
        audio = self.decode(batch, lengths, sids, max_batch=max_batch)
        hop = self.hop_length
        return torch.cat([
            audio[i, (w.start - w.lo) * hop : (w.end - w.lo) * hop] for i, w in enumerate(plan)
        ])
