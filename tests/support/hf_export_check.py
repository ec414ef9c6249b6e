#!/usr/bin/python3
"""Checks an exported Hugging Face directory with code of its own: tokenizer.json against GPT-2's
byte-to-character map written here from its definition, and a sampled continuation against the
numpy Llama of llama_reference.py (float64), one token at a time on the engine's own text.

usage: hf_export_check.py DIR   (DIR holds the export and sample.json with "prompt" and
"continuation", token ids of a greedy (temperature 0) sample; exits 1 on a mismatch)
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference  # noqa: E402


def gpt2_byte_characters():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def check_tokenizer(directory):
    with open(f"{directory}/tokenizer.json", encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    expected = {ch: b for b, ch in gpt2_byte_characters().items()}
    if tok["model"]["type"] != "BPE" or tok["model"]["merges"] != [] or vocab != expected:
        print("tokenizer.json: not a byte-level BPE with GPT-2's byte map and no merges")
        return False
    for part in ("pre_tokenizer", "decoder"):
        if tok[part]["type"] != "ByteLevel" or tok[part]["add_prefix_space"]:
            print(f"tokenizer.json: {part} is not ByteLevel without a prefix space")
            return False
    text = "In the beginning\n\u00e9\x00".encode("utf-8")
    ids = [vocab[gpt2_byte_characters()[b]] for b in text]
    if ids != list(text):
        print(f"tokenizer.json: {text!r} encodes to {ids}")
        return False
    return True


def check_sample(directory):
    with open(f"{directory}/config.json") as f:
        cfg = json.load(f)
    with open(f"{directory}/sample.json") as f:
        sample = json.load(f)
    weights = llama_reference.load_safetensors(f"{directory}/model.safetensors")
    window = cfg["max_position_embeddings"]
    text = list(sample["prompt"])
    for step, token in enumerate(sample["continuation"]):
        logits = llama_reference.forward(weights, cfg, np.array(text[-window:]))[-1]
        best = int(np.argmax(logits))
        # float32 against float64: a token within 1e-4 of the best is as good a greedy choice.
        if token != best and logits[best] - logits[token] > 1e-4:
            print(f"step {step}: the engine chose {token}, the reference {best} "
                  f"(logits {logits[token]:.6f} and {logits[best]:.6f})")
            return False
        text.append(token)
    print(f"{len(sample['continuation'])} greedy tokens agree with the reference")
    return True


if __name__ == "__main__":
    ok = check_tokenizer(sys.argv[1]) and check_sample(sys.argv[1])
    sys.exit(0 if ok else 1)
