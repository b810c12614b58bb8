"""A `gemma-cy serve` process for tests: started on a free loopback port,
its URL read from the line it prints, stopped with SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class ServerProcess:
    def __init__(self, *args: str, timeout: float = 120):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "gemma_cy", "serve", "--port", "0", *args],
                                     cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        self.banner = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"gemma-cy serve exited ({self.proc.wait()}): {self.banner}")
            self.banner += line
            if " at http://" in line:
                self.url = line.split(" at ", 1)[1].split("/ ", 1)[0].rstrip("/")
                return
        self.proc.kill()
        raise RuntimeError("gemma-cy serve did not start")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, self.banner + self.proc.stderr.read()
