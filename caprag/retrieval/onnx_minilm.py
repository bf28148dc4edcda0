"""all-MiniLM-L6-v2 as an ONNX graph built in memory from the bundled safetensors (no torch).

The graph takes `input_ids` and `attention_mask` (int64, batch × tokens) and returns
`sentence_embedding` (batch × 384): the BERT encoder, mean pooling over the attention mask and
L2 normalisation, as sentence-transformers computes them. Building takes about a second and is
deterministic: the same weights give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

INPUTS = ("input_ids", "attention_mask")
OUTPUT = "sentence_embedding"
# Opset 17 has LayerNormalization; com.microsoft carries ONNX Runtime's fused Attention.
OPSETS = (("", 17), ("com.microsoft", 1))


class _Graph:
    """Collects initialisers and nodes; every helper returns the name of its output."""

    def __init__(self, weights: dict[str, NDArray[np.float32]], eps: float) -> None:
        self.weights = weights
        self.eps = eps
        self.initializers: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def constant(self, name: str, value: NDArray[np.generic]) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str = "", **attrs: object) -> str:
        name = f"{op_type}_{len(self.nodes)}"
        self.nodes.append(
            helper.make_node(op_type, inputs, [output or name], name=name, **attrs)  # type: ignore[arg-type]
        )
        return output or name

    def dense(self, x: str, prefix: str) -> str:
        """x @ W.T + b, with W stored transposed once so MatMul reads it as (in, out)."""
        weight = self.constant(f"{prefix}.weight", self.weights[f"{prefix}.weight"].T)
        bias = self.constant(f"{prefix}.bias", self.weights[f"{prefix}.bias"])
        return self.op("Add", [self.op("MatMul", [x, weight]), bias])

    def layer_norm(self, x: str, prefix: str) -> str:
        scale = self.constant(f"{prefix}.weight", self.weights[f"{prefix}.weight"])
        bias = self.constant(f"{prefix}.bias", self.weights[f"{prefix}.bias"])
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=self.eps)

    def attention(self, x: str, mask: str, prefix: str, heads: int) -> str:
        """Self-attention as ONNX Runtime's fused op: packed Q|K|V projection, masked softmax."""
        names = ("query", "key", "value")
        packed = np.concatenate([self.weights[f"{prefix}.{n}.weight"].T for n in names], axis=1)
        bias = np.concatenate([self.weights[f"{prefix}.{n}.bias"] for n in names])
        inputs = [
            x,
            self.constant(f"{prefix}.qkv.weight", packed),
            self.constant(f"{prefix}.qkv.bias", bias),
            mask,
        ]
        return self.op("Attention", inputs, domain="com.microsoft", num_heads=heads)

    def gelu(self, x: str) -> str:
        """Exact (erf) GELU, as BERT uses: 0.5 · x · (1 + erf(x / √2))."""
        erf = self.op("Erf", [self.op("Div", [x, "sqrt2"])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, "one"])]), "half"])


def build_minilm(folder: Path) -> onnx.ModelProto:
    """Build the ONNX model from `config.json` and `model.safetensors` in `folder`."""
    config = json.loads((folder / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    weights = {
        key.removeprefix("bert."): value.astype(np.float32, copy=False)
        for key, value in load_file(str(folder / "model.safetensors")).items()
    }
    g = _Graph(weights, eps=float(config.get("layer_norm_eps", 1e-12)))
    g.constant("one", np.array(1.0, np.float32))
    g.constant("half", np.array(0.5, np.float32))
    g.constant("sqrt2", np.array(np.sqrt(2.0), np.float32))

    # 1. Embeddings: word + position (the first `tokens` rows, by Slice) + token type 0.
    word = g.op(
        "Gather",
        [g.constant("word_embeddings", weights["embeddings.word_embeddings.weight"]), "input_ids"],
    )
    tokens = g.op("Shape", ["input_ids"], start=1, end=2)
    position = g.op(
        "Slice",
        [
            g.constant("position_embeddings", weights["embeddings.position_embeddings.weight"]),
            g.constant("zero", np.array([0], np.int64)),
            tokens,
            g.constant("axis0", np.array([0], np.int64)),
        ],
    )
    token_type = g.constant("token_type_0", weights["embeddings.token_type_embeddings.weight"][0])
    x = g.layer_norm(
        g.op("Add", [g.op("Add", [word, position]), token_type]), "embeddings.LayerNorm"
    )

    # 2. Encoder layers: attention and feed-forward, each with a residual and LayerNorm.
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.INT32)
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        context = g.attention(x, mask, f"{p}.attention.self", heads)
        attended = g.op("Add", [g.dense(context, f"{p}.attention.output.dense"), x])
        x = g.layer_norm(attended, f"{p}.attention.output.LayerNorm")
        inner = g.gelu(g.dense(x, f"{p}.intermediate.dense"))
        x = g.layer_norm(
            g.op("Add", [g.dense(inner, f"{p}.output.dense"), x]), f"{p}.output.LayerNorm"
        )

    # 3. Mean over the real tokens (padding weighs 0), then L2 normalisation.
    weight = g.op(
        "Unsqueeze",
        [
            g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT),
            g.constant("axis2", np.array([2], np.int64)),
        ],
    )
    axis1 = g.constant("axis1", np.array([1], np.int64))
    summed = g.op("ReduceSum", [g.op("Mul", [x, weight]), axis1], keepdims=0)
    count = g.op(
        "Max",
        [
            g.op("ReduceSum", [weight, axis1], keepdims=0),
            g.constant("min_count", np.array(1e-9, np.float32)),
        ],
    )
    mean = g.op("Div", [summed, count])
    norm = g.op(
        "Max",
        [
            g.op("ReduceL2", [mean], axes=[-1], keepdims=1),
            g.constant("min_norm", np.array(1e-12, np.float32)),
        ],
    )
    g.op("Div", [mean, norm], output=OUTPUT)

    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in INPUTS],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", hidden])],
        g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in OPSETS],
        producer_name="caprag",
    )
    model.ir_version = 8  # readable by every ONNX Runtime since 1.10
    return model
