"""Inference engines: the farm's torch models run compiled on CPU, eager on CUDA.

The torch modules in ``models/`` stay the one definition of each model. On a CPU pool the
engine converts the stages a pool runs (``openvino.convert_model`` on the torch module itself,
so there is no second model definition) and compiles them for this CPU:

- a VITS voice's text encoder + duration predictor (``VitsAcoustic.encode_stage``: the
  duration noise is an input) and its flow (``VitsAcoustic.flow_stage``: the prior sample, noise
  already in it, is an input). The farm draws every noise from its seeded generators, and the
  durations, the alignment and the word times stay in torch between the two graphs, so the
  same request gives the same bytes every time, compiled or not, cache hit or miss;
- its HiFi-GAN decoder (``HifiganDecoder.decode_stage``), one graph for any batch and any
  frame length (whole segments, streaming windows, batches with their masks);
- the hibari voice's ConvNeXt decoder (``models.hibari.decoder.HibariDecoder.parts_stage``:
  ``dec_in``, eight blocks, norm, head, float weights), one graph for any length (whole
  segments and streaming windows, unpadded). Its DSP and the seeded noise stay outside, after
  the graph. Its acoustic half stays eager: its int8 layers multiply with ``torch._int_mm``,
  which OpenVINO 2026.4.1 cannot convert (``No conversion rule found for operations:
  aten::_int_mm``), and the float path they replace changed durations (models/hibari/layers.py).

Precision, per stage (``EngineConfig.acoustic_precision``, ``vocoder_precision``): ``f32``;
``bf16`` (OpenVINO's ``INFERENCE_PRECISION_HINT`` on this CPU's AVX-512 BF16 units); ``int8``
with STATIC scales: ``nncf.quantize`` calibrates the torch module on the voice's own inputs once,
then ``openvino.convert_model`` turns its fake-quantisers into int8 kernels (AVX-512 VNNI). A
fixed scale makes every frame's numbers independent of the rest of the call, so streamed windows
joined equal the whole decode (per-call dynamic scales do not). ``auto`` takes what passed the
perceptual bound and was fastest (``AUTO_PRECISION``). Only a stage with a calibration set
(``Calibration``: the hibari decoder, the Piper voice's decoder) builds int8; elsewhere int8
falls back to f32 with one log line. Calibrating and quantising costs a pool's first start
seconds (the hibari decoder about 16 s against 4 s at f32, Piper's about 25 s against 8 s:
docs/models.md, "Precision"), so it is paid once per engine cache: the int8 model's folder is
keyed by the calibration set's digest as well as the model's and the precision, and a pool
finding it there only compiles from cached blobs (under a second).

Why OpenVINO, and why f32 unless measured otherwise: docs/models.md, "Inference engines" and
"Precision". Two caches keep a warm start fast: the converted model (OpenVINO IR, keyed by the
voice's content hash, the graph version, the OpenVINO version and the precision) and
OpenVINO's own ``CACHE_DIR`` of compiled blobs. A stage that cannot be converted or compiled
stays in torch for that voice with one log line naming why; it never fails the pool. A
compiled stage is called from the thread that runs the pool's forward passes; a lock
serialises callers anyway, as torch's modules allow concurrent calls.
"""

from __future__ import annotations

import copy
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.compiled import CompiledGraph
from models.stages import ACOUSTIC, STAGES, VOCODER

_LOGGER = logging.getLogger(__name__)

ENGINES = ("auto", "torch", "openvino")
# Bump when a stage wrapper below (or a stage it traces) changes what it computes: it keys the
# converted-model cache, so a farm never compiles a stale graph.
GRAPH_VERSION = "2"
PRECISIONS = ("f32", "bf16", "int8", "auto")
# What ``auto`` runs per (voice family, stage), from the precision harness
# (tests/bench/bench_precision.py; the figures and the command: docs/models.md, "Precision"):
# the fastest precision that passed the perceptual bound. A stage not named runs f32.
AUTO_PRECISION: dict[tuple[str, str], str] = {
    # 24 sentences, 2026-12-05: log-mel to the wheel 0.058 (f32 0.039), WER 0.053 (f32 0.058),
    # lengths equal, windows joined exact; 0.0078 CPU-s per second of speech (f32 0.0115).
    ("hibari", VOCODER): "int8",
    # 24 sentences, 2026-12-05: bf16 log-mel 0.064 from eager f32 (bound 0.05), windows 22
    # 16-bit steps off the whole; int8 (static) log-mel 1.40, WER 0.169 (f32 0.116). Neither
    # passes: f32, 0.0500 CPU-s per second of speech.
    ("piper", VOCODER): "f32",
    # Same day: bf16 changed durations in 11 of 24 sentences; int8 does not convert.
    ("piper", ACOUSTIC): "f32",
    # 24 sentences, 2026-12-06: bf16 log-mel 0.177 from eager (OpenVINO f32 0.102), WER +0.048.
    ("kokoro", VOCODER): "f32",
}


@dataclass(frozen=True)
class EngineConfig:
    """How a pool runs its models.

    ``engine``: ``auto`` (OpenVINO on a CPU device, torch on CUDA), ``torch`` (eager
    everywhere) or ``openvino``. ``cache_dir``: converted models and compiled blobs.
    ``threads``: inference threads per process (the pools share the cores: one by default).
    ``acoustic_precision``, ``vocoder_precision``: one of ``PRECISIONS`` per stage. ``f32``
    here, the engine's exact mode (the parity tests and the benches build on it): OpenVINO's
    own default on CPUs with bf16 units is bf16, which moved the VITS flow's latent by 0.26
    against torch, and a duration's ceiling can flip on far less; a stage runs bf16 or int8
    only where it is asked to, or where ``auto`` picks it by measurement. A farm's settings
    ask for ``auto`` by default (app/settings.py).
    """

    engine: str = "auto"
    cache_dir: str = "var/engine-cache"
    threads: int = 1
    acoustic_precision: str = "f32"
    vocoder_precision: str = "f32"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"VOXFARM_ENGINE={self.engine!r}: one of {', '.join(ENGINES)}")
        for stage in STAGES:
            value = getattr(self, f"{stage}_precision")
            if value not in PRECISIONS:
                raise ValueError(f"VOXFARM_{stage.upper()}_PRECISION={value!r}: one of "
                                 f"{', '.join(PRECISIONS)}")


def stage_precision(config: EngineConfig, family: str, stage: str, int8_ok: bool
                    ) -> tuple[str, str]:
    """The precision a ``stage`` (``acoustic`` or ``vocoder``) of a voice ``family``
    (``hibari``, ``piper``) compiles at, and why when it is not the one asked for: ``auto``
    looks up ``AUTO_PRECISION``; ``int8`` needs a calibration set (``int8_ok``), else f32."""
    asked = getattr(config, f"{stage}_precision")
    precision = AUTO_PRECISION.get((family, stage), "f32") if asked == "auto" else asked
    if precision == "int8" and not int8_ok:
        return "f32", f"int8 asked, but the {family} {stage} has no calibration set: f32"
    return precision, ""


def resolve(engine: str, device: str | torch.device) -> str:
    """The engine that runs on ``device``: ``torch`` or ``openvino``."""
    if engine not in ENGINES:
        raise ValueError(f"VOXFARM_ENGINE={engine!r}: one of {', '.join(ENGINES)}")
    on_cpu = torch.device(device).type == "cpu"
    if engine == "torch" or not on_cpu:
        # OpenVINO's CPU plugin would move a CUDA pool's work onto the host: never wanted.
        return "torch"
    return "openvino"


# -- OpenVINO ----------------------------------------------------------------------------------


def _ov_core():
    # openvino is the worker extra's, loaded only where a stage compiles
    import openvino as ov

    return ov, ov.Core()


@dataclass(frozen=True)
class Calibration:
    """What fixes a stage's static int8 scales: ``inputs()`` gives, per graph name
    (``GraphSpec.name``), the module's inputs one call at a time (a tensor, or a tuple of the
    module's arguments); it runs only when an int8 conversion is not cached yet, as it costs a
    forward pass per sentence. ``digest`` names the set (its sentences, seeds and how they
    become inputs): it keys the int8 cache, so an edited set builds anew, and an unchanged one
    is never computed again."""

    digest: str
    inputs: Callable[[], dict[str, list[Any]]]


@dataclass(frozen=True)
class GraphSpec:
    """A stage to convert: the module, an example input and each input's shape (-1 dynamic)."""

    name: str
    module: nn.Module
    example: tuple[torch.Tensor, ...]
    shapes: tuple[tuple[int, ...], ...]
    # At int8: NNCF's node-name patterns of the layers that stay float.
    int8_float: tuple[str, ...] = ()
    # Whether a pass on an idle host may run it on more threads (models/compiled.py): only
    # where the thread count does not change its numbers.
    widens: bool = True


def _locked(path: Path):
    """An exclusive lock on ``path`` (a file), held while the ``with`` block runs: the
    processes of a pool starting together convert a model once, not once each."""

    class _Lock:
        def __enter__(self):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            return self

        def __exit__(self, *exc):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)

    return _Lock()


def _reference_quantizers() -> None:
    """Have NNCF quantise with torch's own operations instead of compiling its C++ extension.

    The extension only speeds quantisation-aware training; post-training calibration writes a
    byte-identical int8 model without it (measured on the hibari decoder). Compiling it cost
    a machine's first int8 build about 30 s, needs a C++ compiler, and under load ran past
    NNCF's 60 s loading timeout, which failed the build on a busy fresh machine."""
    # nncf.torch loads torch hooks: only where a stage builds int8
    from nncf.torch.quantization.extensions import QuantizedFunctionsCPU
    from nncf.torch.quantization.reference import ReferenceQuantizedFunctions

    # ExtensionNamespace loads lazily into this attribute on first use (NNCF 3.4)
    if getattr(QuantizedFunctionsCPU, "_loaded_namespace", None) is None:
        QuantizedFunctionsCPU._loaded_namespace = ReferenceQuantizedFunctions


def _quantized(spec: GraphSpec, inputs: list[Any]) -> nn.Module:
    """A copy of ``spec.module`` with static int8 scales calibrated on ``inputs`` (NNCF): each
    quantised tensor's range is read once from the calibration set and fixed. The MIXED
    preset (activations asymmetric: GELU's outputs are mostly positive) measured closer to f32
    than the symmetric default at the same speed (hibari decoder: log-mel 0.053 against 0.065
    to eager f32 on 8 sentences)."""
    # nncf is needed only where a stage builds int8, once per converted model
    import nncf

    _reference_quantizers()
    ignored = nncf.IgnoredScope(patterns=list(spec.int8_float), validate=False)
    with torch.no_grad():
        return nncf.quantize(copy.deepcopy(spec.module).eval(), nncf.Dataset(inputs),
                             preset=nncf.QuantizationPreset.MIXED, subset_size=len(inputs),
                             ignored_scope=ignored)


def compile_graphs(specs: Sequence[GraphSpec], key: str, config: EngineConfig,
                   precision: str = "f32", calibration: Calibration | None = None
                   ) -> dict[str, CompiledGraph]:
    """Convert (or read back converted) and compile each of ``specs`` for this CPU at
    ``precision`` (``f32``, ``bf16``, or ``int8``: each module quantised with static scales
    from ``calibration``, whose inputs are computed only when a conversion is not cached yet).

    The converted models live under ``cache_dir/ir/KEY-GRAPH_VERSION-OPENVINO[-PRECISION]/
    NAME.xml`` (int8: ``-int8-DIGEST``, the calibration set's), written to a temporary folder
    and renamed into place, so a reader never sees half a file; OpenVINO keeps the compiled
    blobs under ``cache_dir/blobs``.
    """
    if precision == "int8" and calibration is None:
        raise ValueError("int8 needs a calibration set")
    ov, core = _ov_core()
    cache = Path(config.cache_dir)
    tag = "" if precision == "f32" else f"-{precision}"  # f32 keeps the caches it had
    if precision == "int8":
        assert calibration is not None
        tag += f"-{calibration.digest}"
    inputs: dict[str, list[Any]] | None = None
    folder = cache / "ir" / f"{key}-g{GRAPH_VERSION}-ov{ov.__version__.split('-')[0]}{tag}"
    properties = {
        "PERFORMANCE_HINT": "LATENCY",
        # int8 runs its quantised layers in int8 and the rest (norms, GELU) at f32.
        "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
        # OpenVINO pins its inference threads to cores by default (on Linux). A farm runs
        # several one-thread pool processes on the same cores, and each would pin its thread
        # to the same first core; unpinned, the kernel spreads them
        # (docs/benchmarks.md, "Inference engines").
        "ENABLE_CPU_PINNING": False,
        "CACHE_DIR": str(cache / "blobs"),
    }
    graphs = {}
    for spec in specs:
        xml = folder / f"{spec.name}.xml"
        with _locked(cache / "locks" / f"{folder.name}-{spec.name}.lock"):
            if not xml.exists():
                started = time.perf_counter()
                module = spec.module.eval()
                if precision == "int8":
                    assert calibration is not None
                    inputs = calibration.inputs() if inputs is None else inputs
                    module = _quantized(spec, inputs[spec.name])
                with torch.no_grad():
                    model = ov.convert_model(
                        module, example_input=spec.example,
                        input=[ov.PartialShape(list(s)) for s in spec.shapes],
                    )
                folder.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(dir=folder, prefix=".tmp-"))
                try:
                    # Weights stay f32 (int8 where quantised): the precision is chosen here.
                    ov.save_model(model, str(staging / xml.name), compress_to_fp16=False)
                    os.replace(staging / xml.with_suffix(".bin").name, xml.with_suffix(".bin"))
                    os.replace(staging / xml.name, xml)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                _LOGGER.info("converted %s for OpenVINO in %.1f s", spec.name,
                             time.perf_counter() - started)
        def compile_for(n: int, xml: Path = xml) -> Any:  # the variant for n threads
            return core.compile_model(str(xml), "CPU", properties | {"INFERENCE_NUM_THREADS": n})

        graphs[spec.name] = CompiledGraph(compile_for, max(1, config.threads), spec.name,
                                          spec.widens)
    return graphs


# -- the VITS stages ---------------------------------------------------------------------------


class _EncodeGraph(nn.Module):
    """``VitsAcoustic.encode_stage`` for one-speaker voices, as a module to trace."""

    def __init__(self, acoustic: nn.Module) -> None:
        super().__init__()
        self.acoustic = acoustic

    def forward(self, ids, x_mask, dp_noise):
        return self.acoustic.encode_stage(ids, x_mask, dp_noise)


class _FlowGraph(nn.Module):
    def __init__(self, acoustic: nn.Module) -> None:
        super().__init__()
        self.acoustic = acoustic

    def forward(self, z_p, y_mask):
        return self.acoustic.flow_stage(z_p, y_mask)


class _DecodeGraph(nn.Module):
    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, z, lengths):
        return self.decoder.decode_stage(z, lengths)


class CompiledVits:
    """``VitsStages`` run by compiled graphs (models/neural/vits.py sets it as ``stages``)."""

    def __init__(self, graphs: dict[str, CompiledGraph]) -> None:
        self.encode_graph, self.flow_graph = graphs["encode"], graphs["flow"]

    def encode_stage(self, ids, x_mask, dp_noise, g=None):
        mean, log_std, log_w = self.encode_graph(
            ids.numpy().astype(np.int64), x_mask.numpy(), dp_noise.numpy())
        return torch.from_numpy(mean), torch.from_numpy(log_std), torch.from_numpy(log_w)

    def flow_stage(self, z_p, y_mask, g=None):
        return torch.from_numpy(self.flow_graph(z_p.numpy(), y_mask.numpy())[0])


class CompiledDecoder:
    """``DecoderStages`` run by a compiled graph (models/neural/hifigan.py sets it as
    ``stages``)."""

    def __init__(self, graphs: dict[str, CompiledGraph]) -> None:
        self.decode_graph = graphs["decode"]

    def decode_stage(self, z, lengths, sid=None):
        return torch.from_numpy(
            self.decode_graph(z.numpy(), lengths.numpy().astype(np.int64))[0])


class _HibariPartsGraph(nn.Module):
    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, frames):
        return self.decoder.parts_stage(frames)


class CompiledHibariDecoder:
    """``models.hibari.decoder.DecoderStages`` run by a compiled graph (``HibariDecoder``
    sets it as ``stages``)."""

    def __init__(self, graphs: dict[str, CompiledGraph]) -> None:
        self.parts_graph = graphs["parts"]

    def parts_stage(self, frames):
        return torch.from_numpy(self.parts_graph(frames.float().cpu().numpy())[0])


def _vits_specs(acoustic) -> list[GraphSpec]:
    # Example inputs of a typical sentence; every dimension but the channels is dynamic.
    length, frames, channels = 64, 256, acoustic.cfg.inter_channels
    ids = torch.randint(1, acoustic.cfg.n_vocab, (1, length))
    return [
        GraphSpec("encode", _EncodeGraph(acoustic),
                  (ids, torch.ones(1, 1, length), torch.randn(1, 2, length)),
                  ((-1, -1), (-1, 1, -1), (-1, 2, -1))),
        GraphSpec("flow", _FlowGraph(acoustic),
                  (torch.randn(1, channels, frames), torch.ones(1, 1, frames)),
                  ((-1, channels, -1), (-1, 1, -1))),
    ]


def _decoder_specs(decoder) -> list[GraphSpec]:
    frames, channels = 96, decoder.cfg.in_channels
    # At two threads a few samples a sentence moved by one 16-bit step against one thread
    # (2026-12-06): it keeps the pool's count, so a request's bytes never depend on the host.
    return [GraphSpec("decode", _DecodeGraph(decoder),
                      (torch.randn(1, channels, frames), torch.tensor([frames])),
                      ((-1, channels, -1), (-1,)), widens=False)]


def _hibari_decoder_specs(decoder) -> list[GraphSpec]:
    # Batch 1 as the farm decodes (a segment or a window at a time); length dynamic.
    frames, channels = 96, decoder.dec_in.in_channels
    # At int8 the convolutions (dec_in and the depthwise ones, a small share of the time) stay
    # float: measured on 8 sentences, log-mel to eager f32 0.038 against 0.053 with them int8,
    # at 0.0042 against 0.0040 CPU-s per second of speech (docs/models.md, "Precision").
    return [GraphSpec("parts", _HibariPartsGraph(decoder), (torch.randn(1, channels, frames),),
                      ((-1, channels, -1),), int8_float=(".*conv1d.*",))]


def _int8_products(model: nn.Module) -> bool:
    """Whether ``model`` (a hibari module) multiplies int8 activations (``exact`` layers)."""
    # hibari is imported only where its voice loads
    from models.hibari.layers import QuantLinear

    return any(isinstance(m, QuantLinear) and m.exact for m in model.modules())


# Builders (model, model_id, config, precision, calibration) of compiled stages by module
# class, that a family's module adds when imported (models/kokoro/compiled.py), unimported here.
FAMILY_STAGES: dict[type, Callable[..., Any]] = {}


def _stages(model, model_id: str, config: EngineConfig, precision: str,
            calibration: Calibration | None):
    """The compiled stages object for ``model`` at ``precision``."""
    # breaks the cycle: the voice modules import this one for accelerate()
    from models.hibari.decoder import HibariDecoder
    from models.neural.hifigan import HifiganDecoder

    for family, build in FAMILY_STAGES.items():
        if isinstance(model, family):
            return build(model, model_id, config, precision, calibration)
    if isinstance(model, HibariDecoder):
        return CompiledHibariDecoder(compile_graphs(
            _hibari_decoder_specs(model), f"{model_id}-decoder", config, precision, calibration))
    if getattr(model.cfg, "n_speakers", 1) > 1:
        # The graphs take no speaker input: a multi-speaker voice stays exact in torch
        # rather than risk a graph that ignores the speaker.
        raise NotImplementedError("multi-speaker voices are not compiled yet")
    if isinstance(model, HifiganDecoder):
        return CompiledDecoder(compile_graphs(_decoder_specs(model), f"{model_id}-decoder",
                                              config, precision, calibration))
    return CompiledVits(compile_graphs(_vits_specs(model), f"{model_id}-acoustic", config,
                                       precision, calibration))


def accelerate(model, model_id: str, config: EngineConfig, device: str | torch.device,
               calibration: Calibration | None = None) -> str:
    """Run ``model``'s stages (a ``VitsAcoustic``, a ``HifiganDecoder``, the hibari voice's
    ``HibariDecoder`` or ``HibariAcoustic``, Kokoro's ``KokoroDecoder`` or ``KokoroAcoustic``)
    on the engine the config picks for ``device``, at the stage's precision
    (``stage_precision``; ``calibration`` gives the inputs that fix int8's static scales,
    where the stage has them); returns the engine that runs them (``torch`` or
    ``openvino``). Any failure leaves the model in eager torch with one log line naming why.
    """
    # breaks the cycle: the voice modules import this one for accelerate()
    from models.hibari.acoustic import HibariAcoustic
    from models.hibari.decoder import HibariDecoder
    from models.kokoro.acoustic import KokoroAcoustic
    from models.kokoro.decoder import KokoroDecoder
    from models.neural.hifigan import HifiganDecoder
    from models.neural.vits import VitsAcoustic

    engine = resolve(config.engine, device)
    if not isinstance(model, HifiganDecoder | VitsAcoustic | HibariDecoder | HibariAcoustic
                      | KokoroAcoustic | KokoroDecoder):
        raise TypeError(f"no compiled stages for {type(model).__name__}")
    model.stages = None
    if engine == "torch":
        return "torch"
    kind = ("decoder" if isinstance(model, HifiganDecoder | HibariDecoder | KokoroDecoder)
            else "acoustic")
    family = ("kokoro" if isinstance(model, KokoroAcoustic | KokoroDecoder) else "hibari"
              if isinstance(model, HibariAcoustic | HibariDecoder) else "piper")
    precision, why = stage_precision(config, family, VOCODER if kind == "decoder"
                                     else ACOUSTIC, calibration is not None)
    if why:
        _LOGGER.warning("%s of %s: %s", kind, model_id, why)
    try:
        if family == "hibari" and _int8_products(model):
            # Measured with OpenVINO 2026.4.1: converting these layers fails with "No
            # conversion rule found for operations: aten::_int_mm"; a float stand-in would
            # change durations (models/hibari/layers.py). Refused before converting, so a
            # pool start does not spend seconds on a conversion known to fail.
            raise NotImplementedError(
                "its int8 layers (torch._int_mm) have no OpenVINO conversion rule")
        started = time.perf_counter()
        model.stages = _stages(model, model_id, config, precision, calibration)
        _LOGGER.info("%s of %s runs on OpenVINO (%d thread(s), %s), ready in %.1f s", kind,
                     model_id, config.threads, precision, time.perf_counter() - started)
        return "openvino"
    except Exception as exc:  # an operator the engine lacks, no openvino installed, ...
        model.stages = None  # a stage left in torch by design (NotImplementedError) is no alarm
        _LOGGER.log(logging.INFO if isinstance(exc, NotImplementedError) else logging.WARNING,
                    "%s of %s runs in torch eager: %s: %s", kind, model_id, type(exc).__name__,
                    str(exc).splitlines()[0][:300] if str(exc) else "")
        return "torch"
