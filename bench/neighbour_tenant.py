"""Noisy neighbour benchmark: one tenant's huge requests against another tenant's small ones.

    .venv/bin/python bench/neighbour_tenant.py [--model PATH] [--seconds S] [--write-docs]
                                               [--server-repo DIR]

A real `kvgate serve` process (the tiny test model by default, SQLite in a
temporary directory) serves two tenants. The neighbour sends small requests one
after another (/v1/messages, a short prompt, one output token) and the latency of
each is recorded:

1. idle: nobody else is sending;
2. 30 MB bodies: the attacker sends 30 MB /v1/messages bodies in a loop, from two
   connections at once;
3. near-limit bodies: the attacker sends prompts just under the cheap checks (as
   many characters as could conceivably fit), which must be tokenized to be
   refused, to /v1/messages and /v1/messages/count_tokens in a loop, from two
   connections;
4. many blocks: a body just under the byte bound made of one-character text
   blocks, the most JSON parsing and validation per byte, in a loop;
5. a flood (issue 25): long uncached prompts (a fresh nonce at the start of each),
   from 16 connections at once, each generating 32 tokens;
6. hostile schemas (issue 25): a response_format with 10,000 optional properties,
   fresh names each time (past the grammar cache), from two connections.

--phases picks rows by number (1 is always run: the baseline).

The target: the neighbour's p99 under attack stays under 2x its idle p99. The
attacker's requests are counted by status. --server-repo runs the server from
another checkout (the code before this benchmark existed, say) for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine_description, write_section

REPO = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "bench-admin-token-0123"
NONCE = b"__NONCE__"
COMMON_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "they",
    "have",
    "which",
    "one",
    "you",
    "were",
    "all",
]
TITLE = "Noisy neighbour: one tenant's huge requests vs another's small ones (bench/neighbour_tenant.py)"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


class Server:
    """`kvgate serve` in a subprocess, with an admin token and two tenants' keys."""

    def __init__(
        self, *, model: str, workdir: Path, code: Path, engine_threads: int, extra_env: dict[str, str] | None = None
    ) -> None:
        from tests.gateway.harness import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": str(code),
            "KVGATE_MODEL": model,
            "KVGATE_DTYPE": "float32",
            "KVGATE_KV_CACHE_GIB": "0.1",
            "KVGATE_DATABASE_URL": f"sqlite:///{workdir / 'kvgate.db'}",
            "KVGATE_SPOOL_PATH": str(workdir / "spool.jsonl"),
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "KVGATE_PORT": str(self.port),
            "KVGATE_LOG_LEVEL": "WARNING",
            "KVGATE_NUM_THREADS": str(engine_threads),
            **(extra_env or {}),
        }
        command = [sys.executable, "-c", "from kvgate.cli import main; main()", "serve"]
        self.process = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 300
        while True:
            try:
                health = httpx.get(f"{self.base}/healthz", timeout=1).json()
                self.model = health["model"]
                break
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(self.process.stderr.read().decode() if self.process.stderr else "") from None
                time.sleep(0.2)
        self.neighbour, self.attacker = self._key("neighbour"), self._key("attacker")
        return self

    def _key(self, name: str) -> str:
        admin = httpx.Client(base_url=self.base, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        tenant = admin.post("/admin/v1/tenants", json={"name": name}).json()
        return admin.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={}).json()["key"]

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def small_body(model: str, text: str = "Hello!") -> dict[str, Any]:
    return {"model": model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": text}]}


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def neighbour_latencies(server: Server, *, seconds: float, at_least: int) -> tuple[list[float], list[float]]:
    """Small requests one after another for `seconds` (at least `at_least`), each after a /healthz probe.

    /healthz is the event loop alone; the small request adds authentication, rendering,
    the engine and the usage record.
    """
    messages: list[float] = []
    probes: list[float] = []
    headers = {"x-api-key": server.neighbour, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=server.base, headers=headers, timeout=300) as client:
        for _ in range(3):  # warm-up
            client.post("/v1/messages", json=small_body(server.model)).raise_for_status()
        started_at = time.monotonic()
        ends, cutoff = started_at + seconds, started_at + 4 * seconds
        while time.monotonic() < ends or (len(messages) < at_least and time.monotonic() < cutoff):
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            probes.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.post("/v1/messages", json=small_body(server.model)).raise_for_status()
            messages.append(time.perf_counter() - started)
            time.sleep(0.02)
    return messages, probes


class Attack:
    """Attacker processes (so they share no GIL with the neighbour's client) sending bodies in a loop."""

    def __init__(
        self, server: Server, targets: list[tuple[str, bytes]], workdir: Path, *, warmup_s: float = 2.0
    ) -> None:
        self.warmup_s = warmup_s
        self.statuses: dict[str, int] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.stop_file = workdir / "stop"
        self.stop_file.unlink(missing_ok=True)
        for i, (path, body) in enumerate(targets):
            body_file = workdir / f"body-{i}.json"
            body_file.write_bytes(body)
            command = [sys.executable, __file__, "attack", server.base, server.attacker, path, str(body_file)]
            command.append(str(self.stop_file))
            self.processes.append(subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE))

    def __enter__(self) -> Attack:
        time.sleep(self.warmup_s)  # let it get going
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_file.touch()
        for process in self.processes:
            out, _ = process.communicate(timeout=600)
            for status, count in json.loads(out or b"{}").items():
                self.statuses[status] = self.statuses.get(status, 0) + count


def attack_loop(base: str, key: str, path: str, body_file: str, stop_file: str) -> None:
    """One attacker connection: send the body until the stop file appears; print the statuses as JSON.

    Every NONCE in the body is replaced by a fresh random string for each request, so no
    two of them share a cached prefix or a compiled grammar.
    """
    template = Path(body_file).read_bytes()
    statuses: dict[str, int] = {}
    headers = {"x-api-key": key, "content-type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        while not Path(stop_file).exists():
            body = template.replace(NONCE, os.urandom(6).hex().encode()) if NONCE in template else template
            try:
                status = str(client.post(path, content=body).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            statuses[status] = statuses.get(status, 0) + 1
    print(json.dumps(statuses))


def near_limit_text(model: str, max_model_len: int | None) -> str:
    """As many characters as the cheap check lets through: the model's context x its longest token."""
    from transformers import AutoTokenizer

    from gateway.prompt_bounds import derive_bounds
    from inference.model_loader import resolve_model_dir
    from inference.settings import EngineSettings

    model_dir, _ = resolve_model_dir(EngineSettings(model=model))
    config = json.loads((model_dir / "config.json").read_text())
    context = max_model_len or int(config["max_position_embeddings"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bounds = derive_bounds(tokenizer=tokenizer, max_model_len=context, apply_chat_template=None)
    assert bounds.max_chars is not None, bounds.why_not
    return "hello " * ((bounds.max_chars - 200) // len("hello "))


def summary(timings: list[float]) -> dict[str, float]:
    ms = [t * 1000 for t in timings]
    return {"n": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms)}


def run(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    from tests.model_fixtures import build_tiny_model

    model = args.model or str(build_tiny_model("llama"))
    code = Path(args.server_repo or REPO).resolve()
    load_before = load_average()
    phases: list[tuple[str, dict[str, float], dict[str, float], dict[str, int]]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        Server(
            model=model,
            workdir=Path(tmp),
            code=code,
            engine_threads=args.engine_threads,
            extra_env=dict(item.split("=", 1) for item in args.server_env),
        ) as server,
    ):
        huge = encode(small_body(server.model, "x" * 30_000_000))
        near = near_limit_text(model, args.max_model_len)
        near_messages = encode(small_body(server.model, near))
        near_count = encode({"model": server.model, "messages": [{"role": "user", "content": near}]})
        # The costliest JSON per byte under the byte bound: json and pydantic hold the GIL for seconds.
        blocks = [{"type": "text", "text": "a"}] * (len(near) * 12 // 28)
        many = encode({"model": server.model, "max_tokens": 1, "messages": [{"role": "user", "content": blocks}]})

        # One token a word, behind a fresh nonce: every prompt is uncached from its first block.
        flood_text = (
            NONCE.decode() + " " + " ".join(COMMON_WORDS[i % len(COMMON_WORDS)] for i in range(args.flood_words))
        )
        flood = encode({**small_body(server.model, flood_text), "max_tokens": 32})
        schema = {"type": "object", "properties": {f"p{i}{NONCE.decode()}": {"type": "string"} for i in range(10_000)}}
        hostile = encode(
            {
                "model": server.model,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
            }
        )
        rows_wanted = set(args.phases)
        attacks: list[tuple[int, str, list[tuple[str, bytes]], float]] = [
            (2, f"30 MB bodies ({len(huge) / 1e6:.0f} MB) in a loop", [("/v1/messages", huge)], 2.0),
            (
                3,
                f"near-limit prompts ({len(near) / 1e3:.0f}k characters) in two loops",
                [("/v1/messages", near_messages), ("/v1/messages/count_tokens", near_count)],
                2.0,
            ),
            (4, f"{len(many) / 1e6:.1f} MB of one-character text blocks in a loop", [("/v1/messages", many)], 2.0),
            (
                5,
                f"a flood: uncached {args.flood_words:,}-token prompts, 32 tokens out each, from 16 connections",
                [("/v1/messages", flood)] * 16,
                5.0,
            ),
            (
                6,
                "10,000-property schemas, fresh names each, from two connections",
                [("/v1/chat/completions", hostile)] * 2,
                3.0,
            ),
        ]
        messages, probes = neighbour_latencies(server, seconds=args.seconds, at_least=50)
        phases.append(("idle", summary(messages), summary(probes), {}))
        for number, label, targets, warmup_s in attacks:
            if number not in rows_wanted:
                continue
            with Attack(server, targets, Path(tmp), warmup_s=warmup_s) as attack:
                messages, probes = neighbour_latencies(server, seconds=args.seconds, at_least=20)
            phases.append((label, summary(messages), summary(probes), attack.statuses))

    idle_p99 = phases[0][1]["p99"]
    rows = [
        "| while the attacker sends | n | p50 ms | p99 ms | max ms | p99 / idle p99 | /healthz p99 ms | attacker got |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, m, h, statuses in phases:
        answers = ", ".join(f"{count}x {status}" for status, count in sorted(statuses.items())) or "-"
        cells = f"{m['n']} | {m['p50']:.1f} | {m['p99']:.1f} | {m['max']:.1f} | {m['p99'] / idle_p99:.2f}"
        rows.append(f"| {label} | {cells} | {h['p99']:.1f} | {answers} |")
    missed = [label for label, m, _, _ in phases if m["p99"] >= 2 * idle_p99]
    verdict = "met in every row" if not missed else f"missed while: {'; '.join(missed)}"
    rows += ["", f"Target, the neighbour's p99 under attack below 2x its idle p99: **{verdict}**."]
    where = "this checkout" if code == REPO.resolve() else f"the checkout at {code}"
    if args.server_env:
        where += " with " + " ".join(args.server_env)
    intro = [
        f"`.venv/bin/python bench/neighbour_tenant.py --write-docs`, measured {time.strftime('%Y-%m-%d')} on "
        f"{machine_description()}, server from {where}",
        f"(shared with other work: 1-minute load average {load_before} before, {load_average()} after; the numbers",
        "are indicative). `kvgate serve` with the tiny test model (4,096-token context, SmolLM2's tokenizer) and",
        f"SQLite, the engine at {args.engine_threads} thread(s) (KVGATE_NUM_THREADS). The neighbour sends small",
        f"/v1/messages requests (one output token) one after another for {args.seconds:g} s per row, each after a",
        "/healthz probe (the event loop alone); the attacker is another tenant, in its own client processes on",
        "the same two cores, so its sending competes with the server for CPU as well.",
    ]
    return intro, rows


def main() -> None:
    # Terminated: unwind, so the server and attacker processes are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if sys.argv[1:2] == ["attack"]:
        attack_loop(*sys.argv[2:7])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: the tiny test model)")
    parser.add_argument("--max-model-len", type=int, help="the server's context length, if not the model's")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the neighbour measures, per row")
    parser.add_argument("--server-repo", help="run the server from this checkout instead")
    parser.add_argument(
        "--engine-threads", type=int, default=1, help="the engine's torch threads (KVGATE_NUM_THREADS); default 1"
    )
    parser.add_argument("--phases", type=int, nargs="*", default=[2, 3, 4, 5, 6], help="rows to run (2-6)")
    parser.add_argument("--flood-words", type=int, default=2500, help="words per flood prompt (a token each)")
    parser.add_argument("--server-env", nargs="*", default=[], help="KEY=VALUE settings for the server")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    intro, rows = run(args)
    print("\n".join([f"## {TITLE}", "", *intro, "", *rows]))
    if args.write_docs:
        write_section("noisy_tenant", TITLE, [*intro, "", *rows])


if __name__ == "__main__":
    main()
