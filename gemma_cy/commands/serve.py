"""`gemma-cy serve`: an OpenAI-compatible HTTP server on the batching engine
(docs/server.md).

Loads one model with ``--max_sequences`` slots, starts the engine thread
(gemma_cy.server.engine_loop) and serves the API (gemma_cy.server.app)
with uvicorn on ``--host``:``--port`` (loopback unless told otherwise).
SIGINT or SIGTERM drains: new requests get 503; ``--on_stop finish`` (the
default) lets running requests finish, ``cancel`` ends them at the next
step; then it exits 0.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading

from ..errors import ParameterError
from ..generation.engines import ACTIVATION_MODES, DEFAULT_ENGINE, ENGINES, check_max_sequences
from .batch import kv_cache_mib
from .flags import OneLineParser, UsageError, add_model_flags, int_flag

SERVER_EXTRA = "pip install 'gemma-cy[server]'"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="gemma-cy serve",
                      description="Serve a model over OpenAI's HTTP API (chat and text completions, models, "
                                  "health, metrics, tokenize), concurrent requests decoded together; a chat "
                                  "page at /.")
    add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int_flag, default=8080, help="port (default 8080; 0: any free one)")
    p.add_argument("--max_sequences", type=int_flag, default=8,
                   help="sequences decoded together, each with its own KV cache (default 8)")
    p.add_argument("--max_queue", type=int_flag, default=64,
                   help="sequences that may wait for a slot; more are answered 429 (default 64)")
    p.add_argument("--max_cache_len", "--ctx", dest="max_cache_len", type=int_flag, default=4096,
                   help="context of each sequence (default 4096)")
    p.add_argument("--api_key", help="require 'Authorization: Bearer KEY' on the API (default: none)")
    p.add_argument("--model_name", help="the model's id in the API (default: the weights file's name)")
    p.add_argument("--max_body", type=int_flag, default=1 << 20, help="largest request body in bytes (default 1 MiB)")
    p.add_argument("--on_stop", choices=("finish", "cancel"), default="finish",
                   help="on SIGINT/SIGTERM: let running requests finish (default) or cancel them")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="compute engine")
    p.add_argument("--activations", choices=ACTIVATION_MODES, default="f32", help="activation mode")
    p.add_argument("--draft", choices=("lookup",), default=None,
                   help="speculative decoding by prompt lookup for every request that does not say otherwise "
                        "(\"speculative\": \"none\"); the replies are those of plain decoding, id for id")
    return p


def check_args(args) -> None:
    """Every flag checked before the model loads (UsageError: exit 2)."""
    try:
        check_max_sequences(args.max_sequences)
    except ParameterError as e:
        raise UsageError(f"--{e}") from None
    if args.max_cache_len <= 0:
        raise UsageError(f"--max_cache_len = {args.max_cache_len}, must be > 0")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port = {args.port}, must be in [0, 65535]")
    if args.max_queue < 0:
        raise UsageError(f"--max_queue = {args.max_queue}, must be >= 0")
    if args.max_body < 1024:
        raise UsageError(f"--max_body = {args.max_body}, must be >= 1024")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api_key: empty")


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (ParameterError, one line, when it cannot be)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        raise ParameterError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    return sock


def run(args) -> int:
    check_args(args)
    try:
        import uvicorn

        from ..server.app import create_app
        from ..server.engine_loop import EngineLoop
    except ImportError as e:
        raise ParameterError(f"gemma-cy serve needs its extra ({e.name} is missing): {SERVER_EXTRA}") from None
    from .. import api

    if not args.weights:
        from ..formats.packaged import default_model_path
        args.weights = default_model_path()
    model = api.load(args.weights, args.tok_path, engine=args.engine, max_cache_len=args.max_cache_len,
                     activations=args.activations, max_sequences=args.max_sequences)
    name = args.model_name or os.path.basename(args.weights)
    engine = EngineLoop(model, args.max_queue)
    app = create_app(model, engine, name, args.api_key, args.max_body, args.draft)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's, without raising the signal again after the graceful
            stop: a server told to stop has done what it was told (exit 0)."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame):
            """The first signal drains: the engine takes nothing new (503s,
            /health "stopping") while what runs finishes or is cancelled as
            --on_stop says, and the server stops once it is idle (on_tick).
            A second signal cancels everything and stops now."""
            if engine.stopping:
                engine.cancel_all()
                super().handle_exit(sig, frame)
                return
            engine.stop_accepting()
            if args.on_stop == "cancel":
                engine.cancel_all()

        async def on_tick(self, counter: int) -> bool:
            if engine.stopping and engine.idle:
                self.should_exit = True
            return await super().on_tick(counter)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port
                host = f"[{args.host}]" if ":" in args.host else args.host
                sys.stderr.write(f"gemma-cy serve: {name} at http://{host}:{port}/ (API: /v1, chat page: /); "
                                 f"{args.max_sequences} sequences at once, each with a context of "
                                 f"{model.context_len} tokens: KV caches of at most "
                                 f"{kv_cache_mib(model) * args.max_sequences:.0f} MiB\n")
                sys.stderr.flush()

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=None if args.on_stop == "finish" else 5)
    server = Server(config)
    try:
        server.run(sockets=[listening_socket(args.host, args.port)])
    finally:
        engine.close()
    return 0 if server.started else 1
