#!/usr/bin/python3
"""An independent Llama forward pass in numpy (float64), written from Hugging Face's
LlamaForCausalLM semantics: it reads model.safetensors and config.json exactly as a Hugging Face
loader would and checks the per-position losses the engine computed for the same tokens.

usage: llama_reference.py DIR   (DIR holds model.safetensors, config.json and case.json with
"tokens" (B x T+1 ids) and "losses" (B x T, from the engine); exits 1 on a mismatch)
"""
import json
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        raw = np.frombuffer(data[base + begin : base + end], dtype="<f4")
        tensors[name] = raw.reshape(info["shape"]).astype(np.float64)
    return tensors


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, theta):
    """x: (T, heads, head_dim); Hugging Face's rotary embedding with rotate_half."""
    seq_len, _, head_dim = x.shape
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    freqs = np.outer(np.arange(seq_len), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return x * np.cos(emb)[:, None, :] + rotate_half(x) * np.sin(emb)[:, None, :]


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(w, cfg, tokens):
    """tokens: (T,) -> logits (T, vocab)."""
    heads = cfg["num_attention_heads"]
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta", 10000.0)
    x = w["model.embed_tokens.weight"][tokens]
    seq_len, hidden = x.shape
    head_dim = hidden // heads
    mask = np.triu(np.full((seq_len, seq_len), -np.inf), k=1)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(seq_len, heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(seq_len, heads, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(seq_len, heads, head_dim)
        q, k = apply_rope(q, theta), apply_rope(k, theta)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_dim) + mask
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(seq_len, hidden)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def main(directory):
    with open(f"{directory}/config.json") as f:
        cfg = json.load(f)
    with open(f"{directory}/case.json") as f:
        case = json.load(f)
    weights = load_safetensors(f"{directory}/model.safetensors")
    expected_names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg["tie_word_embeddings"]:
        expected_names.add("lm_head.weight")
    for layer in range(cfg["num_hidden_layers"]):
        for part in ["input_layernorm", "post_attention_layernorm"]:
            expected_names.add(f"model.layers.{layer}.{part}.weight")
        for part in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            expected_names.add(f"model.layers.{layer}.self_attn.{part}.weight")
        for part in ["gate_proj", "up_proj", "down_proj"]:
            expected_names.add(f"model.layers.{layer}.mlp.{part}.weight")
    if set(weights) != expected_names:
        print(f"tensor names differ: {sorted(set(weights) ^ expected_names)}")
        return 1
    worst = 0.0
    for row, engine_losses in zip(case["tokens"], case["losses"]):
        row = np.array(row)
        logits = forward(weights, cfg, row[:-1])
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        losses = -log_probs[np.arange(len(row) - 1), row[1:]]
        worst = max(worst, float(np.max(np.abs(losses - np.array(engine_losses)))))
    print(f"max |reference - engine| per-position loss: {worst:.3g}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
