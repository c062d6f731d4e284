"""A stand-in for vLLM's OpenAI server on a real socket (vLLM cannot run here), as far as the gateway uses it.

GET /v1/models (owned_by "vllm"), /health, /metrics (with `vllm:cache_config_info{block_size=...}` unless
`block_size` is None), no /kv/info; POST /v1/completions streamed with continuous usage, and a prefix cache
of whole blocks per salt: like vLLM it reads at most the full blocks before the last prompt token, caches
every full block, and reports its reads only in the final usage chunk (`prompt_tokens_details`, omitted
when nothing hit). The chunk shapes are test_http_wire.py's recorded ones.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORDS = [" Paris", " is", " big", " and", " old"]


class FakeVllm:
    def __init__(self, model_id: str, *, block_size: int | None = 16, cache_block: int = 16) -> None:
        self.model_id = model_id
        self.block_size = block_size  # what /metrics publishes (None: no cache_config_info line)
        self.cache_block = cache_block  # the block its cache really works in
        self.cached: set[tuple[Any, ...]] = set()
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    def metrics(self) -> str:
        lines = ['vllm:num_requests_running{engine="0",model_name="m"} 0.0']
        if self.block_size is not None:
            lines += [
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",engine="0",'
                'enable_prefix_caching="True",gpu_memory_utilization="0.9",prefix_caching_hash_algo="sha256"} 1.0',
            ]
        return "\n".join(lines) + "\n"

    def complete(self, body: dict[str, Any]) -> Iterator[str]:
        self.requests.append(body)
        prompt, salt, block = list(body["prompt"]), body.get("cache_salt"), self.cache_block
        cached = 0
        while cached + block <= len(prompt) - 1 and (salt, *prompt[: cached + block]) in self.cached:
            cached += block
        for end in range(block, len(prompt) + 1, block):
            self.cached.add((salt, *prompt[:end]))
        words = WORDS[: body["max_tokens"]]
        base = {"id": "cmpl-1", "object": "text_completion", "created": 1733000000, "model": self.model_id}
        for i, word in enumerate(words, start=1):
            finish = "length" if i == len(words) else None
            choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + i, "completion_tokens": i}
            yield json.dumps({**base, "choices": [choice], "usage": usage})
        final: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": len(words)}
        final["total_tokens"] = len(prompt) + len(words)
        if cached:
            final["prompt_tokens_details"] = {"cached_tokens": cached}
        yield json.dumps({**base, "choices": [], "usage": final})
        yield "[DONE]"


def _handler(fake: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                card = {"id": fake.model_id, "object": "model", "owned_by": "vllm", "max_model_len": 2048}
                self._send(200, json.dumps({"object": "list", "data": [card]}))
            elif self.path == "/health":
                self._send(200, "")
            elif self.path == "/metrics":
                self._send(200, fake.metrics(), "text/plain; version=0.0.4")
            else:
                self._send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            # HTTP/1.0: the stream ends when the connection closes, as an SSE stream may.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for data in fake.complete(body):
                self.wfile.write(f"data: {data}\n\n".encode())

    return Handler


@contextmanager
def fake_vllm(model_id: str, **options: Any) -> Iterator[FakeVllm]:
    fake = FakeVllm(model_id, **options)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-vllm", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
