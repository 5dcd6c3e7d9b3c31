"""`dspark serve` on loopback with a tiny random Qwen3 and an untrained drafter: the official
`openai` client, greedy identity with `dspark generate`, validation, back-pressure, a client
that disconnects mid-stream, metrics, and graceful shutdown."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from dspark.cli import app
from dspark.decoding.factory import Drafting
from dspark.serve.worker import StopStrings

runner = CliRunner()
# A fixed system turn first, as real templates have (the batch server caches its prefix).
TEMPLATE = (
    "<eos>system: reply with code only.<eos>"
    "{% for m in messages %}<eos>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<mask>{% endif %}"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target, draft, *extra) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "dspark.cli", "serve", "--target", str(target), "--port", str(port), *extra]
    if draft is not None:
        cmd += ["--draft", str(draft)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


@pytest.fixture(scope="module")
def chat_target(tiny_target_dirs, tmp_path_factory):
    from dspark.interop.tiny_targets import with_chat_template

    return with_chat_template(tiny_target_dirs["qwen3"], tmp_path_factory.mktemp("serve") / "target", TEMPLATE)


@pytest.fixture(scope="module")
def draft(chat_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "draft"
    result = runner.invoke(app, ["init", "--target", str(chat_target), "--out", str(out), "--block-size", "4"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def server(chat_target, draft):
    # One request at a time (the Worker); the batch engine's servers below ask for --batch.
    proc, base = start_server(
        chat_target, draft, "--num-speculative-tokens", "3", "--max-concurrency", "4", "--batch", "1"
    )
    yield base
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def generate(target, draft, prompt, n, chat):
    result = runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompt",
            prompt,
            "--max-new-tokens",
            str(n),
            "--num-speculative-tokens",
            "3",
            "--json",
            "--chat" if chat else "--no-chat",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["text"]


def test_openai_client_matches_dspark_generate(server, chat_target, draft):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    prompt = "def add(a, b):"
    completion = client.completions.create(model="target", prompt=prompt, max_tokens=40, temperature=0)
    expected_plain = generate(chat_target, draft, prompt, 40, chat=False)
    assert completion.choices[0].text == expected_plain
    spec = completion.model_extra["spec_decode"]
    assert spec["num_speculative_tokens"] == 3 and spec["accept_len"] >= 1.0
    streamed = client.completions.create(model="target", prompt=prompt, max_tokens=40, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected_plain

    chat = client.chat.completions.create(
        model="target", messages=[{"role": "user", "content": prompt}], max_tokens=40, temperature=0
    )
    expected_chat = generate(chat_target, draft, prompt, 40, chat=True)
    assert chat.choices[0].message.content == expected_chat
    stream = client.chat.completions.create(
        model="target",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == expected_chat
    assert usage is not None and usage.completion_tokens >= 1

    sampled = client.completions.create(model="target", prompt=prompt, max_tokens=20, temperature=0.8, seed=5)
    again = client.completions.create(model="target", prompt=prompt, max_tokens=20, temperature=0.8, seed=5)
    assert sampled.choices[0].text == again.choices[0].text  # seeded sampling is reproducible


def test_models_health_and_metrics(server):
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["id"] == "target"
    assert httpx.get(f"{server}/health").json()["status"] == "ok"

    def counter(text: str, name: str) -> float:
        return float(next(line for line in text.splitlines() if line.startswith(name + "{")).split()[-1])

    # The counters move by what the request's own spec_decode says it did (whatever ran before).
    names = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
    before = httpx.get(f"{server}/metrics").text
    reply = httpx.post(
        f"{server}/v1/completions", json={"prompt": "x = 1", "max_tokens": 12, "temperature": 0}, timeout=60
    ).json()
    text = httpx.get(f"{server}/metrics").text
    spec = reply["spec_decode"]
    assert spec["draft_tokens"] > 0
    moved = [counter(text, n) - counter(before, n) for n in names]
    assert moved == [spec["draft_tokens"], spec["accepted_tokens"]]
    generated = counter(text, "vllm:generation_tokens_total") - counter(before, "vllm:generation_tokens_total")
    assert generated == reply["usage"]["completion_tokens"] > 0
    assert counter(text, "vllm:spec_decode_num_drafts_total") > counter(before, "vllm:spec_decode_num_drafts_total")
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="target",position="0"}' in text


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"prompt": "hi", "bogus": 1}).encode(), 400, "unknown field"),
        (json.dumps({"prompt": "hi", "temperature": 3}).encode(), 400, "temperature"),
        (json.dumps({"prompt": "hi", "top_p": 0}).encode(), 400, "top_p"),
        (json.dumps({"prompt": "hi", "n": 2}).encode(), 400, "n=1"),
        (json.dumps({"prompt": "hi", "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "hi", "max_tokens": 5000}).encode(), 400, "context length"),
        (json.dumps({"prompt": "word " * 600}).encode(), 400, "context"),
        (json.dumps({"prompt": [999999]}).encode(), 400, "token ids"),
        (json.dumps({"prompt": "hi", "model": "other"}).encode(), 404, "does not exist"),
        (json.dumps({"max_tokens": 3}).encode(), 400, "prompt"),
    ],
)
def test_bad_requests_get_4xx_and_the_server_stays_up(server, body, status, words):
    r = httpx.post(f"{server}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_chat_validation(server):
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]


def test_faults_do_not_disturb_other_clients(server):
    prompts = [f"def f{i}(x):" for i in range(3)]
    expected = [
        httpx.post(
            f"{server}/v1/completions", json={"prompt": p, "max_tokens": 60, "temperature": 0}, timeout=120
        ).json()["choices"][0]["text"]
        for p in prompts
    ]
    # 1) a client that reads two chunks of a long stream and hangs up
    with httpx.stream(
        "POST",
        f"{server}/v1/completions",
        timeout=60,
        json={"prompt": "def long(x):", "max_tokens": 400, "temperature": 0, "stream": True, "stop": ["never-appears"]},
    ) as r:
        chunks = r.iter_lines()
        next(chunks)
        next(chunks)
    # 2) a flood beyond the bound of 4, alongside correct clients and a malformed request
    statuses, answers = [], {}

    def flood():
        try:
            r = httpx.post(
                f"{server}/v1/completions", json={"prompt": "z", "max_tokens": 200, "temperature": 0}, timeout=120
            )
            statuses.append(r.status_code)
        except httpx.HTTPError as exc:  # pragma: no cover - reported below
            statuses.append(repr(exc))

    def good(i):
        # Retry on 429, as a well-behaved client does, until a deadline rather than a count: on a
        # loaded machine the flood holds the queue longer than 40 quick retries last.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            r = httpx.post(
                f"{server}/v1/completions", json={"prompt": prompts[i], "max_tokens": 60, "temperature": 0}, timeout=120
            )
            if r.status_code != 429:
                answers[i] = (r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text)
                return
            time.sleep(0.2)

    threads = [threading.Thread(target=flood) for _ in range(12)] + [
        threading.Thread(target=good, args=(i,)) for i in range(3)
    ]
    for t in threads:
        t.start()
    bad = httpx.post(f"{server}/v1/completions", content=b"{", headers={"content-type": "application/json"})
    for t in threads:
        t.join(timeout=180)
    assert bad.status_code == 400
    assert 429 in statuses, statuses  # back-pressure happened
    assert set(statuses) <= {200, 429}, statuses
    assert answers == {i: (200, expected[i]) for i in range(3)}
    assert httpx.get(f"{server}/health").status_code == 200


def test_stop_strings_are_cut_and_never_leak():
    vocab = {1: "ab", 2: "c", 3: "STO", 4: "P!", 5: "x"}

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    s = StopStrings(decode, ["STOP"])
    out = s.push([1]) + s.push([2]) + s.push([3])
    assert out == "abc"  # "STO" is held back: it may begin the stop
    out += s.push([4])
    assert out == "abc" and s.hit
    s = StopStrings(decode, ["STOP"])
    assert s.push([3]) + s.push([5]) + s.flush() == "STOx"


@pytest.mark.parametrize("batch", ["1", "2"])
def test_graceful_shutdown_finishes_the_request_in_flight(chat_target, draft, batch):
    # (this server also measures its step cost at start-up and picks draft lengths with it;
    # with --batch 2, the batch's step cost and the load-aware length)
    proc, base = start_server(
        chat_target,
        draft,
        "--num-speculative-tokens",
        "3",
        "--shutdown-grace",
        "300",  # room for a busy machine: the request must end by itself, well inside it
        "--cost-model",
        "auto",
        "--batch",
        batch,
    )
    # The signal comes after the first streamed chunk: the response is open, so the request is
    # in flight at the server whatever the machine's speed, and must be finished, not cut.
    events = []
    with httpx.stream(
        "POST",
        f"{base}/v1/completions",
        timeout=120,
        json={"prompt": "def g(x):", "max_tokens": 480, "temperature": 0, "stream": True, "stop": ["never-appears"]},
    ) as r:
        assert r.status_code == 200
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        events.append(next(lines))
        proc.send_signal(signal.SIGTERM)
        events.extend(lines)
    ended = time.monotonic()
    # uvicorn re-raises the signal after its graceful shutdown, so -SIGTERM is a clean exit too
    assert proc.wait(timeout=300) in (0, -signal.SIGTERM)
    # Once nothing runs the server exits; it does not sit out the grace period (a batched one did).
    assert time.monotonic() - ended < 60
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length")  # its own end, not an error event
    assert last.get("spec_decode", {}).get("finish_detail") not in ("abort", "timeout")


def test_vllm_handoff(chat_target, draft, tmp_path):
    out = tmp_path / "spec"
    assert runner.invoke(app, ["export", str(draft), "--format", "speculators", "--out", str(out)]).exit_code == 0
    result = runner.invoke(
        app, ["vllm-config", str(out), "--target", str(chat_target), "--json", "--num-speculative-tokens", "4"]
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["speculative_config"] == {"model": str(out.resolve()), "num_speculative_tokens": 4, "method": "dspark"}
    assert info["command"].startswith("vllm serve ")
    assert info["checks"][-1].startswith(f"fits target {chat_target} (hidden 64")
    too_many = runner.invoke(
        app, ["vllm-config", str(out), "--target", str(chat_target), "--num-speculative-tokens", "9"]
    )
    assert too_many.exit_code == 2 and "drafts per block" in too_many.output
    printed = runner.invoke(
        app,
        [
            "serve",
            "--target",
            str(chat_target),
            "--draft",
            str(out),
            "--print-vllm",
            "--prompt-lookup",
            "3",
            "--num-speculative-tokens",
            "4",
        ],
    )
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.startswith("vllm serve ") and "note: --prompt-lookup is dspark serve's own" in printed.output


def test_vllm_handoff_for_an_eagle3_drafter(chat_target, tmp_path):
    made = runner.invoke(
        app, ["init", "--target", str(chat_target), "--out", str(tmp_path / "e3"), "--method", "eagle3"]
    )
    assert made.exit_code == 0, made.output
    out = tmp_path / "spec"
    exported = runner.invoke(app, ["export", str(tmp_path / "e3"), "--format", "speculators", "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    result = runner.invoke(app, ["vllm-config", str(out), "--target", str(chat_target), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["speculative_config"]["method"] == "eagle3"
    assert "eagle_aux_hidden_state_layer_ids present" in info["checks"]
    steps = json.loads((out / "config.json").read_text())["speculators_config"]["proposal_methods"][0]
    too_many = runner.invoke(
        app,
        [
            "vllm-config",
            str(out),
            "--target",
            str(chat_target),
            "--num-speculative-tokens",
            str(steps["speculative_tokens"] + 1),
        ],
    )
    assert too_many.exit_code == 2 and "chain steps" in too_many.output


def test_worker_builds_its_engines_on_its_own_thread_and_reraises_build_errors():
    """Every torch op of the server (loading included) runs on the worker thread."""
    from dspark.errors import DSparkError
    from dspark.serve.metrics import Metrics
    from dspark.serve.worker import Worker

    seen = {}

    def build():
        seen["thread"] = threading.current_thread()
        return "spec", "plain"

    worker = Worker(build, str, max_queue=1, metrics=Metrics("m"))
    assert seen["thread"] is worker._thread and seen["thread"] is not threading.main_thread()
    assert worker.engines == {True: "spec", False: "plain"}
    worker.shutdown(0)

    def broken():
        raise DSparkError("no such target")

    with pytest.raises(DSparkError, match="no such target"):
        Worker(broken, str, max_queue=1, metrics=Metrics("m"))


def test_prompt_lookup_needs_a_drafter(chat_target):
    from dspark.errors import DSparkError
    from dspark.serve.server import ServeOptions, build_app

    with pytest.raises(DSparkError, match="--prompt-lookup drafts for a drafter"):
        build_app(ServeOptions(target=chat_target, drafting=Drafting(prompt_lookup=3), num_speculative_tokens=0))


def test_serve_checks_the_drafter_before_loading_the_target(chat_target, draft, wider_target_dir, tmp_path):
    """Cheap checks first: a missing drafter or a pair that does not fit is named while the
    target's weights are still unread (here they are corrupt, so reading them would fail)."""
    from dspark.errors import DSparkError
    from dspark.serve.server import ServeOptions, build_app

    corrupt = tmp_path / "corrupt-target"
    shutil.copytree(chat_target, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DSparkError, match="no-such: no such drafter file or directory"):
        build_app(ServeOptions(target=corrupt, drafting=Drafting(draft=tmp_path / "no-such")))
    wider = tmp_path / "wider-target"
    shutil.copytree(wider_target_dir, wider)
    (wider / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DSparkError, match=f"drafter does not fit target {wider}: hidden size"):
        build_app(ServeOptions(target=wider, drafting=Drafting(draft=draft)))
    with pytest.raises(DSparkError, match="no such target directory"):
        build_app(ServeOptions(target=tmp_path / "nowhere", drafting=Drafting(draft=draft)))


def test_vllm_handoff_checks_the_pair(draft, wider_target_dir, tmp_path):
    out = tmp_path / "spec"
    assert runner.invoke(app, ["export", str(draft), "--format", "speculators", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["vllm-config", str(out), "--target", str(wider_target_dir)])
    assert result.exit_code == 2
    assert f"drafter does not fit target {wider_target_dir}: hidden size" in result.output
    hub_args = ["vllm-config", str(out), "--target", "Org/Some-Model", "--json", "--num-speculative-tokens", "4"]
    hub = runner.invoke(app, hub_args)
    assert hub.exit_code == 0, hub.output
    note = json.loads(hub.output)["checks"][-1]
    assert note.startswith("fit not checked: Org/Some-Model is not a local Hugging Face directory")


def test_served_prompt_lookup_reports_its_steps(chat_target, draft):
    """--prompt-lookup: output equal to plain decoding's; spec_decode and /metrics count lookup steps."""
    proc, base = start_server(chat_target, draft, "--num-speculative-tokens", "3", "--prompt-lookup", "1")
    try:
        body = {"model": "target", "prompt": "a b a b a b a b", "max_tokens": 24, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        plain = generate(chat_target, draft, "a b a b a b a b", 24, chat=False)
        assert r["choices"][0]["text"] == plain
        steps = r["spec_decode"]["lookup_steps"]
        assert 0 < steps <= r["spec_decode"]["target_forwards"]
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert re.search(rf"^dspark:spec_decode_lookup_steps_total(\{{[^}}]*\}})? {float(steps)}$", metrics, re.M)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _vllm_reading(config: dict) -> dict:
    """What vLLM 0.32.0 makes of a speculators DFlash/DSpark config.json, as its code reads it
    (vllm/transformers_utils/configs/speculators/algos.py, update_dflash / update_dspark)."""
    return {
        "dflash_causal": not config.get("sliding_window_non_causal", True),
        "target_layer_ids": [i - 1 for i in config["aux_hidden_state_layer_ids"]],
        "sample_from_anchor": config.get("sample_from_anchor", False),
        "dspark_bonus_anchor": not config.get("sample_from_anchor", False),
    }


def test_vllm_reads_our_block_drafters_as_we_mean_them(chat_target, tmp_path):
    """Each field vLLM interprets, in vLLM's reading: the block is bidirectional, the layer
    ids are ours minus one (vLLM's target_layer_ids convention), the slot layout is stated."""
    for method, extra in (("dspark", []), ("dflash", ["--no-sample-from-anchor"])):
        made = runner.invoke(
            app, ["init", "--target", str(chat_target), "--out", str(tmp_path / method), "--method", method, *extra]
        )
        assert made.exit_code == 0, made.output
        out = tmp_path / f"{method}-spec"
        assert (
            runner.invoke(
                app, ["export", str(tmp_path / method), "--format", "speculators", "--out", str(out)]
            ).exit_code
            == 0
        )
        config = json.loads((out / "config.json").read_text())
        reading = _vllm_reading(config)
        assert reading["dflash_causal"] is False  # bidirectional, as trained
        assert reading["target_layer_ids"] == [i - 1 for i in config["aux_hidden_state_layer_ids"]]
        assert reading["sample_from_anchor"] is (method == "dspark")
        handoff = runner.invoke(
            app, ["vllm-config", str(out), "--target", str(chat_target), "--json", "--num-speculative-tokens", "3"]
        )
        assert handoff.exit_code == 0, handoff.output
    # The layout vLLM's DFlash runner refuses, and an older export that vLLM would run causally.
    made = runner.invoke(
        app, ["init", "--target", str(chat_target), "--out", str(tmp_path / "anchor"), "--method", "dflash"]
    )
    assert made.exit_code == 0
    out = tmp_path / "anchor-spec"
    assert (
        runner.invoke(app, ["export", str(tmp_path / "anchor"), "--format", "speculators", "--out", str(out)]).exit_code
        == 0
    )
    refused = runner.invoke(
        app, ["vllm-config", str(out), "--target", str(chat_target), "--num-speculative-tokens", "3"]
    )
    assert refused.exit_code == 2 and "sample_from_anchor=true" in refused.output and "vLLM's dflash" in refused.output
    old = tmp_path / "dflash-spec" / "config.json"
    config = json.loads(old.read_text())
    config["sliding_window_non_causal"] = False
    old.write_text(json.dumps(config))
    causal = runner.invoke(
        app, ["vllm-config", str(old.parent), "--target", str(chat_target), "--num-speculative-tokens", "3"]
    )
    assert causal.exit_code == 2 and "causally" in causal.output
    # We read either value as the bidirectional block we train.
    from dspark.formats.checkpoint import load_config

    assert load_config(old.parent).block_size == load_config(tmp_path / "dflash-spec").block_size


def test_datagen_through_a_server_gets_the_in_process_rows(server, chat_target, tmp_path):
    """`dspark datagen --server`: prompts sent as token ids, answers taken as token ids (vLLM's
    return_token_ids, which dspark serve speaks too); greedy rows equal in-process datagen's."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": t}) + "\n" for t in ("def f(x):", "hello there", "a b a b", "1 2 3"))
    )
    rows = {}
    for name, extra in (
        ("server", ["--server", server + "/v1", "--concurrency", "3"]),
        ("local", ["--engine", "generate"]),
    ):
        out = tmp_path / f"{name}.jsonl"
        args = [
            "datagen",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--target",
            str(chat_target),
            "--max-new-tokens",
            "12",
        ]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        rows[name] = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    assert [r["input_ids"] for r in rows["server"]] == [r["input_ids"] for r in rows["local"]]
    assert [r["loss_mask"] for r in rows["server"]] == [r["loss_mask"] for r in rows["local"]]
    assert {r["engine"] for r in rows["server"]} == {"server/target"}
    # A server that cannot return token ids is named, not silently re-tokenized.
    body = {"prompt": [5, 6], "max_tokens": 2, "stream": True, "return_token_ids": True}
    assert httpx.post(server + "/v1/completions", json=body, timeout=30).status_code == 400


def test_datagen_bench_puts_a_server_beside_the_in_process_engines(server, chat_target):
    """`dspark corpus bench --engines ...,server/N --server URL`: same prompts, one table; dspark
    serve's greedy answers (fp32) agree with in-process generate token for token."""
    from dspark.bench.datagen import parse_engines, run_datagen_bench
    from dspark.errors import DSparkError

    specs = parse_engines("generate/float32/4,server/3")
    assert [s.label for s in specs] == ["generate/float32/4", "server/3"]
    prompts = ["def f(x):", "hello there", "a b a b"]
    rows = run_datagen_bench(chat_target, prompts, specs, max_new_tokens=8, server=server, log=lambda _m: None)
    assert rows[1]["engine"] == "server/target" and rows[1]["identical_to_reference"] == 3
    with pytest.raises(DSparkError, match="needs --server"):
        run_datagen_bench(chat_target, prompts, specs, max_new_tokens=8, log=lambda _m: None)
    with pytest.raises(DSparkError, match="server/N"):
        parse_engines("server/x")


def test_continuous_batching_serves_each_request_as_alone(server, chat_target, draft):
    """`dspark serve --batch 3`: six clients at once (plain and speculative, different
    lengths, a stop string, one client hanging up mid-stream) each get the text the
    one-at-a-time server gives them."""
    proc, batched = start_server(
        chat_target, draft, "--num-speculative-tokens", "3", "--batch", "3", "--max-concurrency", "8"
    )
    try:
        bodies = [{"prompt": f"def f{i}(x):", "max_tokens": 10 + 7 * i, "temperature": 0} for i in range(5)] + [
            {"prompt": "a b a b", "max_tokens": 30, "temperature": 0, "stop": ["b a"]}
        ]
        # Two chat turns too: their prompts start with the template's system turn, whose
        # cached prefix the batch server copies in at prefill.
        paths = ["/v1/completions"] * len(bodies) + ["/v1/chat/completions"] * 2
        bodies += [
            {"messages": [{"role": "user", "content": c}], "max_tokens": 14, "temperature": 0}
            for c in ("sort a list", "x = 1")
        ]

        def text(answer) -> str:
            choice = answer["choices"][0]
            return choice["message"]["content"] if "message" in choice else choice["text"]

        expected = [
            text(httpx.post(f"{server}{u}", json=b, timeout=120).json()) for u, b in zip(paths, bodies, strict=True)
        ]
        answers: dict[int, object] = {}

        def ask(i):
            r = httpx.post(f"{batched}{paths[i]}", json=bodies[i], timeout=120)
            answers[i] = r.json()

        def hang_up():
            with httpx.stream(
                "POST",
                f"{batched}/v1/completions",
                timeout=60,
                json={"prompt": "def long(x):", "max_tokens": 300, "temperature": 0, "stream": True},
            ) as r:
                lines = r.iter_lines()
                next(lines)
                next(lines)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        threads.append(threading.Thread(target=hang_up))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, body in enumerate(bodies):
            assert text(answers[i]) == expected[i], body
            assert answers[i]["spec_decode"]["accept_len"] >= 1.0
        # The chat turns' system-turn prefix came from the cache (the completions have none).
        metrics = httpx.get(f"{batched}/metrics").text
        hits = sum(
            float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_hits")
        )
        assert hits >= 2 * 4, metrics
        # The load-aware rule picked each batched step's length (0 included) and timed it.
        picked = re.findall(r'^dspark:batch_rule_steps_total\{[^}]*draft_length="(\d)"\} (\S+)$', metrics, re.M)
        timed = re.findall(r'^dspark:batch_rule_step_seconds_total\{[^}]*draft_length="(\d)"\} (\S+)$', metrics, re.M)
        assert picked and [k for k, _ in picked] == [k for k, _ in timed], metrics
        assert all(0 <= int(k) <= 3 and float(n) >= 1 for k, n in picked)
        assert all(float(t) > 0 for _, t in timed)
        deadline = time.monotonic() + 30  # the hung-up stream is cut at its next step
        while 'finished_reason="abort"} 1' not in httpx.get(f"{batched}/metrics").text:
            assert time.monotonic() < deadline, "the abandoned request was not aborted"
            time.sleep(0.2)
        # Idle again: no request counted as running.
        assert re.search(r"^vllm:num_requests_running\{[^}]*\} 0\.0$", httpx.get(f"{batched}/metrics").text, re.M)
        seeded = {"prompt": "x =", "max_tokens": 12, "temperature": 0.8, "seed": 3}
        first, again = (httpx.post(f"{batched}/v1/completions", json=seeded, timeout=60).json() for _ in range(2))
        assert first["choices"][0]["text"] == again["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.filterwarnings("ignore::dspark.devices.EmulatedBFloat16Warning")  # bf16 on purpose, on any CPU
def test_a_bfloat16_server_serves_what_bfloat16_generate_gives(chat_target, draft):
    """`dspark serve --dtype bfloat16` loads target and drafter in bf16 (/health says so) and
    answers with the text `dspark generate --dtype bfloat16` gives. Its other options are the
    defaults: a Qwen3 target is served with continuous batching (--batch auto) and the
    load-aware draft length."""
    from dspark.serve.server import AUTO_BATCH

    proc, base = start_server(chat_target, draft, "--num-speculative-tokens", "3", "--dtype", "bfloat16")
    try:
        health = httpx.get(f"{base}/health").json()
        assert health["dtype"] == "bfloat16" and health["batch"] == AUTO_BATCH
        served = httpx.post(
            f"{base}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 24, "temperature": 0}, timeout=120
        ).json()["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    args = ["generate", "--target", str(chat_target), "--draft", str(draft), "--prompt", "def f(x):"]
    args += ["--max-new-tokens", "24", "--num-speculative-tokens", "3", "--json", "--no-chat"]
    texts = {}
    for dtype in ("bfloat16", "float32"):
        result = runner.invoke(app, [*args, "--dtype", dtype])
        assert result.exit_code == 0, result.output
        texts[dtype] = json.loads(result.stdout)["text"]
    assert served == texts["bfloat16"]
    assert texts["bfloat16"] != texts["float32"]  # else this test could not tell the dtypes apart


def test_batch_auto_batches_llama_style_targets_only(tiny_target_dirs, tmp_path):
    """`--batch auto` (the default): continuous batching for the decoders the slot engine runs,
    one request at a time for anything else; a bad --batch is refused before anything loads."""
    from dspark.serve.server import AUTO_BATCH, auto_batch

    assert auto_batch(tiny_target_dirs["llama"])[0] == AUTO_BATCH
    assert auto_batch(tiny_target_dirs["qwen3"])[0] == AUTO_BATCH
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    batch, why = auto_batch(other)
    assert batch == 1 and "one request at a time" in why
    assert auto_batch(tmp_path / "model.gguf")[0] == 1
    for bad in ("0", "many"):
        result = runner.invoke(app, ["serve", "--target", str(tiny_target_dirs["llama"]), "--batch", bad])
        assert result.exit_code == 2 and "--batch" in result.output, result.output
