#!/usr/bin/python3
"""Trains kvtier's small DeepSeek-V2 model on the Jargon File.

The model has DeepSeek-V2's architecture at a small size: MLA with a
compressed KV latent and decoupled RoPE, a dense first layer, then MoE
layers with routed and shared experts, and a byte-level vocabulary in
ByT5's layout (0 pad, 1 end of text, 2 unknown, byte b as b + 3), so no
tokenizer library is needed. The text is the Jargon File 4.4.7 as Debian's
jargon-text package ships it (public domain); every 20th entry is held
out, never trained on, and written to heldout.txt for the fidelity
benchmark.

The result is a Hugging Face checkpoint (config.json, model.safetensors in
bf16, tokenizer_config.json) that kvtier's loader reads unchanged. The
forward pass here is the reference semantics kvtier's runtime implements
(DeepSeek-V2's modeling code); --check-with runs `kvtier run` on the
written checkpoint and compares its logprobs with this file's.

    apt-get install -y python3-torch jargon-text libopenblas0-pthread
    python3 models/train_jargon.py --out models/jargon-mla
"""

import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

JARGON = "/usr/share/doc/jargon-text/jargon.txt.gz"
PAD, EOS, UNK, BYTE_OFFSET = 0, 1, 2, 3
VOCAB = 256 + BYTE_OFFSET
HELDOUT_EVERY = 20

CONFIG = {
    "model_type": "deepseek_v2",
    "architectures": ["DeepseekV2ForCausalLM"],
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 384,
    "moe_intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "hidden_act": "silu",
    "scoring_func": "softmax",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": EOS,
    "eos_token_id": EOS,
    "pad_token_id": PAD,
}


# ---------------------------------------------------------------- the text


def jargon_entries(path=JARGON):
    """The glossary's entries, each a ':headword: ...' paragraph group with
    the file's three-space indent removed."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("   :(TM):"))
    entries, current = [], []
    for line in lines[start:]:
        line = line[3:] if line.startswith("   ") else line.lstrip()
        if line.startswith(":") and line.count(":") >= 2 and current:
            entries.append(current)
            current = []
        current.append(line)
    entries.append(current)
    texts = []
    for e in entries:
        text = "\n".join(e).strip()
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        texts.append(text)
    return texts


def split_corpus(entries):
    """Every HELDOUT_EVERY-th entry is held out; entries end with EOS."""
    train = [e for i, e in enumerate(entries) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    heldout = [e for i, e in enumerate(entries) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    return train, heldout


def encode(text):
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def token_stream(entries):
    ids = []
    for e in entries:
        ids += encode(e) + [EOS]
    return torch.tensor(ids, dtype=torch.long)


# --------------------------------------------------------------- the model


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    """DeepSeek-V2's rotary embedding: interleaved pairs de-interleaved,
    then rotate_half. x: [..., seq, dim]."""
    *lead, s, d = x.shape
    x = x.reshape(*lead, s, d // 2, 2).transpose(-1, -2).reshape(*lead, s, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class SwiGlu(torch.nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(torch.nn.Module):
    """Softmax gate, greedy top-k, unnormalized weights, shared experts.
    Every expert runs on every row (a small model on a CPU: one matrix
    product each beats gathering rows); unchosen experts weigh zero."""

    def __init__(self, c):
        super().__init__()
        h, inter = c["hidden_size"], c["moe_intermediate_size"]
        self.top_k = c["num_experts_per_tok"]
        self.scale = c["routed_scaling_factor"]
        self.gate = torch.nn.Linear(h, c["n_routed_experts"], bias=False)
        self.experts = torch.nn.ModuleList(SwiGlu(h, inter) for _ in range(c["n_routed_experts"]))
        self.shared_experts = SwiGlu(h, inter * c["n_shared_experts"])
        self.balance_loss = torch.zeros(())

    def forward(self, x):
        scores = F.softmax(self.gate(x).float(), dim=-1)
        top, chosen = torch.topk(scores, self.top_k, dim=-1)
        weights = torch.zeros_like(scores).scatter(-1, chosen, top * self.scale)
        out = self.shared_experts(x)
        for e, expert in enumerate(self.experts):
            out = out + weights[..., e : e + 1] * expert(x)
        n = scores.shape[-1]
        routed = torch.zeros_like(scores).scatter(-1, chosen, 1.0).reshape(-1, n).mean(0) / self.top_k
        self.balance_loss = n * (routed * scores.reshape(-1, n).mean(0)).sum()
        return out


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, heads = c["hidden_size"], c["num_attention_heads"]
        self.heads, self.nope, self.rope_dim = heads, c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.v, self.kv = c["v_head_dim"], c["kv_lora_rank"]
        self.q_proj = torch.nn.Linear(h, heads * (self.nope + self.rope_dim), bias=False)
        self.kv_a_proj_with_mqa = torch.nn.Linear(h, self.kv + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv, c["rms_norm_eps"])
        self.kv_b_proj = torch.nn.Linear(self.kv, heads * (self.nope + self.v), bias=False)
        self.o_proj = torch.nn.Linear(heads * self.v, h, bias=False)
        self.scale = (self.nope + self.rope_dim) ** -0.5

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, -1).transpose(1, 2) * self.scale
        q = torch.cat((q[..., : self.nope], rope(q[..., self.nope :], cos, sin)), dim=-1)
        kv_a = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(kv_a[..., : self.kv])
        k_pe = rope(kv_a[..., self.kv :].unsqueeze(1), cos, sin)
        kv = self.kv_b_proj(latent).view(b, s, self.heads, -1).transpose(1, 2)
        value = kv[..., self.nope :]
        # One product for both parts of the key: [k_nope, k_pe] per head.
        k = torch.cat((kv[..., : self.nope], k_pe.expand(b, self.heads, s, self.rope_dim)), dim=-1)
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        attn = F.softmax((q @ k.transpose(-1, -2)).masked_fill(future, float("-inf")), dim=-1) @ value
        return self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))


class Layer(torch.nn.Module):
    def __init__(self, c, index):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        moe = index >= c["first_k_dense_replace"] and index % c["moe_layer_freq"] == 0
        self.mlp = Moe(c) if moe else SwiGlu(c["hidden_size"], c["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(torch.nn.Module):
    """Parameter names are the Hugging Face checkpoint's."""

    def __init__(self, c):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = torch.nn.ModuleList(Layer(c, i) for i in range(c["num_hidden_layers"]))
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = c["qk_rope_head_dim"]
        self.inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], dtype=torch.float64)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().float(), emb.sin().float()
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def balance_loss(self):
        return sum(l.mlp.balance_loss for l in self.model.layers if isinstance(l.mlp, Moe))


# ------------------------------------------------------------- the files


def write_safetensors(path, tensors):
    """bf16 tensors in the safetensors format: a little-endian u64 header
    length, the JSON header, then the data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_checkpoint(model, out):
    os.makedirs(out, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if k != "inv_freq"}
    write_safetensors(os.path.join(out, "model.safetensors"), dict(sorted(state.items())))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "ByT5Tokenizer",
                "extra_ids": 0,
                "pad_token": "<pad>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": CONFIG["max_position_embeddings"],
            },
            f,
            indent=2,
        )
        f.write("\n")


# ------------------------------------------------------ training and use


def heldout_perplexity(model, ids, window):
    """Teacher-forced perplexity over `ids` in windows of `window` tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start : start + window + 1]
            if len(chunk) < 2:
                break
            logits = model(chunk[:-1].unsqueeze(0))[0]
            total += F.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return math.exp(total / count)


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train_entries, heldout_entries = split_corpus(jargon_entries(args.corpus))
    data = token_stream(train_entries)
    heldout = token_stream(heldout_entries)
    print(f"train {len(data)} bytes ({len(train_entries)} entries), held out {len(heldout)} "
          f"({len(heldout_entries)} entries)", flush=True)
    model = Model(CONFIG)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "embed" in name else p.shape[1] ** -0.5)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params} parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        lr *= 0.5 * (1 + math.cos(math.pi * step / args.steps)) * 0.9 + 0.1
        for group in opt.param_groups:
            group["lr"] = lr
        offsets = torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[o : o + args.seq + 1] for o in offsets.tolist()])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        (loss + args.balance * model.balance_loss()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {lr:.2e}  {time.time() - start:6.0f} s", flush=True)
    # What is written is bf16: measure that.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.eval()
    ppl = heldout_perplexity(model, heldout, args.seq)
    print(f"held-out perplexity (bf16 weights, windows of {args.seq}): {ppl:.3f} per byte "
          f"(uniform: {VOCAB})", flush=True)
    write_checkpoint(model, args.out)
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(heldout_entries) + "\n")
    return model


def load(out):
    """The checkpoint in `out` back into a Model (float32)."""
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    model = Model(CONFIG)
    state = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        raw = torch.frombuffer(bytearray(data[b:e]), dtype=torch.int16).view(torch.bfloat16)
        state[name] = raw.float().reshape(meta["shape"])
    model.load_state_dict(state, strict=False)
    return model.eval()


def check_with(kvtier, out, prompt_text, new_tokens):
    """Runs `kvtier run` (float latents: blocks larger than the text) and
    compares its greedy tokens and logprobs with this file's forward."""
    model = load(out)
    prompt = encode(prompt_text)
    run = subprocess.run(
        [kvtier, "run", "--model", out, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
         str(new_tokens), "--tokens-per-block", "4096", "--json"],
        check=True, capture_output=True, text=True)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    ids = list(prompt)
    worst = 0.0
    with torch.no_grad():
        for token, logprob in zip(got["ids"], got["logprobs"]):
            lp = F.log_softmax(model(torch.tensor([ids]))[0, -1], dim=-1)
            if int(lp.argmax()) != token:
                sys.exit(f"kvtier chose {token}, the reference {int(lp.argmax())} after {len(ids)} tokens")
            worst = max(worst, abs(float(lp[token]) - logprob))
            ids.append(token)
    text = bytes(t - BYTE_OFFSET for t in got["ids"] if t >= BYTE_OFFSET).decode("utf-8", "replace")
    print(f"kvtier run matches this reference: {len(got['ids'])} greedy tokens, largest logprob "
          f"difference {worst:.2e}\n{prompt_text}{text}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "jargon-mla"))
    p.add_argument("--corpus", default=JARGON, help="the Jargon File, gzipped (Debian's jargon-text)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512, help="training context, tokens")
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--balance", type=float, default=0.01, help="weight of the experts' balance loss")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--check-with", metavar="KVTIER", help="after training, compare `KVTIER run` with this model")
    p.add_argument("--check-only", action="store_true", help="skip training; check the checkpoint in --out")
    args = p.parse_args()
    if not args.check_only:
        train(args)
    if args.check_with:
        check_with(args.check_with, args.out, ":kluge: /klooj/, n.\n\n1. A clever programming trick", 48)


if __name__ == "__main__":
    main()
