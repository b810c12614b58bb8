"""Every shell example of the README runs as written (issue 49): in bash,
with the venv's bin first on PATH (where `make run` puts `gemma-cy`), from
a temporary directory that holds the files the examples name, only with
fewer tokens (`-n`/`--n_dec` at most 2, `--chunks 1`, a 128-token eval
context, one repetition of a benchmark). tests/test_readme.py does the same
for the Python section.

Which lines are examples: every line of a fenced block without a language
or marked sh/bash/shell/console whose first command starts with a command
word (``COMMAND_WORDS``, a `.venv/bin/` or `scripts/` path); `\\`
continuations are joined and a trailing `# comment` is cut. Every line of
such a block must be a command (``test_every_shell_line_is_an_example``),
so a new kind of line cannot slip past this test unrun.

`make` lines (`make run`, `make test`) are not run: they are what sets up
the venv and model this test runs on, and what runs this test.
"""
from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, gguf_tensors

pytestmark = pytest.mark.slow

README = REPO / "README.md"
SHELL_INFOS = ("", "sh", "bash", "shell", "console")
COMMAND_WORDS = {"gemma-cy", "make", "python", "python3", "time", "echo", "pip", "cd", "export", "cat", "ls", "curl"}
SUBCOMMANDS = ("diff", "eval", "convert", "batch", "serve")
MAX_TOKENS = 2
EVAL_CTX = 128
TIMEOUT = 240
# the presets benchmark's 270m-gmw1 preset: a 427 MB generated file and a NumPy
# reference engine holding 1.7 GB of f32 weights; the tiny preset runs the same code
BENCH_DROPPED_MODELS = ("270m-gmw1",)
BENCH_QUICK = ["--contexts", "128", "--n_dec", str(MAX_TOKENS), "--no_peers"]


# ---------------------------------------------------------------- the examples

def is_command(line: str) -> bool:
    word = line.split(maxsplit=1)[0] if line.split() else ""
    return word in COMMAND_WORDS or word.startswith((".venv/bin/", "scripts/"))


def strip_comment(line: str) -> str:
    """``line`` without a trailing bash comment: a ``#`` that starts a word
    outside quotes ('...', "...", $'...')."""
    quote, i = None, 0
    while i < len(line):
        c = line[i]
        if quote is None:
            if c == "\\":
                i += 2
                continue
            if c == "$" and line[i + 1:i + 2] == "'":
                quote, i = "$'", i + 2
                continue
            if c in "'\"":
                quote = c
            elif c == "#" and (i == 0 or line[i - 1].isspace()):
                return line[:i].rstrip()
        elif quote == "'" and c == "'":
            quote = None
        elif quote in ('"', "$'") and c == "\\":
            i += 2
            continue
        elif (quote == '"' and c == '"') or (quote == "$'" and c == "'"):
            quote = None
        i += 1
    return line.rstrip()


def shell_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number of the first line, its lines) of every fenced shell block."""
    blocks = []
    for m in re.finditer(r"^```([\w-]*)[ \t]*\n(.*?)^```", text, re.M | re.S):
        if m.group(1) not in SHELL_INFOS:
            continue
        lines = [line[2:] if m.group(1) == "console" and line.startswith("$ ") else line
                 for line in m.group(2).splitlines()]
        first = next((line for line in lines if line.strip()), "")
        if is_command(first):
            blocks.append((text.count("\n", 0, m.start(2)) + 1, lines))
    return blocks


def examples(text: str) -> list[tuple[int, str]]:
    """(README line number, command) of every shell example: continuations
    joined, comments cut."""
    out = []
    for start, lines in shell_blocks(text):
        pending, at = "", None
        for n, line in enumerate(lines, start):
            if not pending and not line.strip():
                continue
            at = at if pending else n
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            out.append((at, strip_comment(pending + line).strip()))
            pending = ""
    return out


def readme_examples() -> list[tuple[int, str]]:
    return examples(README.read_text(encoding="utf-8"))


def last_segment(cmd: str) -> str:
    """The last command of a pipeline (what gets the prompt on stdin)."""
    return cmd.rsplit("|", 1)[-1].strip() if "|" in strip_quoted(cmd) else cmd


def strip_quoted(cmd: str) -> str:
    return re.sub(r"\$'(?:[^'\\]|\\.)*'|'[^']*'|\"(?:[^\"\\]|\\.)*\"", "''", cmd)


def kind(cmd: str) -> str:
    """make, gemma-cy (generates text), gemma-cy-SUB, bench, time, python or other."""
    seg = last_segment(cmd)
    words = seg.split()
    if words[0] == "make":
        return "make"
    if words[0] == "gemma-cy":
        return f"gemma-cy-{words[1]}" if len(words) > 1 and words[1] in SUBCOMMANDS else "gemma-cy"
    if "scripts/bench.py" in seg:
        return "bench"
    if "scripts/bench_batch.py" in seg:
        return "bench-batch"
    if "scripts/bench_speculative.py" in seg:
        return "bench-speculative"
    if words[0] == "time":
        return "time"
    if words[0] == "curl":
        return "curl"
    if words[0].endswith("python") or words[0] in ("python", "python3"):
        return "python"
    return "other"


def shortened(cmd: str) -> str:
    """``cmd`` with few tokens: -n/--n_dec at most MAX_TOKENS (added where
    absent), --chunks 1 and a small eval context, one benchmark repetition."""
    k = kind(cmd)
    cmd = re.sub(r"(?<=\s)(-n|--n_dec)(\s+)(\d+)\b", lambda m: f"{m[1]}{m[2]}{min(int(m[3]), MAX_TOKENS)}", cmd)
    cmd = re.sub(r"(?<=\s)--chunks\s+\d+\b", "--chunks 1", cmd)
    has_n = re.search(r"(?<=\s)(-n|--n_dec)\s", cmd)
    if k == "gemma-cy" and not has_n:
        cmd += f" -n {MAX_TOKENS}"
    elif k == "gemma-cy-diff" and not has_n:
        cmd += f" --n_dec {MAX_TOKENS}"
    elif k == "gemma-cy-eval" and "--ctx" not in cmd:
        cmd += f" --ctx {EVAL_CTX}"
    elif k == "bench-batch":
        cmd = re.sub(r"(?<=\s)--repeat\s+\d+\b", "", cmd) + " --repeat 1 --batches 1,2 --prompt 8 --steps 2 --no_peers"
    elif k == "bench-speculative":
        cmd = re.sub(r"(?<=\s)--repeat\s+\d+\b", "", cmd) + " --repeat 1 --tokens 4 --limit 1 --no_peers"
    elif k == "bench":
        cmd = re.sub(r"(?<=\s)--repeats?\s+\d+\b", "--repeat 1", cmd)
        cmd = re.sub(r"(?<=--models )(\S+)",
                     lambda m: ",".join(x for x in m[1].split(",") if x not in BENCH_DROPPED_MODELS), cmd)
        cmd += " " + " ".join(BENCH_QUICK)
    return cmd


def interactive(cmd: str) -> bool:
    """gemma-cy with no prompt and stdin not piped: the chat on a terminal."""
    seg = strip_quoted(cmd)
    return (kind(cmd) == "gemma-cy" and "|" not in seg and "<" not in seg
            and not re.search(r"(?<=\s)(-p|--prompt|--prompt_ids|--dump)\b", seg))


EXAMPLES = readme_examples()


# ---------------------------------------------------------------- the directory the examples run in

def bin_dir() -> Path:
    return Path(sys.executable).parent


def shell_env(**extra) -> dict:
    env = dict(os.environ, PATH=f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}", **extra)
    env.pop("GEMMA_CY_SIMD", None)
    return env


def write_llama_gguf(path: Path) -> None:
    """A small random Llama with llama2.c's settings (RoPE base 10000, eps
    1e-5, n_heads*head_dim = dim, BOS 1, EOS 2) and a SentencePiece vocab:
    the kind of model `gemma-cy convert --to llama2c` takes. No model that
    ships is of that kind (the README says why)."""
    from gemma_cy.formats.gguf_writer import write_gguf
    from gemma_cy.model.config import ModelConfig
    from gemma_cy.model.weights import Weights, expected_shapes
    from gemma_cy.quant.tensors import F32Tensor

    words = ["\u2581"] + list("abcdefghijklmnopqrstuvwxyzOT,.") + [
        "\u2581" + w for w in ("Once", "upon", "a", "time", "there", "was", "little", "girl", "the", "sun")]
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + words
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    dim, hidden, layers, heads, kv_heads, ctx = 64, 128, 2, 4, 2, 128
    config = ModelConfig(n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=dim // heads,
                         mlp_dim=hidden, vocab_size=len(pieces), max_seq_len=ctx, activation="silu",
                         rope_pairing="interleaved", rope_base=10000.0, norm_eps=1e-5, norm_gain="plain",
                         position_table=False, tied_embeddings=False, bos_id=1, eos_ids=(2,))
    rng = np.random.default_rng(15)
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            tensors[name] = F32Tensor(np.ones(shape, np.float32))
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
            if name == "lm_head":  # words far more likely than specials and bytes: text comes out
                w[:259] = 0
                w[259:] *= 5
            tensors[name] = F32Tensor(w.astype(np.float32))
    fields = {"general.architecture": "llama", "llama.context_length": ctx, "llama.embedding_length": dim,
              "llama.block_count": layers, "llama.feed_forward_length": hidden, "llama.attention.head_count": heads,
              "llama.attention.head_count_kv": kv_heads,
              "llama.attention.layer_norm_rms_epsilon": np.float32(1e-5),
              "llama.rope.freq_base": np.float32(10000.0), "tokenizer.ggml.model": "llama",
              "tokenizer.ggml.tokens": pieces, "tokenizer.ggml.scores": np.array(scores, np.float32),
              "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.bos_token_id": 1,
              "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    write_gguf(path, fields, gguf_tensors(Weights(config=config, tensors=tensors, source="random")))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, default_model) -> Path:
    """What the examples name, relative to where they run: model.gguf (the
    default model), model.q8_0.gguf (its conversion, as the example before
    makes it), models/tiny.gmw (as `make run-tiny` makes it), stories15M.bin
    and tokenizer.bin (converted from a Llama GGUF with llama2.c's
    settings), FILE (a text), requests.jsonl (two batch requests), and .venv
    and scripts/ as in the repository."""
    from gemma_cy.commands.convert import convert, to_llama2c

    if shutil.which("gemma-cy", path=str(bin_dir())) is None:
        pytest.skip(f"no gemma-cy console script in {bin_dir()} (the README's examples run it from the venv)")
    d = tmp_path_factory.mktemp("readme_shell")
    (d / "model.gguf").symlink_to(default_model)
    (d / ".venv").symlink_to(sys.prefix)
    (d / "scripts").symlink_to(REPO / "scripts")
    (d / "models").mkdir()
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_test_weights.py"), "--size", "tiny",
                    "-o", str(d / "models" / "tiny.gmw")], check=True, capture_output=True, timeout=120)
    convert(default_model, d / "model.q8_0.gguf")
    write_llama_gguf(d / "llama.gguf")
    assert to_llama2c(d / "llama.gguf", d / "stories15M.bin") == str(d / "tokenizer.bin")
    (d / "FILE").write_text(README.read_text(encoding="utf-8"), encoding="utf-8")
    (d / "requests.jsonl").write_text(
        '{"prompt": "The capital of France is", "max_tokens": 2}\n'
        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}\n', encoding="utf-8")
    # the interactive chat keeps its history in cache_dir(): a private one, sharing the tokenizer tables
    from gemma_cy.formats.packaged import cache_dir
    (d / "cache" / "gemma-cy").mkdir(parents=True)
    if (cache_dir() / "tokenizers").is_dir():
        (d / "cache" / "gemma-cy" / "tokenizers").symlink_to(cache_dir() / "tokenizers")
    return d


def run_bash(cmd: str, cwd: Path, timeout=TIMEOUT, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=shell_env(**env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def gemma_cy_argvs(cmd: str, cwd: Path) -> list[list[str]]:
    """The argv bash hands gemma-cy in ``cmd`` (gemma-cy replaced by a
    function that prints its arguments)."""
    fake = "gemma-cy() { printf '%s\\0' \"$@\"; printf '\\1'; }; "
    result = run_bash(fake + cmd, cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return [run.split("\0")[:-1] for run in result.stdout.split("\1")[:-1]]


def prompts(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-p", "--prompt", "--system")]


def run_on_terminal(cmd: str, cwd: Path, env: dict, line: str = "Why is the sky blue?",
                    timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run ``cmd`` on a pseudo-terminal: wait for the chat's "> ", type
    ``line``, wait for the answer's stats and the next "> ", then Ctrl-D.
    Returns (exit code, everything the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout

    def read_until(done) -> None:
        while not done(bytes(shown)):
            if time.monotonic() > deadline or proc.poll() is not None and not select.select([master], [], [], 0)[0]:
                raise AssertionError(f"the chat did not get there; the terminal showed: {bytes(shown)!r}")
            if select.select([master], [], [], 0.2)[0]:
                try:
                    shown.extend(os.read(master, 4096))
                except OSError:  # EIO: the child closed the terminal
                    pass

    try:
        read_until(lambda s: b"> " in s)
        os.write(master, line.encode() + b"\r")
        read_until(lambda s: b"stop: " in s and b"> " in s[s.index(b"stop: "):])
        os.write(master, b"\x04")
        code = proc.wait(timeout=60)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown.extend(chunk)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, shown.decode("utf-8", "replace")


def newline_id() -> int:
    import gemma_cy
    ids = gemma_cy.load().tokenizer.encode("\n")
    assert len(ids) == 1
    return ids[0]


# ---------------------------------------------------------------- the tests

def test_the_rule_finds_the_examples():
    cmds = [c for _, c in EXAMPLES]
    assert "make run" in cmds and "make test" in cmds
    kinds = {kind(c) for c in cmds}
    assert {"gemma-cy", "gemma-cy-diff", "gemma-cy-eval", "gemma-cy-convert", "gemma-cy-batch", "bench", "time",
            "python"} <= kinds
    assert any(interactive(c) for c in cmds)
    assert not any(" #" in strip_quoted(c) for c in cmds), "a comment was not cut"
    assert strip_comment("gemma-cy -p 'a # b' \"#c\" $'d\\' #e' x  # note") == "gemma-cy -p 'a # b' \"#c\" $'d\\' #e' x"


def test_every_shell_line_is_an_example():
    for start, lines in shell_blocks(README.read_text(encoding="utf-8")):
        previous = ""
        for n, line in enumerate(lines, start):
            if line.strip() and not previous.endswith("\\"):
                assert is_command(line), f"README.md:{n}: {line!r} is in a shell block but not an example"
            previous = line


@pytest.mark.parametrize("line,cmd", EXAMPLES, ids=[f"L{n}:{c[:40]}" for n, c in EXAMPLES])
def test_no_prompt_holds_a_literal_backslash_n(line, cmd, tmp_path):
    """bash keeps "\\n" in double quotes as a backslash and an n: a README
    prompt that means a newline must say so with $'...'."""
    if "gemma-cy" not in cmd:
        return
    for argv in gemma_cy_argvs(cmd, tmp_path):
        for text in prompts(argv):
            assert "\\n" not in text, f"README.md:{line}: {cmd}\nthe prompt bash passes: {text!r}"


@pytest.mark.parametrize("line,cmd", EXAMPLES, ids=[f"L{n}:{c[:40]}" for n, c in EXAMPLES])
def test_example_runs(line, cmd, workdir):
    k = kind(cmd)
    if k == "make":
        pytest.skip("`make run` / `make test` set up the venv and the model this test runs on, and run it")
    if k in ("gemma-cy-serve", "curl"):
        pytest.skip("a server and the calls to it run together: test_the_server_examples_run")
    if "/usr/share/common-licenses/" in cmd and not Path(re.search(r"/usr/share/common-licenses/\S+", cmd)[0]).exists():
        pytest.skip("the example's text file is not on this machine")
    if "smollm2" in cmd.lower():
        from gemma_cy.errors import GemmaCyError
        from gemma_cy.formats.packaged import smollm2_model_path
        try:
            smollm2_model_path()
        except GemmaCyError as e:
            pytest.skip(f"SmolLM2's package is not installed ({e})")
    if "--plot" in cmd:
        pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the optional extra gemma-cy[plot])")
    run = shortened(cmd)
    where = f"README.md:{line}: {cmd}\nran: {run}"
    if interactive(cmd):
        code, shown = run_on_terminal(run, workdir, shell_env(XDG_CACHE_HOME=str(workdir / "cache"), TERM="dumb"))
        assert code == 0, f"{where}\n{shown[-2000:]}"
        answer = shown.split("Why is the sky blue?", 1)[-1].split("prefill:", 1)[0]
        assert answer.strip(), f"{where}\nno answer: {shown[-2000:]}"
        return
    result = run_bash(run, workdir)
    assert result.returncode == 0, f"{where}\nstderr: {result.stderr[-3000:]}"
    if k in ("gemma-cy", "time", "gemma-cy-eval"):
        assert result.stdout.strip(), f"{where}\nno text on stdout; stderr: {result.stderr[-2000:]}"
    if k == "gemma-cy" and re.search(r"\s--json(\s|$)", run):  # (not --json_schema, --json_object)
        assert json.loads(result.stdout)["generated_ids"], where
    if k == "gemma-cy-convert":
        out = re.search(r"(?:-o|--output)\s+(\S+)", run)[1]
        assert (workdir / out).stat().st_size > 0, where
    if k == "gemma-cy-batch":
        out = re.search(r"(?:-o|--output)\s+(\S+)", run)[1]
        records = [json.loads(r) for r in (workdir / out).read_text(encoding="utf-8").splitlines()]
        assert records and all(r.get("text") is not None for r in records), f"{where}\n{records}"
    if k == "python" and "model_path()" in run:
        assert Path(result.stdout.strip()).is_file(), f"{where}\nprinted {result.stdout!r}"
    if k == "gemma-cy":  # a prompt that means a newline reaches the model as one
        for argv in gemma_cy_argvs(run, workdir):
            if any("\n" in p for p in prompts(argv)):
                ids = json.loads(run_bash(run + " --json", workdir).stdout)["prompt_ids"]
                assert newline_id() in ids, f"{where}\nprompt ids {ids}"


def test_the_q8_speed_claim_has_one_source():
    """`--help` and the README's flag table state the q8 mode's speed in the
    same words (gemma_cy.generation.engines.Q8_SPEED, measured), and no other
    q8-against-f32 figure for AVX2 stands anywhere else in the README."""
    from gemma_cy.commands.cli import build_parser
    from gemma_cy.generation.engines import Q8_SPEED

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `--activations`"))
    assert Q8_SPEED in row
    help_text = " ".join(build_parser().format_help().split())
    assert " ".join(Q8_SPEED.split()) in help_text
    assert readme.count("with AVX2") == Q8_SPEED.count("with AVX2"), "a second AVX2 claim in the README"
    assert "slower than f32" not in help_text


def server_section(text: str) -> str:
    return text.split("\n## Server\n", 1)[1].split("\n## ", 1)[0]


def test_the_server_examples_run(workdir):
    """The README's `gemma-cy serve` runs as written (a smaller context and
    pool), and while it runs, every curl call of the README and the Python
    client example of its Server section, each with an answer."""
    pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")
    pytest.importorskip("openai", reason="the README's client example needs the `openai` client")
    import socket
    import signal

    serve = [c for _, c in EXAMPLES if kind(c) == "gemma-cy-serve"]
    calls = [c for _, c in EXAMPLES if kind(c) == "curl"]
    assert len(serve) == 1 and calls
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8080)) == 0:
            pytest.skip("port 8080, which the README's examples use, is taken on this machine")
    proc = subprocess.Popen(["bash", "-c", "exec " + serve[0] + " --ctx 512 --max_sequences 2"], cwd=workdir,
                            env=shell_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        banner = ""
        while " at http://" not in banner:
            line = proc.stderr.readline()
            assert line, f"gemma-cy serve ended: {banner}"
            banner += line
        assert "http://127.0.0.1:8080/" in banner, banner
        for cmd in calls:
            result = run_bash(cmd, workdir, timeout=120)
            assert result.returncode == 0, f"{cmd}\n{result.stderr}"
            answer = json.loads(result.stdout)
            assert answer["choices"][0]["message"]["content"].strip(), answer
        blocks = re.findall(r"```python\n(.*?)```", server_section(README.read_text(encoding="utf-8")), re.S)
        assert blocks
        for code in blocks:
            result = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=shell_env(), capture_output=True,
                                    text=True, timeout=120)
            assert result.returncode == 0 and result.stdout.strip(), result.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
