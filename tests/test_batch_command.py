"""`gemma-cy batch` (docs/generation.md#the-batch-command): a JSONL file of
mixed requests gives, for every good line, exactly what a separate
``complete`` gives it, in input order; a bad line gets an error record in
its place; Ctrl-C leaves what finished written."""
import io
import json

import pytest

import gemma_cy
from gemma_cy.commands.batch import run_batch
from helpers import assert_one_line_error, cli


def requests() -> list:
    """64 mixed requests: text and chat, greedy and seeded sampling, stops,
    penalties, speculative decoding, ids; line 17 is not JSON, 40 has an unknown key, 50 a bad id."""
    out = []
    for i in range(64):
        r = {"max_tokens": 3 + i % 5}
        if i % 3 == 0:
            r["messages"] = [{"role": "user", "content": f"question {i}"}]
        elif i % 7 == 0:
            r["prompt_ids"] = [2, 10 + i, 20 + i]
        else:
            r["prompt"] = f"Once upon a time {i}"
        if i % 2:
            r.update(temperature=0.9, seed=i)
        else:
            r["temperature"] = 0
        if i % 5 == 0:
            r["stop"] = ["e"]
        if i % 11 == 0:
            r["repeat_penalty"] = 1.3
        if i % 6 == 1:
            r.update(speculative="lookup", draft_max=1 + i % 4)
        if i % 4 == 0:
            r["id"] = f"req-{i}"
        out.append(json.dumps(r))
    out[17] = '{"prompt": "broken'
    out[40] = json.dumps({"prompt": "x", "temprature": 1})
    out[50] = json.dumps({"prompt_ids": [2, 99999]})
    return out


def expected(model, line: str) -> dict:
    r = json.loads(line)
    kw = {k: v for k, v in r.items() if k not in ("prompt", "prompt_ids", "messages", "id")}
    if "messages" in r:  # (chat_complete reuses the cached prefix of the last chat: count the whole prompt)
        c, n_prompt = model.chat_complete(r["messages"], **kw), len(model.chat_ids(r["messages"]))
    else:
        c = model.complete(r["prompt"] if "prompt" in r else r["prompt_ids"], **kw)
        n_prompt = len(c.prompt_ids)
    return {"text": c.text, "ids": c.ids, "stop_reason": c.stop_reason, "prompt_tokens": n_prompt}


def test_batch_file_equals_separate_completions(tiny_model_path, tmp_path):
    lines = requests()
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = cli("batch", str(src), "-o", str(dst), "--weights", str(tiny_model_path), "--max_sequences", "8",
              "--ctx", "256", timeout=300)
    assert out.returncode == 1, out.stderr
    assert "3 of 64 requests could not run" in out.stderr and "Traceback" not in out.stderr
    assert "MiB" in out.stderr  # the memory the sequences' caches take, said at start
    records = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in records] == list(range(64))
    model = gemma_cy.load(tiny_model_path, max_cache_len=256)
    for i, (line, record) in enumerate(zip(lines, records)):
        if i in (17, 40, 50):
            assert set(record) == {"index", "error"} and "\n" not in record["error"]
            continue
        want = expected(model, line)
        assert {k: record[k] for k in want} == want, f"line {i}"
        if i % 4 == 0:
            assert record["id"] == f"req-{i}"
    assert "not JSON" in records[17]["error"] and "temprature" in records[40]["error"]
    assert "99999" in records[50]["error"]


def test_all_good_lines_exit_0_and_stdout_works(tiny_model_path, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a", "max_tokens": 2, "temperature": 0}\n\n{"prompt": "b", "max_tokens": 2}\n',
                   encoding="utf-8")
    out = cli("batch", str(src), "-o", "-", "--weights", str(tiny_model_path), "--ctx", "64")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["index"] for line in out.stdout.splitlines()] == [0, 1]


@pytest.mark.parametrize("args, needle", [
    (["--max_sequences", "0"], "max_sequences"),
    (["--ctx", "0"], "--max_cache_len"),
])
def test_bad_flags_are_one_line(tiny_model_path, tmp_path, args, needle):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a"}\n', encoding="utf-8")
    assert_one_line_error(cli("batch", str(src), "-o", str(tmp_path / "o.jsonl"), "--weights", str(tiny_model_path),
                              *args), needle)


def test_missing_and_binary_inputs_are_one_line(tiny_model_path, tmp_path):
    assert_one_line_error(cli("batch", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o"), "--weights",
                              str(tiny_model_path)), "nope.jsonl", code=1)
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_one_line_error(cli("batch", str(binary), "-o", str(tmp_path / "o"), "--weights", str(tiny_model_path)),
                          "not UTF-8", code=1)


def test_ctrl_c_leaves_every_finished_result_written(tiny_model_path, capsys):
    model = gemma_cy.load(tiny_model_path, max_cache_len=128, max_sequences=2)
    lines = [json.dumps({"prompt": f"p{i}", "max_tokens": 2 + 3 * (i % 2), "temperature": 0}) for i in range(6)]
    out = io.StringIO()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_batch(model, lines, out, progress)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 3 and all("text" in r for r in records)
    assert "3 of 6 results written, 3 missing" in capsys.readouterr().err
