"""Reading Kokoro-82M's weights out of ``kokoro-v1.0.int8.onnx`` (see ``assets.py``).

The graph is onnxruntime's dynamic int8 quantisation of the export. Four kinds of weight:

- ``MatMulInteger`` (every linear layer: ALBERT's, the style ``fc`` of each AdaIN/AdaLayerNorm,
  ``duration_proj``): an int8 ``(in, out)`` initializer with one scale and zero point per
  output column; many are named ``onnx::MatMul_6548_3_quantized``, so each is named by the
  path of the node that uses it (``/encoder/bert/.../attention/query_3/MatMul_quant`` ->
  ``encoder.bert...attention.query.weight``; the ``_3`` is the fourth use of a shared layer).
- ``ConvInteger`` (every convolution but the generator's ``ups``/``conv_post``): a uint8
  ``(out, in/groups, k)`` initializer, one scale and zero point for the whole tensor, the
  weight-normalised weight already folded in. The graph quantises the bias at run time under a
  node named after it (``encoder.text_encoder.cnn.0.0.bias_scale_node``), which names the conv.
- ``DynamicQuantizeLSTM``: int8 ``W (2, in, 4H)`` and ``R (2, H, 4H)``, one scale per direction,
  float ``B (2, 8H)``; gates in ONNX order (i, o, f, c). Named by the node's path.
- Gathered int8 embeddings (``DequantizeLinear`` after ``Gather``), and the float rest
  (norms, the generator's transposed convolutions, biases) under their torch names.

Everything is returned dequantised to float32 (``(q - zero_point) * scale``, the graph's own
arithmetic for a weight); the convolutions' geometry (pads, strides, dilations, groups) beside.
``onnx`` is imported here only, once per worker at start; onnxruntime is never needed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

_LOGGER = logging.getLogger(__name__)
_REPEAT = re.compile(r"_\d+$")  # the export's suffix on the n-th call of one module


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution's attributes as the graph has them (1-d: one value each)."""

    padding: int
    stride: int = 1
    dilation: int = 1
    groups: int = 1
    output_padding: int = 0
    quantized: bool = False  # a ConvInteger: the graph rounds its input to uint8 first


@dataclass
class KokoroWeights:
    """``tensors``: float32 by torch-style name (``encoder.bert.embeddings.LayerNorm.weight``,
    ``encoder.predictor.text_encoder.lstms.0.weight_ih`` ...); ``convs``: each convolution's
    geometry by the name of its weight."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    convs: dict[str, ConvGeometry] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def linear(self, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight (out, in), bias (out,))`` of the linear layer ``prefix``."""
        return self.tensors[prefix + ".weight"], self.tensors[prefix + ".bias"]


def _path(node_name: str, suffix: str) -> str:
    """``/encoder/bert/.../query_3/MatMul_quant`` -> ``encoder.bert....query``."""
    parts = node_name.strip("/").split("/")
    if parts[-1] != suffix:
        raise ValueError(f"unexpected node name {node_name!r} (no {suffix})")
    parts = parts[:-1]
    parts[-1] = _REPEAT.sub("", parts[-1])
    name = ".".join(parts)
    # the export calls the predictor's F0/N blocks and shared LSTM outside its module path
    return re.sub(r"^encoder\.(F0\.|N\.|shared)", r"encoder.predictor.\1", name)


def _lstm_gates(matrix: np.ndarray) -> np.ndarray:
    """ONNX's gate blocks (i, o, f, c) along the last axis -> torch's (i, f, c, o)."""
    i, o, f, c = np.split(matrix, 4, axis=-1)
    return np.concatenate([i, f, c, o], axis=-1)


def _attrs(node) -> dict:
    # onnx only at weight-reading time; see the module docstring
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _read_lstm(node, arrays, dequant, into: KokoroWeights) -> None:
    """``<path>.weight_ih``/``weight_hh`` (2, 4H, in) and ``bias`` (2, 4H), torch's gate order;
    the two directions stacked on the first axis."""
    path = _path(node.name, "LSTM_quant")
    weight_ih = dequant(node.input[1], node.input[8], node.input[9], axis=0)  # (2, in, 4H)
    weight_hh = dequant(node.input[2], node.input[10], node.input[11], axis=0)
    bias = arrays[node.input[3]]  # (2, 8H): W's biases then R's
    w_b, r_b = np.split(bias, 2, axis=-1)
    into.tensors[path + ".weight_ih"] = torch.from_numpy(
        np.ascontiguousarray(np.swapaxes(_lstm_gates(weight_ih), 1, 2)))
    into.tensors[path + ".weight_hh"] = torch.from_numpy(
        np.ascontiguousarray(np.swapaxes(_lstm_gates(weight_hh), 1, 2)))
    into.tensors[path + ".bias"] = torch.from_numpy(_lstm_gates(w_b + r_b).copy())


def read_weights(path: str | Path) -> KokoroWeights:
    """All of the graph's weights, dequantised, by torch-style name (see the module docstring).

    Raises ValueError on a graph whose layout differs from the one described above.
    """
    # onnx only reads the graph once, at a pool's model load
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    weights = KokoroWeights()

    def dequant(q: str, scale: str, zero: str, axis: int | None = None) -> np.ndarray:
        s, z = arrays[scale].astype(np.float32), arrays[zero].astype(np.float32)
        if axis is not None and s.ndim == 1:  # per direction: broadcast over the rest
            s, z = s.reshape(-1, 1, 1), z.reshape(-1, 1, 1)
        return ((arrays[q].astype(np.float32) - z) * s).astype(np.float32)

    bias_of_scale = {}  # a conv weight's scale name -> the name of its bias
    for node in graph.node:
        if node.op_type == "Mul" and node.name.endswith(".bias_scale_node"):
            bias_of_scale[node.input[1]] = node.name.removesuffix("_scale_node")
    for node in graph.node:
        op, inputs = node.op_type, list(node.input)
        if op == "MatMulInteger" and inputs[1] in arrays:
            name = _path(node.name, node.name.rsplit("/", 1)[-1]) + ".weight"
            stem = inputs[1].removesuffix("_quantized")
            matrix = dequant(inputs[1], stem + "_scale", inputs[3]).T  # (out, in)
            weights.tensors[name] = torch.from_numpy(np.ascontiguousarray(matrix))
        elif op == "ConvInteger" and inputs[1] in arrays:
            stem = inputs[1].removesuffix("_quantized")
            bias = bias_of_scale.get(stem + "_scale")  # None: a conv without bias
            name = (bias.removesuffix(".bias") if bias else _path(node.name, "Conv_quant")) \
                + ".weight"
            weights.tensors[name] = torch.from_numpy(dequant(inputs[1], stem + "_scale", inputs[3]))
            weights.convs[name] = _geometry(_attrs(node), quantized=True)
        elif op in ("Conv", "ConvTranspose"):
            name = inputs[2].removesuffix(".bias") + ".weight" if len(inputs) > 2 else inputs[1]
            weights.tensors[name] = torch.from_numpy(arrays[inputs[1]].copy())
            weights.convs[name] = _geometry(_attrs(node))
        elif op == "DynamicQuantizeLSTM":
            _read_lstm(node, arrays, dequant, weights)
        elif op == "MatMul" and inputs[1] in arrays:  # the harmonic source's float l_linear
            name = "decoder.decoder.generator.m_source.l_linear.weight"
            weights.tensors[name] = torch.from_numpy(arrays[inputs[1]].T.copy())  # (1, 9)
        elif op == "DequantizeLinear" and inputs[0].endswith("Gather_output_0_quantized"):
            table = inputs[1].removesuffix("_scale")  # ...word_embeddings.weight
            weights.tensors[table] = torch.from_numpy(
                dequant(table + "_quantized", inputs[1], inputs[2]))
    for name, array in arrays.items():
        if array.dtype == np.float32 and re.match(r"^(encoder|decoder)\.", name) \
                and not name.endswith("_scale") and name not in weights.tensors:
            weights.tensors[name] = torch.from_numpy(array.copy())
    _LOGGER.info("read %d tensors (%d convolutions) from %s",
                 len(weights.tensors), len(weights.convs), path)
    return weights


def _geometry(attributes: dict, quantized: bool = False) -> ConvGeometry:
    return ConvGeometry(
        quantized=quantized,
        padding=int(attributes.get("pads", [0])[0]),
        stride=int(attributes.get("strides", [1])[0]),
        dilation=int(attributes.get("dilations", [1])[0]),
        groups=int(attributes.get("group", 1)),
        output_padding=int(attributes.get("output_padding", [0])[0]),
    )
