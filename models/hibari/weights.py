"""Reading the hibari voice's weights out of the wheel's ``hibari/assets/hibari.onnx``.

The graph is int8 dynamic quantisation as onnxruntime's quantiser writes it: every pointwise
layer (the ConvNeXt ``pw1``/``pw2``, attention ``in_proj``/``out_proj``, the feed-forwards and the
``head``) is a ``MatMulInteger`` against an int8 initializer named after the export's node path
(``/dec.3/pw1/Transpose_output_0_quantized``), with a per-tensor float scale and a zero point
beside it. Those names say nothing about the module, so each int8 matrix is named by the bias
that the graph adds to its product (``m.dec.3.pw1.bias`` -> ``m.dec.3.pw1.weight``). The other
weights (embeddings, depthwise and plain convolutions, norms, layer scales) are float32 and keep
their torch names.

``onnx`` is imported here only, once per worker at start; onnxruntime is never needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

_LOGGER = logging.getLogger(__name__)


def asset_path(name: str) -> Path:
    """A file in the installed wheel's ``hibari/assets`` (``hibari.onnx``, ``vocab.json``)."""
    return Path(str(resources.files("hibari").joinpath("assets", name)))


@dataclass(frozen=True)
class QuantizedMatrix:
    """One int8 pointwise layer: ``weight`` (out, in) int8, ``scale`` and ``zero_point`` per
    tensor (the wheel's are all symmetric: zero point 0). ``dequantize()`` is the float weight."""

    weight: torch.Tensor
    scale: float
    zero_point: int

    def dequantize(self) -> torch.Tensor:
        return (self.weight.float() - self.zero_point) * self.scale


@dataclass(frozen=True)
class HibariWeights:
    """``floats``: the float32 tensors by torch name; ``matrices``: the int8 ones by torch name
    of the weight (``m.dec.0.pw1.weight``, ``pn.text.attn.self_attn.in_proj_weight``);
    ``dilations``: each convolution's, by the name of its weight (the prosody stack's depthwise
    convolutions are dilated 1, 2, 4, 8, 1, 2; the graph says so, nothing else does)."""

    floats: dict[str, torch.Tensor]
    matrices: dict[str, QuantizedMatrix]
    dilations: dict[str, int]

    def subset(self, prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedMatrix]]:
        """The tensors under ``prefix`` (``"m.dec."``), with the prefix taken off."""
        cut = len(prefix)
        floats = {k[cut:]: v for k, v in self.floats.items() if k.startswith(prefix)}
        for name, dilation in self.dilations.items():
            if name.startswith(prefix):  # carried beside the weight, as a 0-d tensor
                floats[name[cut:].removesuffix(".weight") + ".dilation"] = torch.tensor(dilation)
        return floats, {k[cut:]: v for k, v in self.matrices.items() if k.startswith(prefix)}


def _weight_name(bias_name: str) -> str:
    if bias_name.endswith("in_proj_bias"):  # nn.MultiheadAttention's packed q, k, v
        return bias_name[: -len("bias")] + "weight"
    return bias_name[: -len(".bias")] + ".weight"


def read_weights(path: str | Path | None = None) -> HibariWeights:
    """All weights of ``hibari.onnx`` (the wheel's by default) as torch tensors.

    Raises ValueError when an int8 matrix cannot be tied to a named bias (a different export).
    """
    # onnx only reads the wheel's graph once, at a pool's model load
    import onnx
    from onnx import numpy_helper

    path = Path(path) if path is not None else asset_path("hibari.onnx")
    graph = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def only_consumer(tensor: str, op: str):
        nodes = [n for n in consumers.get(tensor, []) if n.op_type == op]
        if len(nodes) != 1:
            raise ValueError(f"{path}: expected one {op} after {tensor}, found {len(nodes)}")
        return nodes[0]

    matrices: dict[str, QuantizedMatrix] = {}
    for node in graph.node:
        if node.op_type != "MatMulInteger" or node.input[1] not in arrays:
            continue
        quantized = node.input[1]
        # MatMulInteger -> Cast -> Mul (the two scales) -> Add (bias, product)
        cast = only_consumer(node.output[0], "Cast")
        scaled = only_consumer(cast.output[0], "Mul")
        add = only_consumer(scaled.output[0], "Add")
        bias = [name for name in add.input if name in arrays]
        if len(bias) != 1:
            raise ValueError(f"{path}: no bias names the int8 matrix {quantized}")
        name = _weight_name(bias[0])
        stem = quantized.removesuffix("_quantized")
        matrix = QuantizedMatrix(
            weight=torch.from_numpy(np.ascontiguousarray(arrays[quantized].T)),  # (out, in)
            scale=float(arrays[stem + "_scale"]),
            zero_point=int(arrays[stem + "_zero_point"]),
        )
        previous = matrices.get(name)
        if previous is not None and not torch.equal(previous.weight, matrix.weight):
            raise ValueError(f"{path}: two different int8 matrices claim {name}")
        matrices[name] = matrix  # a layer applied several times is read once
    floats = {name: torch.from_numpy(array.copy()) for name, array in arrays.items()
              if array.dtype == np.float32 and (name.startswith("m.") or name.startswith("pn."))}
    dilations = {}
    for node in graph.node:
        if node.op_type == "Conv":
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            dilations[node.input[1]] = int(attributes.get("dilations", [1])[0])
    _LOGGER.info("read %d float and %d int8 tensors from %s", len(floats), len(matrices), path)
    return HibariWeights(floats, matrices, dilations)
