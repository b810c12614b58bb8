"""The CLI habits llama.cpp and transformers users bring (docs/generation.md#cli):
short flags, --version, subcommands in --help, --stop, --system, penalties,
piped stdin, --json on Ctrl-C, --model_size of the real model, and the
interactive chat's line editing through a pseudo-terminal."""
import json
import os
import select
import subprocess
import sys
import time

import pytest

import gemma_cy
from helpers import REPO, assert_one_line_error, cli


def run_json(model, *args, input=None):
    result = cli("--weights", str(model), "--json", *args, input=input)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return gemma_cy.load(tiny_model_path)


def test_short_flags_are_the_long_ones(tiny_model_path):
    long = run_json(tiny_model_path, "--prompt", "The cat", "--n_dec", "6", "--temp", "0", "--terminate_on_eos", "0")
    short = cli("-m", str(tiny_model_path), "-p", "The cat", "-n", "6", "--temp", "0", "--terminate_on_eos", "0",
                "--json")
    assert short.returncode == 0, short.stderr
    assert json.loads(short.stdout)["generated_ids"] == long["generated_ids"]
    assert len(long["generated_ids"]) == 6


def test_version_and_help():
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"gemma-cy {gemma_cy.__version__}"
    help_text = cli("--help")
    assert help_text.returncode == 0
    for needle in ("gemma-cy diff", "gemma-cy convert", "llama2.c", "--stop", "--system", "-m", "-p", "-n"):
        assert needle in help_text.stdout, needle


def test_stop_string_ends_the_text_before_it(tiny_model_path):
    flags = ("--prompt", "Once upon", "--n_dec", "40", "--temp", "0", "--terminate_on_eos", "0")
    full = run_json(tiny_model_path, *flags)["text"]
    stop = full[6:9]
    assert len(stop) == 3
    out = run_json(tiny_model_path, *flags, "--stop", stop)
    assert out["text"] == full[:full.index(stop)]
    assert out["stop_reason"] == "stop" and out["stop_string"] == stop
    streamed = cli("--weights", str(tiny_model_path), *flags, "--stop", "zzz-never", "--stop", stop)
    assert streamed.stdout in (out["text"], out["text"] + "\n")


def test_system_message_goes_into_the_chat_template(tiny_model_path, model):
    out = run_json(tiny_model_path, "--chat_format", "1", "--system", "Be brief.", "--prompt", "Hi", "--n_dec", "0")
    assert out["prompt_ids"] == model.chat_ids([{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "Hi"}])


def test_penalty_flags_reach_the_sampler(tiny_model_path, model):
    flags = dict(repeat_penalty=1.5, presence_penalty=1e4, frequency_penalty=0.25, repeat_last_n=64)
    prompt = "the cat sat on the mat"  # its greedy continuation repeats a token: the penalties bind
    out = run_json(tiny_model_path, "--prompt", prompt, "--n_dec", "24", "--temp", "0", "--terminate_on_eos", "0",
                   *[x for k, v in flags.items() for x in (f"--{k}", str(v))])
    want = model.complete(prompt, max_tokens=24, temperature=0, terminate_on_eos=False, **flags).ids
    plain = model.complete(prompt, max_tokens=24, temperature=0, terminate_on_eos=False).ids
    assert out["generated_ids"] == want and want != plain


def test_piped_stdin_is_the_prompt(tiny_model_path, model):
    out = run_json(tiny_model_path, "--n_dec", "3", "--temp", "0", input="The cat sat\n")
    assert out["prompt_ids"] == model.prompt_ids("The cat sat\n")
    chat = run_json(tiny_model_path, "--n_dec", "0", "--chat_format", "1", input="Why is the sky blue?\n")
    assert chat["prompt_ids"] == model.chat_ids("Why is the sky blue?")  # Gemma's template trims the content


def test_json_on_ctrl_c_prints_the_object_so_far(tiny_model_path, monkeypatch, capsys):
    from gemma_cy.commands import cli as cli_module
    from gemma_cy.fast.engine import FastEngine

    calls = {"n": 0}
    real_decode = FastEngine.decode

    def decode_then_interrupt(self, token, observer=None):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real_decode(self, token, observer)

    monkeypatch.setattr(FastEngine, "decode", decode_then_interrupt)
    code = cli_module.main(["--weights", str(tiny_model_path), "--prompt", "hi", "--n_dec", "50", "--temp", "0",
                            "--terminate_on_eos", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 130 and out["stop_reason"] == "interrupted" and len(out["generated_ids"]) == 4


def test_model_size_270m_is_the_default_model():
    from gemma_cy.commands.presets import check_preset
    from gemma_cy.errors import GemmaCyError, ModelFormatError
    from gemma_cy.formats.gguf_model import read_gguf
    from gemma_cy.formats.packaged import default_model_path

    try:
        path = default_model_path(progress=False)
    except GemmaCyError as e:
        pytest.skip(f"the default model package is not installed ({e})")
    check_preset(read_gguf(path).config, "270m")  # no error
    with pytest.raises(ModelFormatError, match="head_dim"):
        check_preset(read_gguf(path).config, "270m-gmw1")


def test_model_size_270m_refuses_the_tiny_fixture(tiny_model_path):
    assert_one_line_error(cli("--weights", str(tiny_model_path), "--model_size", "270m", "--dump"),
                          "n_layers", "270m", code=1)


# ------------------------------------------------------- the interactive chat


class Terminal:
    """The CLI on a pseudo-terminal: what a user at a keyboard sees."""

    def __init__(self, *args, cache_home):
        import pty

        self.master, slave = pty.openpty()
        env = dict(os.environ, TERM="xterm", XDG_CACHE_HOME=str(cache_home))  # the history file goes there
        self.proc = subprocess.Popen([sys.executable, "-m", "gemma_cy.commands.cli", *args], cwd=REPO,
                                     stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.seen = b""

    def read_until(self, needle: bytes, timeout: float = 60) -> bytes:
        end = time.time() + timeout
        while needle not in self.seen:
            left = end - time.time()
            if left <= 0:
                raise AssertionError(f"no {needle!r} within {timeout} s; got {self.seen[-400:]!r}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"terminal closed; got {self.seen[-400:]!r}")
                self.seen += chunk
        i = self.seen.index(needle) + len(needle)
        out, self.seen = self.seen[:i], self.seen[i:]
        return out

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.master)


def test_repl_line_editing_empty_lines_and_turns(tiny_model_path, model, tmp_path):
    """Typed "helo", Left, "l", Enter: with readline the turn is "hello".
    Two empty lines start no turn. Each turn's reply is what Model.chat
    gives for the conversation so far."""
    pytest.importorskip("readline", reason="line editing needs Python's readline module")
    term = Terminal("--weights", str(tiny_model_path), "--n_dec", "6", "--temp", "0", "--terminate_on_eos", "0",
                    cache_home=tmp_path)
    term.read_until(b"> ")
    term.type(b"helo\x1b[Dl\r")
    first = term.read_until(b"> ")
    term.type(b"\r")
    term.type(b"   \r")
    term.type(b"again\r")
    rest = term.read_until(b"stop: max_tokens")
    term.read_until(b"> ")
    term.type(b"\x04")  # Ctrl-D at the prompt exits
    assert term.close() == 0
    messages = [{"role": "user", "content": "hello"}]
    reply1 = model.chat_complete(messages, max_tokens=6, temperature=0, terminate_on_eos=False).text
    messages += [{"role": "assistant", "content": reply1}, {"role": "user", "content": "again"}]
    reply2 = model.chat_complete(messages, max_tokens=6, temperature=0, terminate_on_eos=False).text
    assert reply1.replace("\n", "\r\n").encode() in first
    assert reply2.replace("\n", "\r\n").encode() in rest
    assert first.count(b"prefill:") == 1 and rest.count(b"prefill:") == 1  # the empty lines made no turn
    assert b"hello" in (tmp_path / "gemma-cy" / "chat_history").read_bytes()  # history kept for the next run


def test_chat_turns_draw_on_from_one_stream(tiny_model_path, model):
    """Each turn of the interactive chat continues the session's random
    stream instead of restarting it at the seed: the same question twice gets
    two draws, each what Model.chat gives with the stream so far; the same
    --seed replays the whole session."""
    import io

    from gemma_cy.commands.cli import build_parser, chat_loop
    from gemma_cy.generation.sampling import SplitMix64

    args = build_parser().parse_args(["--n_dec", "8", "--temp", "1.5", "--minp", "0", "--terminate_on_eos", "0",
                                      "--seed", "11"])

    def session() -> str:
        lines = iter(["hello", "hello"])

        def read_line(prompt):
            try:
                return next(lines)
            except StopIteration:
                raise EOFError from None
        out = io.StringIO()
        assert chat_loop(model, args, read_line=read_line, out=out) == 0
        return out.getvalue()

    transcript = session()
    rng = SplitMix64(11)
    kw = dict(max_tokens=8, temperature=1.5, min_p=0, terminate_on_eos=False)
    messages = [{"role": "user", "content": "hello"}]
    want1 = model.chat_complete(messages, rng=rng, **kw).text
    messages += [{"role": "assistant", "content": want1}, {"role": "user", "content": "hello"}]
    want2 = model.chat_complete(messages, rng=rng, **kw).text
    restarted = model.chat_complete(messages, seed=11, **kw).text  # what a turn drew when it restarted the stream
    assert transcript == f"{want1}\n{want2}\n\n"  # each reply ends its line; EOF ends the last
    assert want2 != restarted
    assert session() == transcript  # --seed replays the session


def test_rng_must_be_a_stream(model):
    from gemma_cy.errors import ParameterError
    with pytest.raises(ParameterError, match="rng must be"):
        model.generate("a", rng=7)
