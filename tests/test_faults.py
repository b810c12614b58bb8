"""Faults around the files (docs/errors.md#faults): a weights file truncated
while in use, a FIFO or a device given as a model, a full disk, an
unwritable cache, Ctrl-C during conversion. Each ends in one line and a
non-zero exit, with no partial file left behind."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO, assert_one_line_error, cli


def python(code: str, *args: str, env_extra=None, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def smollm2_or_skip() -> str:
    from gemma_cy.errors import GemmaCyError
    from gemma_cy.formats.packaged import smollm2_source_path
    try:
        return smollm2_source_path()
    except GemmaCyError as e:
        pytest.skip(f"the SmolLM2 package is not installed ({e})")


def test_weights_truncated_while_in_use_is_one_line_not_a_bus_error(tiny_model_path, tmp_path):
    """The file is cut to 100 bytes after loading, before the prompt runs:
    reading the mapped weights then raises SIGBUS, which the CLI turns into
    one line and exit 1 (gemma_cy.fast.faults)."""
    weights = tmp_path / "tiny.gmw"
    shutil.copy(tiny_model_path, weights)
    shutil.copy(str(tiny_model_path) + ".tok", str(weights) + ".tok")
    result = python("""
        import os, sys
        import gemma_cy.fast.engine as fast
        from gemma_cy.commands import cli
        prefill = fast.FastEngine.prefill
        def truncate_then_prefill(self, ids, observer=None):
            os.truncate(sys.argv[1], 100)
            return prefill(self, ids, observer)
        fast.FastEngine.prefill = truncate_then_prefill
        sys.exit(cli.main(["--weights", sys.argv[1], "--prompt", "hello", "--n_dec", "4", "--temp", "0"]))
    """, str(weights))
    assert result.returncode == 1, (result.returncode, result.stderr[-500:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "changed while it was in use" in lines[0], result.stderr


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/null"])
def test_a_pipe_or_device_is_refused_without_reading(tiny_model_path, tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "model.fifo"
        os.mkfifo(path)
    else:
        path = kind
    for flags in (("--weights", str(path)), ("--weights", str(tiny_model_path), "--tok_path", str(path))):
        result = cli(*flags, "--prompt", "x", "--n_dec", "1", timeout=20)  # a hang fails by timeout
        assert_one_line_error(result, str(path), "not a regular file", code=1)
    convert = cli("convert", str(path), "-o", str(tmp_path / "out.gguf"), timeout=20)
    assert_one_line_error(convert, str(path), code=1)


def test_full_disk_during_convert_leaves_no_partial_file(tmp_path):
    """A file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes writes
    fail as a full disk does."""
    source = smollm2_or_skip()
    out = tmp_path / "out.gguf"
    result = python("""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        from gemma_cy.commands import cli
        sys.exit(cli.main(["convert", sys.argv[1], "-o", sys.argv[2]]))
    """, source, str(out))
    assert_one_line_error(result, str(out), "cannot write", code=1)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_convert_leaves_no_partial_file(tmp_path):
    source = smollm2_or_skip()
    out = tmp_path / "out.gguf"
    result = python("""
        import sys
        from gemma_cy.commands import cli, convert
        def progress(done, total, name):
            if done == 20:
                raise KeyboardInterrupt
        convert.stderr_progress = lambda label: progress
        sys.exit(cli.main(["convert", sys.argv[1], "-o", sys.argv[2]]))
    """, source, str(out))
    assert result.returncode == 130, result.stderr[-500:]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_load_exits_130_in_one_line(tiny_model_path):
    result = python("""
        import sys
        from gemma_cy import loading
        from gemma_cy.commands import cli
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        loading.open_tokenizer = interrupted
        sys.exit(cli.main(["--weights", sys.argv[1], "--prompt", "x"]))
    """, str(tiny_model_path))
    assert result.returncode == 130
    assert_one_line_error(result, "interrupted")


def test_an_unwritable_cache_is_one_line(tmp_path):
    """The default model is assembled once into ~/.cache; a home whose
    .cache cannot be made (a file where the directory should be)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("not a directory")
    result = cli("--prompt", "x", "--n_dec", "1", env_extra={"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")})
    assert_one_line_error(result, "default model", code=1)
