"""vLLM as the hidden-state source, against a stand-in server that speaks vLLM's protocol as
read in vLLM 0.32's code: ``/v1/completions`` with a prompt of token ids answers with
``kv_transfer_params.hidden_states_path``; the file holds ``hidden_states`` [T, layers, H]
with the layers sorted ascending and ``token_ids`` [T], behind a ``.lock`` held while it is
written; layer id ``num_layers`` is the state *before* the final norm (vllm/model_executor/
models/llama.py records ``hidden_states + residual`` after each layer; the norm comes after).
The real server is checked by `dspark check vllm` (features equal to ours within 1e-5)."""

import fcntl
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from helpers import untrained_drafter
from safetensors.torch import save_file
from test_training import CFG, data, losses  # noqa: F401 - the module's data fixture

from dspark.errors import DSparkError
from dspark.training.data import InProcessSource, extract_features, load_examples
from dspark.training.trainer import TrainConfig, Trainer
from dspark.training.vllm_source import VllmHiddenStates, VllmSource


class StandIn:
    """A loopback HTTP server computing hidden states as vLLM's extract_hidden_states does."""

    def __init__(self, target, layers, storage):
        self.target, self.layers, self.storage = target, sorted(layers), storage
        self.requests = 0
        self.lock = threading.Lock()  # one forward at a time: the norm hook is per request
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, payload):
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send({"data": [{"id": "target"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                self._send(stand_in.answer(body["prompt"]))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, ids):
        with self.lock:
            return self._answer(ids)

    @torch.inference_mode()
    def _answer(self, ids):
        self.requests += 1
        model = self.target.model
        pre_norm = {}
        hook = model.model.norm.register_forward_pre_hook(lambda _m, args: pre_norm.update(h=args[0]))
        try:
            out = model(torch.tensor([ids]), output_hidden_states=True)
        finally:
            hook.remove()
        n = len(model.model.layers)
        states = [pre_norm["h"][0] if i == n else out.hidden_states[i][0] for i in self.layers]
        path = os.path.join(self.storage, f"{uuid.uuid4().hex}.safetensors")
        fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": torch.stack(states, 1).contiguous(), "token_ids": torch.tensor(ids)}, path)
        finally:
            os.close(fd)
        return {"choices": [{"text": "", "token_ids": [0]}], "kv_transfer_params": {"hidden_states_path": path}}

    def close(self):
        self.server.shutdown()


@pytest.fixture
def stand_in(tiny_targets, tmp_path):
    target = tiny_targets["qwen3"]
    aux = untrained_drafter(target).config.aux_hidden_state_layer_ids
    server = StandIn(target, set(aux) | {target.num_layers}, tmp_path / "hs")
    (tmp_path / "hs").mkdir()
    yield server
    server.close()


def test_vllm_features_equal_ours_with_the_final_norm_applied(tiny_targets, data, stand_in, tmp_path):  # noqa: F811
    target = tiny_targets["qwen3"]
    aux = untrained_drafter(target).config.aux_hidden_state_layer_ids
    client = VllmHiddenStates(stand_in.url, target, aux)
    for i, example in enumerate(load_examples(data)[:3]):
        theirs, ours = client.features(example, i), extract_features(target, example, aux, i)
        torch.testing.assert_close(theirs.aux_hidden, ours.aux_hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(theirs.last_hidden, ours.last_hidden, rtol=1e-5, atol=1e-5)
        assert torch.equal(theirs.input_ids, ours.input_ids) and torch.equal(theirs.loss_mask, ours.loss_mask)
    assert os.listdir(tmp_path / "hs") == []  # each file and its lock removed once read


def test_a_server_capturing_other_layers_is_refused_by_name(tiny_targets, data, tmp_path):  # noqa: F811
    target = tiny_targets["qwen3"]
    (tmp_path / "hs").mkdir()
    server = StandIn(target, {1, target.num_layers}, tmp_path / "hs")
    try:
        aux = untrained_drafter(target).config.aux_hidden_state_layer_ids
        client = VllmHiddenStates(server.url, target, aux)
        with pytest.raises(DSparkError, match="captures 2 layers"):
            client.features(load_examples(data)[0], 0)
    finally:
        server.close()


def test_cache_features_from_vllm_equals_the_in_process_cache(tiny_target_dirs, data, stand_in, tmp_path):  # noqa: F811
    from typer.testing import CliRunner

    from dspark.cli import app

    target_dir = tiny_target_dirs["qwen3"]
    common = ["cache-features", "--data", str(data), "--aux-layers", "1,2", "--target", str(target_dir)]
    common += ["--shard-size", "8"]
    stand_in.layers = [1, 2, stand_in.target.num_layers]
    runner = CliRunner()
    r = runner.invoke(app, [*common, "--out", str(tmp_path / "v"), "--vllm", stand_in.url, "--concurrency", "3"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*common, "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    from safetensors.torch import load_file

    v, o = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("v", "o"))
    assert (v["source"], o["source"]) == ("vllm", "in-process")
    assert v["shards"].keys() == o["shards"].keys()
    for name in v["shards"]:
        a, b = load_file(str(tmp_path / "v" / name)), load_file(str(tmp_path / "o" / name))
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key].float(), b[key].float(), rtol=2e-2, atol=2e-2)  # bf16 shards
    # One cache, one source: filling the vLLM cache in process is refused.
    r = runner.invoke(app, [*common, "--out", str(tmp_path / "v")])
    assert r.exit_code != 0 and "different data or settings" in r.output


def test_training_from_a_live_vllm_source_gives_the_in_process_loss_curve(tiny_targets, data, stand_in, tmp_path):  # noqa: F811
    target = tiny_targets["qwen3"]
    examples = load_examples(data, max_len=256)

    def run(kind, out):
        torch.manual_seed(0)
        model = untrained_drafter(target, markov_rank=32)
        aux = model.config.aux_hidden_state_layer_ids
        if kind == "vllm":
            source = VllmSource(stand_in.url, target, examples, aux, seed=0, concurrency=3)
        else:
            source = InProcessSource(target, examples, aux, seed=0)
        Trainer(model, source, TrainConfig(steps=6, **CFG), out, progress=False).train()
        return losses(out)

    torch.testing.assert_close(
        torch.tensor(run("vllm", tmp_path / "v")), torch.tensor(run("local", tmp_path / "l")), rtol=1e-4, atol=1e-4
    )
    assert stand_in.requests == 6


def test_vllm_hidden_states_prints_the_server_command(tiny_target_dirs):
    from typer.testing import CliRunner

    from dspark.cli import app

    runner = CliRunner()
    target = str(tiny_target_dirs["qwen3"])
    r = runner.invoke(app, ["vllm-hidden-states", "--aux-layers", "2,1", "--target", target, "--storage", "/tmp/hs"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("PYTHONPATH=") and "vllm serve" in r.output
    assert '"eagle_aux_hidden_state_layer_ids": [1, 2, 4]' in r.output  # + the final state (4 layers)
    assert '"kv_connector_module_path": "dspark.interop.vllm_connector"' in r.output
    r = runner.invoke(app, ["vllm-hidden-states", "--aux-layers", "1,9", "--target", target])
    assert r.exit_code != 0 and "[9]: outside [0, 4]" in r.output
    r = runner.invoke(app, ["vllm-hidden-states", "--aux-layers", "1", "--target", target, "--gpu"])
    assert "ExampleHiddenStatesConnector" in r.output and "PYTHONPATH" not in r.output
