"""The README's Python section runs as written on the default model (the
model `make run` installs), and does what its comments say."""
import re
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow


def readme_python_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = []
    for title in ("## Python API", "## Structured output"):  # the Server section's client example needs a server
        section = text[text.index(title):]
        section = section[:section.index("\n## ", 1)]
        blocks += re.findall(r"```python\n(.*?)```", section, re.S)  # every block, in order
    return "\n".join(blocks)


def test_readme_python_example_runs(tmp_path):
    from gemma_cy.errors import GemmaCyError
    from gemma_cy.formats.packaged import default_model_path

    try:
        default_model_path(progress=False)
    except GemmaCyError as e:
        pytest.skip(f"the default model package is not installed ({e})")
    code = readme_python_block()
    assert "gemma_cy.load()" in code
    # the example's own prints, plus checks of what its comments promise
    code += ("\nimport json\n"
             "ban = model.complete('The capital of France is', max_tokens=8, temperature=0,\n"
             "                     logits_processor=lambda ids, x: np.where(np.arange(len(x)) == banned, -np.inf, x))\n"
             "first = model.complete('The capital of France is', max_tokens=8, temperature=0)\n"
             "alone = model.complete('Water boils at', max_tokens=8, temperature=0.7, seed=3)\n"
             "print('CHECK', json.dumps({'banned_first': first.ids[0] == banned, 'banned_in': banned in ban.ids,\n"
             "      'batch_is_alone': outs[1].ids == alone.ids and len(outs) == 2,\n"
             "      'digits': model.complete('The year the Berlin Wall fell:', max_tokens=4, temperature=0,\n"
             "                               logits_processor=only_digits).text}))\n")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    check = __import__("json").loads(result.stdout.split("CHECK ", 1)[1])
    assert check["banned_first"] and not check["banned_in"]
    assert check["digits"].strip().isdigit()
    assert check["batch_is_alone"]
