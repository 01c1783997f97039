"""Precision policies for the deployed MLP, and what each one costs and changes.

Four policies, each a quantized parameter tree plus a forward pass:
  `f32`        float32 weights, activations and accumulation (the reference).
  `bf16`       bfloat16 weights and activations; every matmul accumulates in
               float32 (`preferred_element_type=float32`); biases stay float32.
  `int8_w`     int8 weights with one float32 scale per output channel
               (`s_j = max_i |W_ij| / 127`, symmetric); float32 activations and
               accumulation; the scale is applied after the matmul.
  `int8_w8a8`  int8 weights as above and int8 activations with one static
               float32 scale per layer, calibrated as `max |x| / 127` over the
               training inputs; int8 x int8 matmuls accumulate in int32
               (`preferred_element_type=int32`), then `acc * (a * s_j) + b`.

`account` counts bytes for weights (kernels and biases), activations (the
input of every matmul, per example, at the policy's activation dtype),
accumulators (every matmul's output, per example) and scales separately,
from the arrays themselves. `compare` evaluates every policy on held-out data
against f32: accuracy change, maximum logit error, and the flipped examples.
"""

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from deployment_audit.model import Params

POLICIES = ("f32", "bf16", "int8_w", "int8_w8a8")
INT8_MAX = 127


def _channel_scales(kernel: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric scales, float32 `(d_out,)`; a zero column gets scale 1
    [claim:int8-zero-column-scale-one].

    `scale[j] = max_i |kernel[i, j]| / 127` (axis 0: one scale per output column)
    [claim:int8-scale-per-output-column].
    """
    # --- exercise stage 2: One scale per output column: its largest magnitude over 127. ---
    peak = np.abs(kernel).max(axis=0)
    return np.where(peak > 0, peak / INT8_MAX, 1.0).astype(np.float32)
    # --- end exercise ---


def _quantize_int8(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`x / scale` as int8, `scale` broadcasting over `x`'s last axis.

    Cases: rounding is to nearest (not truncation) [claim:int8-round-to-nearest], with
    ties to even (`np.rint`) [claim:int8-ties-to-even]; a value beyond +-127 steps is
    clipped to +-127 (never -128) [claim:int8-clip-to-127]; the dtype is int8
    [claim:int8-dtype].
    """
    # --- exercise stage 2: Divide by the scale, round to nearest, clip to +-127, int8. ---
    return np.clip(np.rint(x / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    # --- end exercise ---


def quantize(params: Params, policy: str, calibration: np.ndarray) -> dict[str, Any]:
    """The policy's parameter tree (NumPy arrays, float32 params as input).

    `calibration`: normalized inputs float32 `(n, 64)`, used by `int8_w8a8` only
    (static activation scales); the other policies ignore it.
    """
    if policy not in POLICIES:
        raise ValueError(f"Unknown precision policy `{policy}`; choose one of {list(POLICIES)}.")
    layers = [
        {k: np.asarray(v, np.float32) for k, v in layer.items()} for layer in params["layers"]
    ]
    if policy == "f32":
        return {"layers": layers}
    if policy == "bf16":
        return {
            "layers": [
                {"kernel": lay["kernel"].astype(ml_dtypes.bfloat16), "bias": lay["bias"]}
                for lay in layers
            ]
        }
    out = []
    for lay in layers:
        scale = _channel_scales(lay["kernel"])
        out.append(
            {"kernel": _quantize_int8(lay["kernel"], scale), "bias": lay["bias"], "w_scale": scale}
        )
    if policy == "int8_w8a8":
        # Static per-layer activation scales: run the f32 network on the
        # calibration set and take each matmul input's largest magnitude.
        x = np.asarray(calibration, np.float32)
        for i, lay in enumerate(layers):
            peak = float(np.abs(x).max())
            out[i]["a_scale"] = np.float32(peak / INT8_MAX if peak > 0 else 1.0)
            x = x @ lay["kernel"] + lay["bias"]
            if i < len(layers) - 1:
                x = np.maximum(x, 0.0)
    return {"layers": out}


def forward(qparams: dict[str, Any], policy: str, x: jax.Array) -> jax.Array:
    """Logits float32 `(batch, 10)` of normalized inputs `x` float32 `(batch, 64)`."""
    layers = qparams["layers"]
    for i, lay in enumerate(layers):
        if policy == "f32":
            y = x @ lay["kernel"] + lay["bias"][None, :]
        elif policy == "bf16":
            y = jax.lax.dot(
                x.astype(jnp.bfloat16), lay["kernel"], preferred_element_type=jnp.float32
            )
            y = y + lay["bias"][None, :]
        elif policy == "int8_w":
            y = x @ lay["kernel"].astype(jnp.float32)
            y = y * lay["w_scale"][None, :] + lay["bias"][None, :]
        else:  # int8_w8a8
            xq = jnp.clip(jnp.rint(x / lay["a_scale"]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
            acc = jax.lax.dot(xq, lay["kernel"], preferred_element_type=jnp.int32)
            y = acc.astype(jnp.float32) * (lay["a_scale"] * lay["w_scale"])[None, :]
            y = y + lay["bias"][None, :]
        x = jax.nn.relu(y) if i < len(layers) - 1 else y
    return x


forward_jit = jax.jit(forward, static_argnums=1)


def int8_accumulators(qparams: dict[str, Any], x: jax.Array) -> list[jax.Array]:
    """`int8_w8a8` only: each layer's int32 accumulator, for the exactness check."""
    accs = []
    layers = qparams["layers"]
    for i, lay in enumerate(layers):
        xq = jnp.clip(jnp.rint(x / lay["a_scale"]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
        acc = jax.lax.dot(xq, lay["kernel"], preferred_element_type=jnp.int32)
        accs.append(acc)
        y = acc.astype(jnp.float32) * (lay["a_scale"] * lay["w_scale"])[None, :]
        y = y + lay["bias"][None, :]
        x = jax.nn.relu(y) if i < len(layers) - 1 else y
    return accs


_ACTIVATION_BYTES = {"f32": 4, "bf16": 2, "int8_w": 4, "int8_w8a8": 1}


def account(qparams: dict[str, Any], policy: str) -> dict[str, int]:
    """Bytes by kind, counted from the arrays of `qparams`.

    `weights_bytes`: kernels and biases as stored. `scales_bytes`: quantization
    scales. `activations_bytes_per_example`: the input of every matmul at the
    policy's activation dtype. `accumulator_bytes_per_example`: every matmul's
    output at the accumulator dtype (float32 or int32: 4 bytes).
    """
    layers = qparams["layers"]
    weights = sum(
        np.asarray(lay["kernel"]).nbytes + np.asarray(lay["bias"]).nbytes for lay in layers
    )
    scales = sum(
        np.asarray(lay[k]).nbytes for lay in layers for k in ("w_scale", "a_scale") if k in lay
    )
    d_in = [np.asarray(lay["kernel"]).shape[0] for lay in layers]
    d_out = [np.asarray(lay["kernel"]).shape[1] for lay in layers]
    return {
        "weights_bytes": int(weights),
        "scales_bytes": int(scales),
        "activations_bytes_per_example": int(sum(d_in) * _ACTIVATION_BYTES[policy]),
        "accumulator_bytes_per_example": int(sum(d_out) * 4),
    }


def compare(
    params: Params,
    x_heldout: np.ndarray,
    labels: np.ndarray,
    ids: np.ndarray,
    calibration: np.ndarray,
) -> dict[str, Any]:
    """Every policy on held-out normalized inputs `x_heldout` float32 `(n, 64)`.

    Returns `{"rows": [...], "count": n}`; a row per policy with the byte
    accounting, `accuracy`, `accuracy_change` (vs f32), `max_abs_logit_error`
    (vs f32 logits) and `flipped`: every example whose predicted class differs
    from f32's, with its sample ID, true label and both predictions.
    """
    x = jnp.asarray(x_heldout, jnp.float32)
    reference = None
    rows = []
    for policy in POLICIES:
        qparams = quantize(params, policy, calibration)
        logits = np.asarray(forward_jit(jax.tree.map(jnp.asarray, qparams), policy, x))
        predictions = logits.argmax(axis=1)
        if reference is None:
            reference = (logits, predictions)
        ref_logits, ref_predictions = reference
        flipped = np.flatnonzero(predictions != ref_predictions)
        accuracy = float((predictions == labels).mean())
        rows.append(
            {
                "policy": policy,
                **account(qparams, policy),
                "accuracy": accuracy,
                "accuracy_change": accuracy - float((ref_predictions == labels).mean()),
                "max_abs_logit_error": float(np.abs(logits - ref_logits).max()),
                "flipped": [
                    {
                        "id": int(ids[i]),
                        "label": int(labels[i]),
                        "f32_prediction": int(ref_predictions[i]),
                        "prediction": int(predictions[i]),
                    }
                    for i in flipped
                ],
            }
        )
    return {"count": len(labels), "rows": rows}
