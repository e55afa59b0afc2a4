"""The Ray Serve batching tutorial's text generator, batched and streaming (decoupled).

One batch of prompts is left-padded into one tensor and decoded together, greedily, one
token per step with the KV cache; every step yields each row's new text piece, and a row
is marked finished (``nereid.FINISHED``) at its ``max_tokens`` or at end-of-text. The
model is GPT-2's architecture written in plain torch, small and untrained (seeded
weights, byte-level tokenizer): its text is gibberish, but deterministic. See README.md
beside config.toml.
"""

import codecs

import numpy as np

import nereid

#: Byte-level vocabulary: token i < 256 is the byte i; 256 is <|endoftext|> (also the
#: padding and the prompt of an empty prompt, as in GPT-2).
EOS = 256
VOCAB_SIZE = 257
#: Generation picks only printable ASCII (and end-of-text), so the untrained model's
#: text stays readable and every piece is complete UTF-8.
PRINTABLE = range(32, 127)
#: Spread of the seeded weights: wider than GPT-2's initializer (0.02), so that the
#: untrained model's greedy text varies instead of repeating one character.
WEIGHT_STD = 0.5


class ByteTokenizer:
    """UTF-8 bytes are the tokens; decoding is incremental, per row, so a character split
    over several tokens comes out whole once its last byte is there."""

    def encode(self, text: bytes) -> list[int]:
        return list(text) or [EOS]

    def decoder(self):
        return codecs.getincrementaldecoder("utf-8")(errors="replace")


class GPT2:
    """GPT-2's decoder (pre-LayerNorm blocks, learned positions, tanh-GELU MLP, output
    head tied to the token embedding), with a KV cache and an attention mask for padded
    batches. Plain torch: importing transformers in a model's ``__init__`` races with
    other models importing it on their loading threads (transformers' lazy imports are
    not thread-safe)."""

    def __init__(self, torch, *, layers, width, heads, positions, seed, device):
        self.torch = torch
        self.heads = heads
        self.positions = positions
        generator = torch.Generator().manual_seed(seed)
        f64 = torch.float64

        def weight(*shape):
            return (torch.randn(*shape, generator=generator, dtype=f64) * WEIGHT_STD).to(device)

        def zeros(*shape):
            return torch.zeros(*shape, dtype=f64, device=device)

        def ones(*shape):
            return torch.ones(*shape, dtype=f64, device=device)

        self.wte = weight(VOCAB_SIZE, width)
        self.wpe = weight(positions, width)
        self.blocks = [
            {
                "ln_1": (ones(width), zeros(width)),
                "attn": (weight(width, 3 * width), zeros(3 * width)),
                "attn_proj": (weight(width, width), zeros(width)),
                "ln_2": (ones(width), zeros(width)),
                "fc": (weight(width, 4 * width), zeros(4 * width)),
                "proj": (weight(4 * width, width), zeros(width)),
            }
            for _ in range(layers)
        ]
        self.ln_f = (ones(width), zeros(width))

    def __call__(self, ids, positions, mask, cache):
        """Logits of the last position of every row, and the extended cache.

        ``ids``/``positions``: [rows, new]; ``mask``: [rows, past + new] (1 = real token,
        0 = padding); ``cache``: per layer (keys, values) of the past, or None.
        """
        torch = self.torch
        F = torch.nn.functional
        x = self.wte[ids] + self.wpe[positions]
        rows, new, width = x.shape
        head = width // self.heads
        total = mask.shape[1]
        # Row r, new position i may see past+new position j when j is a real token and
        # j <= its own index (causal).
        causal = torch.ones(new, total, dtype=torch.bool, device=x.device).tril(total - new)
        allowed = causal[None, None] & mask[:, None, None, :].bool()
        bias = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(~allowed, torch.finfo(x.dtype).min)
        next_cache = []
        for layer, block in enumerate(self.blocks):
            h = F.layer_norm(x, (width,), *block["ln_1"])
            q, k, v = (h @ block["attn"][0] + block["attn"][1]).split(width, dim=-1)
            q, k, v = (t.view(rows, new, self.heads, head).transpose(1, 2) for t in (q, k, v))
            if cache is not None:
                k = torch.cat([cache[layer][0], k], dim=2)
                v = torch.cat([cache[layer][1], v], dim=2)
            next_cache.append((k, v))
            scores = (q @ k.transpose(-1, -2)) / head**0.5 + bias
            attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(rows, new, width)
            x = x + attended @ block["attn_proj"][0] + block["attn_proj"][1]
            h = F.layer_norm(x, (width,), *block["ln_2"])
            h = F.gelu(h @ block["fc"][0] + block["fc"][1], approximate="tanh")
            x = x + h @ block["proj"][0] + block["proj"][1]
        x = F.layer_norm(x[:, -1], (width,), *self.ln_f)
        return x @ self.wte.T, next_cache


class Model:
    def __init__(self, context):
        import torch

        self.torch = torch
        params = context.parameters
        self.default_max_tokens = int(params.get("default_max_tokens", "16"))
        self.max_tokens_limit = int(params.get("max_tokens_limit", "256"))
        self.device = torch.device(context.device)
        # float64, so that a prompt decodes to the same tokens alone or in any batch:
        # float32 rounding differences between batch shapes could flip a greedy argmax
        # between two close logits.
        self.model = GPT2(
            torch, layers=2, width=64, heads=4, positions=1024,
            seed=int(params.get("seed", "0")), device=self.device,
        )
        self.tokenizer = ByteTokenizer()
        allowed = torch.full((VOCAB_SIZE,), float("-inf"), dtype=torch.float64)
        allowed[list(PRINTABLE)] = 0.0
        allowed[EOS] = 0.0
        self.logit_mask = allowed.to(self.device)

    def infer(self, inputs):
        torch = self.torch
        prompts = [self.tokenizer.encode(bytes(text)) for text in inputs["text_input"].reshape(-1)]
        rows = len(prompts)
        if "max_tokens" in inputs:
            limits = [min(int(n), self.max_tokens_limit) for n in inputs["max_tokens"].reshape(-1)]
        else:
            limits = [self.default_max_tokens] * rows
        room = self.model.positions - max(limits)
        prompts = [p[-room:] for p in prompts]  # keep the end of over-long prompts

        # Left padding: every row's last prompt token sits in the last column, so one
        # next-token read (the last position) serves the whole batch.
        width = max(len(p) for p in prompts)
        ids = torch.full((rows, width), EOS, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)

        decoders = [self.tokenizer.decoder() for _ in range(rows)]
        produced = [0] * rows
        done = [limit <= 0 for limit in limits]
        cache = None
        while True:
            with torch.inference_mode():
                logits, cache = self.model(ids, positions, mask, cache)
                next_ids = (logits + self.logit_mask).argmax(-1)
            pieces = []
            for row, token in enumerate(next_ids.tolist()):
                if done[row]:
                    pieces.append("")
                    continue
                produced[row] += 1
                if token == EOS:
                    done[row] = True
                    pieces.append(decoders[row].decode(b"", final=True))
                    continue
                done[row] = produced[row] >= limits[row]
                pieces.append(decoders[row].decode(bytes((token,)), final=done[row]))
            yield {
                "text_output": np.array(pieces, dtype=object).reshape(rows, 1),
                nereid.FINISHED: np.array(done, dtype=bool),
            }
            if all(done):
                return
            ids = next_ids.unsqueeze(-1)
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
