"""Vocoders: log-mel spectrograms -> waveforms.

``griffinlim`` is the parameter-free baseline: the mel is mapped back to a linear magnitude
with the pseudo-inverse of the filterbank and the phase is recovered by fast Griffin-Lim
(Perraudin, Balazs & Søndergaard, 2013). Neural vocoders register under their own names and
implement :meth:`Vocoder.from_checkpoint`.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from models.classic.mel import MelConfig, hann_window, mel_filterbank
from models.registry import Registry


class Vocoder(ABC):
    """Turns log-mels into float32 audio in [-1, 1] at ``sample_rate``.

    Every vocoder returns exactly ``frames * mel_config.hop_length`` samples per mel, so the
    farm can place segments without asking the vocoder how long they came out.
    Neural subclasses should also inherit ``torch.nn.Module``.
    """

    name: ClassVar[str] = "vocoder"
    mel_config: MelConfig
    device: torch.device

    @property
    def sample_rate(self) -> int:
        return self.mel_config.sample_rate

    @abstractmethod
    def vocode(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Vocode a batch of log-mels ``(n_mels, frames_i)`` of any lengths.

        Returns one float32 tensor ``(frames_i * hop_length,)`` per mel, on ``self.device``.
        """

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", **kwargs: Any) -> Vocoder:
        """Load trained weights onto ``device`` and return the model in eval mode."""
        raise NotImplementedError(f"{cls.__name__} does not load checkpoints")


# The abstract base checks what registers; only concrete subclasses do.
_VOCODERS: Registry[Vocoder] = Registry("vocoder", Vocoder)  # type: ignore[type-abstract]


def register_vocoder(name: str):
    """Class decorator registering a :class:`Vocoder` subclass under ``name``."""
    return _VOCODERS.register(name)


def register_vocoder_lazy(name: str, target: str) -> None:
    """Register ``"module:Class"`` under ``name`` without importing it yet."""
    _VOCODERS.register_lazy(name, target)


def load_vocoder(name: str, device: str = "cpu", **kwargs: Any) -> Vocoder:
    """Build the vocoder registered as ``name`` on ``device`` (``checkpoint=`` -> from_checkpoint).

    Raises:
        models.registry.UnknownModel: no vocoder of that name.
    """
    return _VOCODERS.load(name, device=device, **kwargs)


def vocoder_names() -> list[str]:
    """Names of the registered vocoders."""
    return _VOCODERS.names()


@functools.lru_cache(maxsize=8)
def _mel_pinv_f64(cfg: MelConfig) -> torch.Tensor:
    return torch.linalg.pinv(mel_filterbank(cfg, dtype=torch.float64))  # (n_freqs, n_mels)


def mel_to_magnitude(
    log_mels: torch.Tensor,
    pinv: torch.Tensor,
    filterbank: torch.Tensor | None = None,
    refine_iters: int = 0,
    lipschitz: float | None = None,
) -> torch.Tensor:
    """Linear STFT magnitude estimate from log-mels.

    The clamped pseudo-inverse is the starting point; ``refine_iters`` steps of accelerated
    projected gradient (FISTA) on ``||fb @ s - mel||^2, s >= 0`` then fit the mel much better
    (the clamp alone throws away the negative lobes the pseudo-inverse needs). On a harmonic
    chirp, 10 steps take Griffin-Lim's spectral convergence from 0.13 to 0.10 for ~10% of
    the vocoder's time; frames are independent, so batching does not change the result.

    Args:
        log_mels: ``(B, n_mels, frames)``.
        pinv: ``(n_freqs, n_mels)`` pseudo-inverse of the filterbank.
        filterbank: ``(n_mels, n_freqs)``; needed when ``refine_iters > 0``.
        lipschitz: ``||filterbank||_2^2`` (the step is its inverse); computed when omitted.

    Returns:
        ``(B, frames, n_freqs)`` (frame-major: the layout the STFT below works in), >= 0.
    """
    mel = torch.exp(log_mels).transpose(1, 2)  # (B, frames, n_mels)
    magnitude = torch.matmul(mel, pinv.T).clamp_(min=0.0)
    if refine_iters <= 0:
        return magnitude
    if filterbank is None:
        raise ValueError("refine_iters > 0 needs the filterbank")
    step = 1.0 / (lipschitz or float(torch.linalg.matrix_norm(filterbank, ord=2)) ** 2)
    momentum_point, t = magnitude, 1.0
    for _ in range(refine_iters):
        residual = torch.matmul(momentum_point, filterbank.T) - mel  # (B, frames, n_mels)
        updated = momentum_point - step * torch.matmul(residual, filterbank)
        updated.clamp_(min=0.0)
        t_next = (1.0 + math.sqrt(1.0 + 4.0 * t * t)) / 2.0
        momentum_point = updated + ((t - 1.0) / t_next) * (updated - magnitude)
        magnitude, t = updated, t_next
    return magnitude


@register_vocoder("griffinlim")
class GriffinLimVocoder(Vocoder):
    """Fast Griffin-Lim from the mel pseudo-inverse, batched, deterministic.

    The STFT pair is written out (unfold + rfft, irfft + strided overlap-add) instead of
    ``torch.stft``/``torch.istft``: it is faster on CPU (docs/benchmarks.md), keeps the frame-
    major layout between iterations, and lets each item of a padded batch have its own synthesis
    window envelope. That envelope is zero past an item's end, which is what makes a batched
    call return exactly what per-item calls return: padding frames have zero target magnitude
    and padding samples are forced to zero, so nothing leaks from one length into another.

    Args:
        device: where the loop runs (``"cpu"``, ``"cuda:0"``...).
        n_iter: Griffin-Lim iterations; 32 is near the knee of quality vs time.
        momentum: fast Griffin-Lim's acceleration; 0 gives the classic algorithm.
        seed: seed of the initial random phase; the same seed gives the same audio.
        refine_iters: non-negative least-squares steps after the pseudo-inverse (0 = the
            plain clamped pseudo-inverse); see :func:`mel_to_magnitude`.
        mel_config: the analysis the mels were made with.
        max_batch_frames: cap on ``items x longest frames`` of one padded batch; a bigger
            call runs as several batches (same result: batching is exact). Default 4096 on
            CPU, where batches past a few tens of MB spend their time in page faults
            (docs/benchmarks.md, "Figures that lived in code comments"); none on GPUs.
    """

    name: ClassVar[str] = "griffinlim"
    version: ClassVar[str] = "1"

    def __init__(
        self,
        device: str | torch.device = "cpu",
        n_iter: int = 32,
        momentum: float = 0.99,
        seed: int = 0,
        refine_iters: int = 10,
        mel_config: MelConfig = MelConfig(),
        max_batch_frames: int | None = None,
    ) -> None:
        if n_iter < 0:
            raise ValueError(f"n_iter must be >= 0, got {n_iter}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if mel_config.win_length > mel_config.n_fft:
            raise ValueError("win_length must not exceed n_fft")
        self.device = torch.device(device)
        self.n_iter = n_iter
        self.momentum = momentum
        self.seed = seed
        self.refine_iters = refine_iters
        if max_batch_frames is None and self.device.type == "cpu":
            max_batch_frames = 4096
        self.max_batch_frames = max_batch_frames
        self.mel_config = mel_config
        cfg = mel_config
        self._pinv = _mel_pinv_f64(cfg).to(self.device, torch.float32)  # (n_freqs, n_mels)
        self._filterbank = mel_filterbank(cfg, self.device)  # (n_mels, n_freqs)
        self._lipschitz = float(torch.linalg.matrix_norm(mel_filterbank(cfg), ord=2)) ** 2
        self._window = hann_window(cfg, self.device)  # (n_fft,)
        # Frames are a whole number of hops long when n_fft % hop == 0 (the usual case): the
        # overlap-add is then ``n_fft // hop`` shifted adds instead of a scatter (F.fold).
        self._hops_per_frame = cfg.n_fft // cfg.hop_length
        self._strided_ola = cfg.n_fft % cfg.hop_length == 0

    @property
    def model_id(self) -> str:
        """Names the algorithm and every setting that changes its output."""
        return (
            f"griffinlim-v{self.version}-it{self.n_iter}-m{self.momentum:g}-s{self.seed}"
            f"-nnls{self.refine_iters}"
            f"-{self.mel_config.fingerprint()}"
        )

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", **kwargs: Any) -> Vocoder:
        raise NotImplementedError(
            "griffinlim has no weights to load; use load_vocoder('griffinlim', device=...)"
        )

    # -- STFT pair, frame-major: spectra are (B, frames, n_freqs) --------------------------

    def _stft(self, audio: torch.Tensor, n_frames: int) -> torch.Tensor:
        """``(B, T)`` -> ``(B, n_frames, n_freqs)``, frame ``t`` centred on sample ``t * hop``,
        zeros outside the signal."""
        cfg = self.mel_config
        half = cfg.n_fft // 2
        right = (n_frames - 1) * cfg.hop_length + cfg.n_fft - half - audio.shape[-1]
        padded = F.pad(audio, (half, right))
        frames = padded.unfold(-1, cfg.n_fft, cfg.hop_length) * self._window
        return torch.fft.rfft(frames, dim=-1)

    def _overlap_add(self, frames: torch.Tensor) -> torch.Tensor:
        """``(B, n_frames, n_fft)`` -> ``(B, (n_frames - 1) * hop + n_fft)``."""
        cfg = self.mel_config
        batch, n_frames, n_fft = frames.shape
        if self._strided_ola:
            r = self._hops_per_frame
            chunks = frames.reshape(batch, n_frames, r, cfg.hop_length)
            out = frames.new_zeros(batch, n_frames + r - 1, cfg.hop_length)
            for k in range(r):
                out[:, k : k + n_frames] += chunks[:, :, k]
            return out.reshape(batch, -1)
        length = (n_frames - 1) * cfg.hop_length + n_fft
        return F.fold(
            frames.transpose(1, 2),
            output_size=(1, length),
            kernel_size=(1, n_fft),
            stride=(1, cfg.hop_length),
        ).reshape(batch, length)

    def _istft(self, spec: torch.Tensor, inv_envelope: torch.Tensor) -> torch.Tensor:
        """``(B, n_frames, n_freqs)`` -> ``(B, T)``: least-squares inverse of :meth:`_stft`;
        ``inv_envelope`` ``(B, T)`` is 1 / sum of squared windows, 0 past each item's end."""
        cfg = self.mel_config
        frames = torch.fft.irfft(spec, n=cfg.n_fft, dim=-1) * self._window
        half = cfg.n_fft // 2
        length = inv_envelope.shape[-1]
        return self._overlap_add(frames)[:, half : half + length] * inv_envelope

    def _inverse_envelopes(self, lengths: list[int], max_frames: int) -> torch.Tensor:
        """``(B, max_frames * hop)``: per item, 1 / sum of squared windows of its own frames."""
        cfg = self.mel_config
        half = cfg.n_fft // 2
        total = max_frames * cfg.hop_length
        square = (self._window**2).expand(1, max_frames, cfg.n_fft)
        inv = torch.zeros(len(lengths), total, device=self.device)
        for i, n in enumerate(lengths):
            if n == 0:
                continue
            envelope = self._overlap_add(square[:, :n])[0, half : half + n * cfg.hop_length]
            # Hann^2 at hop n_fft/4 never sums below ~0.25 inside the signal; the guard is
            # only for exotic configs where windows barely overlap.
            inv[i, : n * cfg.hop_length] = 1.0 / envelope.clamp(min=1e-8)
        return inv

    def _initial_phase(self, lengths: list[int], max_frames: int) -> torch.Tensor:
        """``(B, max_frames, n_freqs)`` unit phasors, random but seeded per item, so an item's
        start does not depend on what it is batched with."""
        n_freqs = self.mel_config.n_freqs
        phase = torch.zeros(len(lengths), max_frames, n_freqs)
        for i, n in enumerate(lengths):
            generator = torch.Generator().manual_seed(self.seed)  # CPU: same on every device
            phase[i, :n] = torch.rand(n, n_freqs, generator=generator) * (2.0 * math.pi)
        return torch.polar(torch.ones_like(phase), phase).to(self.device)

    @torch.inference_mode()
    def vocode(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Vocode log-mels ``(n_mels, frames_i)`` in padded batches (one unless the call
        exceeds ``max_batch_frames``).

        Returns:
            per mel a float32 ``(frames_i * hop_length,)`` tensor on ``self.device``, scaled
            down to peak 1.0 only when it would otherwise clip.
        """
        cfg = self.mel_config
        for mel in mels:
            if mel.dim() != 2 or mel.shape[0] != cfg.n_mels:
                raise ValueError(f"each mel must be ({cfg.n_mels}, frames), got {tuple(mel.shape)}")
        # Longest first, so each batch pads to its own first item and wastes little.
        order = sorted(range(len(mels)), key=lambda i: -mels[i].shape[1])
        groups: list[list[int]] = []
        for i in order:
            limit = self.max_batch_frames
            if groups and (
                not limit or (len(groups[-1]) + 1) * mels[groups[-1][0]].shape[1] <= limit
            ):
                groups[-1].append(i)
            else:
                groups.append([i])
        out: list[torch.Tensor] = [torch.empty(0)] * len(mels)
        for group in groups:
            for i, wave in zip(group, self._vocode_batch([mels[i] for i in group]), strict=True):
                out[i] = wave
        return out

    def _vocode_batch(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """One padded batch through the whole pipeline; see :meth:`vocode`."""
        cfg = self.mel_config
        lengths = [int(mel.shape[1]) for mel in mels]
        max_frames = max(lengths)
        if max_frames == 0:
            return [torch.zeros(0, device=self.device) for _ in mels]

        # Pad with the log floor: exp() of it is ~0 magnitude, and the pad is masked anyway.
        floor = math.log(cfg.log_floor)
        batch = torch.full((len(mels), cfg.n_mels, max_frames), floor, device=self.device)
        for i, mel in enumerate(mels):
            batch[i, :, : lengths[i]] = mel.to(self.device, torch.float32)
        magnitude = mel_to_magnitude(  # (B, frames, n_freqs)
            batch, self._pinv, self._filterbank, self.refine_iters, self._lipschitz
        )
        for i, n in enumerate(lengths):
            magnitude[i, n:] = 0.0
        inv_envelope = self._inverse_envelopes(lengths, max_frames)

        spec = magnitude * self._initial_phase(lengths, max_frames)
        previous = torch.zeros_like(spec)
        alpha = self.momentum / (1.0 + self.momentum)
        for _ in range(self.n_iter):
            rebuilt = self._stft(self._istft(spec, inv_envelope), max_frames)
            # Fast Griffin-Lim: step past the projection along the last update's direction
            # (torch.sub allocates, so ``previous`` keeps the unmodified projection).
            spec = torch.sub(rebuilt, previous, alpha=alpha)
            spec.mul_(magnitude / spec.abs().add_(1e-16))  # keep the phase, impose |S|
            previous = rebuilt
        audio = self._istft(spec, inv_envelope)

        out: list[torch.Tensor] = []
        for i, n in enumerate(lengths):
            wave = audio[i, : n * cfg.hop_length].clone()
            peak = wave.abs().max() if wave.numel() else wave.new_zeros(())
            if peak > 1.0:
                wave /= peak
            out.append(wave)
        return out


# A Piper VITS voice's HiFi-GAN decoder (vocodes its latents); imported only when loaded.
register_vocoder_lazy("hifigan", "models.neural.piper:PiperVocoder")
register_vocoder_lazy("hibari", "models.hibari.stage:HibariVocoder")
