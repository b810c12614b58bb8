"""Perplexity and the comparison rows (gemma_cy.generation.evaluation,
docs/generation.md#evaluation): llama-perplexity's chunking convention,
every figure against a computation written here, all-position logits, and
the one-line errors of `gemma-cy eval`."""
import json
import math

import numpy as np
import pytest

import gemma_cy
from gemma_cy.errors import ParameterError
from gemma_cy.generation.evaluation import chunk_ids, evaluate
from helpers import assert_one_line_error, cli

CTX = 64


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return gemma_cy.load(tiny_model_path, max_cache_len=256)


def text_ids(n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 1024, n)]


def f64_log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    return x - x.max() - math.log(np.exp(x - x.max()).sum())


def independent_nlls(engine, ids, ctx, bos):
    """llama-perplexity's convention written out: chunks of ctx with BOS
    first, each from an empty cache, decoded one token at a time; positions
    ctx/2 .. ctx-2 predict the next token."""
    out = []
    for c in range(len(ids) // ctx):
        chunk = list(ids[c * ctx:(c + 1) * ctx])
        chunk[0] = bos
        engine.reset()
        for j, token in enumerate(chunk[:-1]):
            logits = engine.decode(token)
            if j >= ctx // 2:
                out.append(-f64_log_softmax(logits)[chunk[j + 1]])
    return np.array(out)


def test_chunks_follow_llama_perplexity():
    ids = list(range(10, 10 + 2 * 8 + 5))
    chunks = chunk_ids(ids, 8, bos_id=2)
    assert chunks == [[2] + ids[1:8], [2] + ids[9:16]]  # the tail that fills no chunk is left out
    assert chunk_ids(ids, 8, bos_id=None)[1] == ids[8:16]


def test_perplexity_equals_the_convention_computed_here(model):
    from gemma_cy.fast.engine import FastEngine

    ids = text_ids(3 * CTX + 10)
    ev = model.evaluate(ids, ctx=CTX)
    nll = independent_nlls(FastEngine(model.weights, CTX), ids, CTX, model.tokenizer.bos_id)
    assert ev.chunks == 3 and ev.scored == len(nll) == 3 * (CTX // 2 - 1)
    assert ev.perplexity == pytest.approx(math.exp(nll.mean()), rel=1e-12)
    assert ev.perplexity_error == pytest.approx(math.exp(nll.mean()) * math.sqrt(nll.var() / (len(nll) - 1)),
                                                rel=1e-9)
    assert model.evaluate(ids, ctx=CTX, chunks=2).chunks == 2


def test_against_itself_costs_nothing(model):
    ev = model.evaluate(text_ids(2 * CTX), ctx=CTX, against="f32")
    assert ev.kl_mean == 0 and ev.kl_max == 0 and ev.same_top1 == 1 and ev.top5_overlap == 1
    assert ev.ln_ppl_ratio == 0 and ev.rms_delta_p == 0 and ev.baseline_perplexity == ev.perplexity


class TableEngine:
    """states(chunk) are the positions; logits_of looks rows up in a table."""

    def __init__(self, table):
        self.table = table  # (ctx, vocab)

    def reset(self):
        pass

    def states(self, chunk):
        return np.arange(len(chunk), dtype=np.float32)[:, None]

    def logits_of(self, states):
        return self.table[states[:, 0].astype(int)].astype(np.float32)


def test_comparison_rows_match_their_definitions():
    """KL(B||A), same top-1, top-5 overlap, delta p, ln(PPL ratio), each
    computed here from the two tables of logits."""
    rng = np.random.default_rng(1)
    ctx, vocab = 16, 12
    a, b = rng.standard_normal((ctx, vocab)) * 2, rng.standard_normal((ctx, vocab)) * 2
    ids = [int(i) for i in rng.integers(0, vocab, 2 * ctx)]
    ev = evaluate(TableEngine(a), ids, ctx, None, TableEngine(b), "b")
    pos = np.arange(ctx // 2, ctx - 1)
    kl, same, top5, dp, diff = [], [], [], [], []
    for c in range(2):
        chunk = ids[c * ctx:(c + 1) * ctx]
        for j in pos:
            la, lb = f64_log_softmax(a[j].astype(np.float32)), f64_log_softmax(b[j].astype(np.float32))
            t = chunk[j + 1]
            kl.append(np.sum(np.exp(lb) * (lb - la)))
            same.append(np.argmax(la) == np.argmax(lb))
            top5.append(len(set(np.argsort(-la)[:5]) & set(np.argsort(-lb)[:5])) / 5)
            dp.append(np.exp(la[t]) - np.exp(lb[t]))
            diff.append(lb[t] - la[t])
    kl, dp, diff = np.array(kl), np.array(dp), np.array(diff)
    assert ev.kl_mean == pytest.approx(kl.mean(), rel=1e-9) and ev.kl_max == pytest.approx(kl.max(), rel=1e-9)
    assert ev.kl_median == pytest.approx(np.median(kl), rel=1e-9)
    assert ev.kl_mean_error == pytest.approx(math.sqrt(kl.var() / (len(kl) - 1)), rel=1e-9)
    assert ev.same_top1 == pytest.approx(np.mean(same)) and ev.top5_overlap == pytest.approx(np.mean(top5))
    assert ev.mean_delta_p == pytest.approx(dp.mean(), rel=1e-9, abs=1e-15)
    assert ev.rms_delta_p == pytest.approx(math.sqrt(np.mean(dp ** 2)), rel=1e-9)
    assert ev.ln_ppl_ratio == pytest.approx(diff.mean(), rel=1e-9, abs=1e-15)


def test_ctrl_c_keeps_the_chunks_done(model, monkeypatch):
    calls = {"n": 0}
    states = model.engine.states

    def interrupting(ids):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return states(ids)
    monkeypatch.setattr(model.engine, "states", interrupting)
    ev = model.evaluate(text_ids(4 * CTX), ctx=CTX)
    assert ev.interrupted and ev.chunks == 2 and ev.scored == 2 * (CTX // 2 - 1)


def test_all_position_logits_equal_each_positions(model):
    ids = model.prompt_ids("Once upon a time there was a cat")
    every = model.logits(ids, position="all")
    assert every.shape == (len(ids), model.config.vocab_size)
    np.testing.assert_array_equal(model.logits(ids, positions="all"), every)
    for j in range(len(ids)):
        np.testing.assert_array_equal(every[j], model.logits(ids, position=j))


@pytest.mark.parametrize("kwargs, match", [
    (dict(ctx=CTX, n=CTX + 5), f"has {CTX + 5} tokens.*needs at least {2 * CTX}"),
    (dict(ctx=63, n=200), "even"),
    (dict(ctx=512, n=2000), "more than the model's context"),
    (dict(ctx=CTX, n=200, chunks=0), "chunks"),
    (dict(ctx=CTX, n=200, against="int4"), "against"),
])
def test_bad_evaluations_are_parameter_errors(model, kwargs, match):
    n = kwargs.pop("n")
    with pytest.raises(ParameterError, match=match):
        model.evaluate(text_ids(n), **kwargs)


def test_a_baseline_of_another_vocabulary_is_refused(model, tmp_path):
    from gemma_cy.formats.gmt import write_gmt
    from gemma_cy.tokenizers.fixture_vocab import fixture_vocab
    from gemma_cy.api import Model
    from gemma_cy.tokenizers.greedy import GreedyTokenizer
    from gemma_cy.commands.presets import random_weights
    from gemma_cy.model.weights import Weights

    config, tensors = random_weights("small")
    other = Model(Weights(config, tensors), GreedyTokenizer(fixture_vocab(config.vocab_size)), "fast", CTX)
    with pytest.raises(ParameterError, match="vocabulary"):
        model.evaluate(text_ids(200), ctx=CTX, against=other)


def test_cli_eval_text_and_json(tiny_model_path, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 97} and more" for i in range(400)), encoding="utf-8")
    out = cli("eval", "--weights", str(tiny_model_path), "--text", str(text), "--ctx", "64", "--chunks", "2",
              "--against_activations", "q8", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["chunks"] == 2 and got["baseline"] == "q8 activations" and got["kl_mean"] > 0
    table = cli("eval", "--weights", str(tiny_model_path), "--text", str(text), "--ctx", "64", "--chunks", "1")
    assert table.returncode == 0 and "perplexity" in table.stdout
    short = tmp_path / "short.txt"
    short.write_text("too short", encoding="utf-8")
    assert_one_line_error(cli("eval", "--weights", str(tiny_model_path), "--text", str(short), "--ctx", "64"),
                          "needs at least 128", code=1)
    assert_one_line_error(cli("eval", "--weights", str(tiny_model_path), "--text", str(tmp_path / "nope.txt")),
                          "nope.txt", code=1)
    assert_one_line_error(cli("eval", "--weights", str(tiny_model_path), "--text", str(text), "--chunks", "0"),
                          "--chunks", code=2)


def test_per_layer_names_the_changed_tensor_first(model):
    """A copy of the model with one matrix rounded coarsely (layer 1's
    down_proj to 4 levels): against the original, the per-op table puts that
    layer's MLP first and names the tensor."""
    from gemma_cy.api import Model
    from gemma_cy.model.weights import Weights
    from gemma_cy.quant.tensors import quantize_per_tensor

    w = model.weights.tensors["layers.1.down_proj"].dequantize()
    coarse = np.round(w / np.abs(w).max() * 2) * (np.abs(w).max() / 2)
    tensors = {**model.weights.tensors, "layers.1.down_proj": quantize_per_tensor(coarse.astype(np.float32))}
    changed = Model(Weights(model.config, tensors, source="coarse"), model.tokenizer, "fast", 256)
    ev = changed.evaluate(text_ids(2 * CTX), ctx=CTX, chunks=1, against=model, per_layer=True,
                          per_layer_positions=8)
    top = ev.per_layer[0]
    assert (top["layer"], top["op"]) == (1, "mlp") and "layers.1.down_proj (int8; baseline int8)" in top["tensors"]
    assert top["relative_rms"] > 10 * ev.per_layer[1]["relative_rms"]
    assert top["positions"] == 8


def test_per_layer_needs_a_baseline(model):
    with pytest.raises(ParameterError, match="baseline"):
        model.evaluate(text_ids(2 * CTX), ctx=CTX, per_layer=True)


def test_plot_draws_or_names_the_extra_to_install(tiny_model_path, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 53}" for i in range(600)), encoding="utf-8")
    png = tmp_path / "eval.png"
    out = cli("eval", "--weights", str(tiny_model_path), "--text", str(text), "--ctx", "64", "--chunks", "1",
              "--against_activations", "q8", "--per_layer", "--per_layer_positions", "4", "--plot", str(png))
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the optional extra is not installed: one line saying which
        assert_one_line_error(out, "pip install 'gemma-cy[plot]'", code=1)
        return
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------ every flag checked before any work


def a_text(tmp_path, words: int = 400):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 97} and more" for i in range(words)), encoding="utf-8")
    return str(text)


@pytest.mark.parametrize("extra, needle", [
    (["--plot", "{tmp}/out.png"], "--plot draws the comparison with a baseline"),  # no baseline
    (["--against_activations", "q8", "--plot", "{tmp}/no/such/dir/out.png"], "no directory"),
    (["--against_activations", "q8", "--plot", "{tmp}/out.notaformat"], "format matplotlib writes"),
    (["--ctx", "63"], "--ctx = 63"),
    (["--against_activations", "q8", "--per_layer", "--per_layer_positions", "0"], "--per_layer_positions"),
])
def test_bad_eval_flags_fail_before_the_model_loads(tiny_model_path, tmp_path, extra, needle):
    """A usage error (exit 2) naming the flag, before any work: with a
    weights path that does not exist, the flag is what is reported."""
    pytest.importorskip("matplotlib", reason="the --plot checks need the optional extra (make test installs it)")
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    out = cli("eval", "--weights", str(tmp_path / "not-loaded.gguf"), "--text", a_text(tmp_path), *extra)
    assert_one_line_error(out, needle, code=2)
    assert out.stdout == ""


def test_eval_refuses_text_that_is_not_utf8(tiny_model_path, tmp_path):
    binary = tmp_path / "random.bin"
    binary.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    out = cli("eval", "--weights", str(tiny_model_path), "--text", str(binary), "--ctx", "8")
    assert_one_line_error(out, "not UTF-8 text", "offset", code=1)


def test_plot_says_where_it_wrote_and_names_the_baseline(tiny_model_path, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra (make test installs it)")
    png = tmp_path / "eval.png"
    out = cli("eval", "--weights", str(tiny_model_path), "--text", a_text(tmp_path, 600), "--ctx", "64",
              "--chunks", "1", "--against_activations", "q8", "--per_layer", "--per_layer_positions", "4",
              "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert f"wrote {png}" in out.stderr and "perplexity" in out.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_that_fails_to_draw_leaves_the_figures_printed(tiny_model_path, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra (make test installs it)")
    from gemma_cy.commands import cli as cli_module, plot

    def fail(*args):
        raise ParameterError("--plot: drawing failed here")
    monkeypatch.setattr(plot, "plot_evaluation", fail)
    code = cli_module.main(["eval", "--weights", str(tiny_model_path), "--text", a_text(tmp_path), "--ctx", "64",
                            "--chunks", "1", "--against_activations", "q8", "--plot", str(tmp_path / "x.png")])
    out = capsys.readouterr()
    assert code == 1 and "drawing failed here" in out.err
    assert "KL divergence, mean" in out.out


def test_per_layer_plot_has_whole_layer_ticks_one_colour_per_op_and_names_the_baseline(model):
    pytest.importorskip("matplotlib", reason="--plot needs the optional extra (make test installs it)")
    import matplotlib.pyplot as plt
    from gemma_cy.commands.plot import draw_evaluation

    ev = model.evaluate(text_ids(2 * CTX), ctx=CTX, chunks=1, against="q8", per_layer=True,
                        per_layer_positions=4)
    fig = draw_evaluation(ev, "tiny on text")
    try:
        kl_ax, layer_ax = fig.axes
        assert "q8 activations" in kl_ax.get_title() and "q8 activations" in layer_ax.get_title()
        fig.canvas.draw()
        ticks = layer_ax.get_xticks()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
        lines = layer_ax.get_lines()
        assert len(lines) == len({r["op"] for r in ev.per_layer}) > 10  # more ops than the default colour cycle
        colours = [tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
                   for line in lines]
        assert len(set(colours)) == len(colours), colours
    finally:
        plt.close(fig)


def test_the_table_counts_in_words_and_never_prints_nan(tiny_model_path, tmp_path):
    out = cli("eval", "--weights", str(tiny_model_path), "--text", a_text(tmp_path), "--ctx", "4", "--chunks", "1",
              "--against_activations", "q8")
    assert out.returncode == 0, out.stderr
    assert "1 chunk of 4; 1 position scored" in out.stdout
    assert "nan" not in out.stdout.lower() and "no error estimate" in out.stdout
    two = cli("eval", "--weights", str(tiny_model_path), "--text", a_text(tmp_path), "--ctx", "8", "--chunks", "2")
    assert "2 chunks of 8; 6 positions scored" in two.stdout and "+/-" in two.stdout
