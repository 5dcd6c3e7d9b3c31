"""Training on a tiny target: it learns, resumes exactly, and refuses damaged checkpoints."""

import itertools
import json
import shutil

import pytest
import torch
from helpers import untrained_drafter

from dspark.decoding import DSparkDrafter, SpeculativeEngine
from dspark.errors import CheckpointError, DSparkError
from dspark.formats.checkpoint import load_drafter
from dspark.training.data import InProcessSource, OnlineSource, load_examples, save_examples
from dspark.training.datagen import self_distill
from dspark.training.evaluate import simulated_accept_len
from dspark.training.trainer import TrainConfig, Trainer, lr_factor

WORDS = [
    "def",
    "add",
    "the",
    "answer",
    "for",
    "in",
    "range",
    "print",
    "return",
    "sold",
    "clips",
    "friends",
    "April",
    "May",
    "half",
    "speculative",
    "decoding",
    "drafts",
    "tokens",
    "target",
    "verifies",
    "pass",
]


@pytest.fixture(scope="module")
def data(tiny_targets, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    prompts = [" ".join(WORDS[i : i + 3]) for i in range(20)]
    assert self_distill(tiny_targets["qwen3"], prompts, path, max_new_tokens=48, progress=False) == 20
    assert self_distill(tiny_targets["qwen3"], prompts, path, max_new_tokens=48, progress=False) == 0  # resumes
    return path


def real_accept_len(target, model):
    drafter = DSparkDrafter(model, target_vocab_size=target.vocab_size)
    prompt = target.tokenizer("the answer for")["input_ids"]
    return SpeculativeEngine(target, drafter, num_speculative_tokens=7).generate(
        prompt, max_new_tokens=48, stop_token_ids=set()
    )


CFG = dict(lr=5e-3, warmup=10, max_anchors=32, seq_len=256, checkpoint_every=10)


def test_online_training_raises_simulated_and_real_acceptance(tiny_targets, tiny_target_dirs, data, tmp_path):
    target = tiny_targets["qwen3"]
    examples = load_examples(data)
    model = untrained_drafter(target, markov_rank=32)
    sim_before = simulated_accept_len(model, target, examples[:8])["sim_accept_len"]
    real_before = real_accept_len(target, model)
    source = OnlineSource(tiny_target_dirs["qwen3"], data, model.config.aux_hidden_state_layer_ids, seed=0, max_len=256)
    Trainer(model, source, TrainConfig(steps=300, **CFG), tmp_path, progress=False).train()
    sim_after = simulated_accept_len(model, target, examples[:8])["sim_accept_len"]
    real_after = real_accept_len(target, model)
    assert sim_after > sim_before + 0.3, (sim_before, sim_after)
    assert real_after.accept_len > real_before.accept_len + 0.2, (real_before.accept_len, real_after.accept_len)
    assert (tmp_path / "final" / "model.safetensors").is_file()
    plain = SpeculativeEngine(target).generate(
        target.tokenizer("the answer for")["input_ids"], max_new_tokens=48, stop_token_ids=set()
    )
    assert real_after.tokens == plain.tokens  # a trained drafter is still lossless


def test_online_workers_stream_the_order_and_features_of_one_worker(tiny_target_dirs, data):
    """Two target processes, each computing every other row, give the rows one process gives:
    same positions, same examples, same features, from a start that is not a multiple of two
    and across an epoch boundary (20 rows)."""
    aux = (1, 2)

    def rows(workers):
        src = OnlineSource(tiny_target_dirs["qwen3"], data, aux, seed=3, max_len=256, workers=workers)
        return list(src.batches(17, 7))

    one, two = rows(1), rows(2)
    assert [b.index for b in two] == [b.index for b in one] == list(range(17, 24))
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        assert torch.equal(a.aux_hidden, b.aux_hidden) and torch.equal(a.last_hidden, b.last_hidden)


def test_online_source_names_a_worker_that_died(tiny_target_dirs, data):
    import os
    import signal

    src = OnlineSource(tiny_target_dirs["qwen3"], data, (1, 2), seed=0, max_len=256, workers=2, queue_size=1)
    rows = src.batches(0, 400)
    next(rows)
    os.kill(src._procs[1].pid, signal.SIGKILL)
    with pytest.raises(DSparkError, match="target worker 1 exited"):
        for _ in rows:
            pass
    assert src._procs == []  # closed: the other worker was stopped


def test_online_workers_exit_when_their_trainer_is_killed(tiny_target_dirs, data, tmp_path):
    """A trainer killed without its clean-up (SIGKILL) leaves no target process computing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from dspark.training.data import OnlineSource\n"
        "src = OnlineSource(sys.argv[1], sys.argv[2], (1, 2), seed=0, max_len=256, workers=2, queue_size=1)\n"
        "rows = src.batches(0, 10_000)\n"
        "next(rows)\n"
        "print(' '.join(str(p.pid) for p in src._procs), flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tiny_target_dirs["qwen3"]), str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited
            return fh.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def losses(run_dir):
    by_step = {}
    for line in (run_dir / "train_log.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step[row["step"]] = row["loss"]
    return [by_step[s] for s in sorted(by_step)]


def test_resume_after_a_kill_reproduces_the_loss_curve(tiny_targets, data, tmp_path):
    target = tiny_targets["qwen3"]
    examples = load_examples(data)

    def trainer(out):
        torch.manual_seed(0)
        model = untrained_drafter(target, markov_rank=32)
        source = InProcessSource(target, examples, model.config.aux_hidden_state_layer_ids, seed=0)
        return Trainer(model, source, TrainConfig(steps=30, **CFG), out, progress=False)

    trainer(tmp_path / "full").train()
    trainer(tmp_path / "killed").train(stop_after=17)  # "killed" at step 17; last checkpoint at 10
    assert (tmp_path / "killed" / "checkpoints" / "step_0000010").is_dir()
    resumed = trainer(tmp_path / "killed")
    resumed.train()
    assert resumed.step == 30
    full, again = losses(tmp_path / "full"), losses(tmp_path / "killed")
    assert len(full) == len(again) == 30
    torch.testing.assert_close(torch.tensor(again), torch.tensor(full), rtol=1e-5, atol=1e-6)


def test_corrupt_or_partial_checkpoint_is_refused(tiny_targets, data, tmp_path):
    target = tiny_targets["qwen3"]
    examples = load_examples(data)
    model = untrained_drafter(target, markov_rank=32)
    source = InProcessSource(target, examples, model.config.aux_hidden_state_layer_ids, seed=0)
    tr = Trainer(model, source, TrainConfig(steps=10, **CFG), tmp_path, progress=False)
    tr.train()
    ckpt = tr.latest_checkpoint()
    state = ckpt / "state.pt"
    state.write_bytes(state.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        tr.train()
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="partial checkpoint"):
        tr.load_checkpoint(ckpt)
    shutil.rmtree(ckpt)


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(100, cfg) == pytest.approx(0.1)
    assert lr_factor(55, cfg) == pytest.approx(0.55)


def test_offline_cache_trains_like_the_online_source(tiny_targets, data, tmp_path):
    from dspark.training.feature_cache import OfflineSource, build_feature_cache

    target = tiny_targets["qwen3"]
    examples = load_examples(data)

    def run(source_kind, out):
        torch.manual_seed(0)
        model = untrained_drafter(target, markov_rank=32)
        aux = model.config.aux_hidden_state_layer_ids
        if source_kind == "offline":
            build_feature_cache(
                target, examples, aux, tmp_path / "cache", shard_size=6, dtype=torch.float32, progress=False
            )
            build_feature_cache(
                target, examples, aux, tmp_path / "cache", shard_size=6, dtype=torch.float32, progress=False
            )  # resumes: nothing to do
            source = OfflineSource(tmp_path / "cache", aux, seed=0)
        else:
            source = InProcessSource(target, examples, aux, seed=0)
        Trainer(model, source, TrainConfig(steps=8, **CFG), out, progress=False).train()
        return losses(out)

    torch.testing.assert_close(
        torch.tensor(run("offline", tmp_path / "a")), torch.tensor(run("inproc", tmp_path / "b"))
    )
    shard = tmp_path / "cache" / "shard_00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    from dspark.training.feature_cache import OfflineSource as Source

    source = Source(tmp_path / "cache", untrained_drafter(target).config.aux_hidden_state_layer_ids, seed=0)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        list(source.batches(0, 20))


def test_sparse_logging_logs_the_same_metrics(tiny_targets, data, tmp_path):
    """Metrics are computed only on logged steps: a log every 3 steps holds what a log every
    step holds at those steps, and the weights end the same."""
    target = tiny_targets["qwen3"]
    examples = load_examples(data)

    def run(log_every, out):
        torch.manual_seed(0)
        model = untrained_drafter(target, markov_rank=32)
        source = InProcessSource(target, examples, model.config.aux_hidden_state_layer_ids, seed=0)
        cfg = TrainConfig(steps=7, log_every=log_every, **CFG)
        last = Trainer(model, source, cfg, out, progress=False).train()
        lines = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text().splitlines()]
        return model, last, {ln["step"]: ln for ln in lines}

    dense_model, _, dense = run(1, tmp_path / "dense")
    sparse_model, last, sparse = run(3, tmp_path / "sparse")
    assert sorted(sparse) == [3, 6, 7]
    assert "sim_accept_len" in last and "accept" in last
    for step, line in sparse.items():
        assert set(line) == set(dense[step]), step
        for key, value in line.items():
            if key not in ("step_seconds", "source_wait_seconds"):
                assert value == pytest.approx(dense[step][key], rel=1e-6, abs=1e-7), (step, key)
    for a, b in zip(dense_model.state_dict().values(), sparse_model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ray_source_gives_the_same_loss_curve(tiny_targets, tiny_target_dirs, data, tmp_path):
    ray = pytest.importorskip("ray", reason="ray: install dspark[ray]")  # .ci/run installs it
    from dspark.training.ray_source import RaySource

    target = tiny_targets["qwen3"]
    examples = load_examples(data, max_len=256)

    def run(kind, out):
        torch.manual_seed(0)
        model = untrained_drafter(target, markov_rank=32)
        aux = model.config.aux_hidden_state_layer_ids
        if kind == "ray":
            source = RaySource(
                tiny_target_dirs["qwen3"], data, aux, seed=0, max_len=256, num_workers=2, num_cpus_per_worker=0.5
            )
        else:
            source = InProcessSource(target, examples, aux, seed=0)
        Trainer(model, source, TrainConfig(steps=6, **CFG), out, progress=False).train()
        return losses(out)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        torch.testing.assert_close(torch.tensor(run("ray", tmp_path / "r")), torch.tensor(run("local", tmp_path / "l")))
    finally:
        ray.shutdown()


def test_eagle3_peer_trains_with_the_same_pipeline(tiny_targets, data, tmp_path):
    """The EAGLE-3 peer goes through the same trainer, data and loss, and learns to draft."""
    from dspark.decoding import Eagle3Drafter
    from dspark.formats.checkpoint import init_drafter, load_drafter
    from dspark.model.eagle3 import Eagle3Config
    from dspark.model.pairing import config_for_target

    target = tiny_targets["qwen3"]
    config = Eagle3Config.like(config_for_target(target), speculative_steps=7)
    model = init_drafter(target, config)
    aux = config.aux_hidden_state_layer_ids
    prompt = target.tokenizer("the answer for")["input_ids"]

    def decode(m):
        drafter = Eagle3Drafter(m, target_vocab_size=target.vocab_size)
        return SpeculativeEngine(target, drafter, num_speculative_tokens=7).generate(
            prompt, max_new_tokens=48, stop_token_ids=set()
        )

    before = decode(model)
    source = InProcessSource(target, load_examples(data), aux, seed=0)
    Trainer(model, source, TrainConfig(steps=200, **CFG), tmp_path, progress=False).train()
    after = decode(load_drafter(tmp_path / "final"))
    plain = SpeculativeEngine(target).generate(prompt, max_new_tokens=48, stop_token_ids=set())
    assert after.tokens == plain.tokens
    assert after.accept_len > before.accept_len + 0.5, (before.accept_len, after.accept_len)
    first = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert first[-1]["loss"] < first[0]["loss"]


def test_evaluate_cli_reports_teacher_forced_acceptance(tiny_targets, tiny_target_dirs, data, tmp_path):
    from typer.testing import CliRunner

    from dspark.cli import app

    runner = CliRunner()
    target_dir = tiny_target_dirs["qwen3"]
    base = ["evaluate", "--target", str(target_dir), "--data", str(data), "--rows", "6", "--anchors", "8"]
    draft = tmp_path / "draft"
    assert runner.invoke(app, ["init", "--target", str(target_dir), "--out", str(draft)]).exit_code == 0
    result = runner.invoke(app, [*base, "--draft", str(draft), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sequences"] == 6 and report["blocks"] > 0 and report["n"] == 7
    survive = report["per_position_acceptance"]
    assert report["sim_accept_len"] == pytest.approx(1.0 + sum(survive))
    assert all(a >= b for a, b in itertools.pairwise(survive))  # a slot survives only if the one before did
    assert all(s <= m + 1e-9 for s, m in zip(survive, report["per_position_match"], strict=True))
    # The same figure as the library call on the same rows and seed.
    model_report = simulated_accept_len(
        load_drafter(
            draft,
            target_embedding=tiny_targets["qwen3"].embedding_weight(),
            target_lm_head=tiny_targets["qwen3"].lm_head_weight(),
        ),
        tiny_targets["qwen3"],
        load_examples(data, max_len=512)[:6],
        max_anchors=8,
        num_drafts=7,
    )
    assert model_report["sim_accept_len"] == pytest.approx(report["sim_accept_len"], abs=1e-4)

    short = runner.invoke(app, [*base, "--draft", str(draft), "--n", "3", "--json"])
    assert short.exit_code == 0, short.output
    short_report = json.loads(short.stdout.strip().splitlines()[-1])
    assert short_report["per_position_acceptance"] == pytest.approx(survive[:3])  # same blocks, first 3 slots

    other = tmp_path / "draft-r0"
    assert (
        runner.invoke(app, ["init", "--target", str(target_dir), "--out", str(other), "--markov-rank", "0"]).exit_code
        == 0
    )
    both = runner.invoke(app, [*base, "--draft", str(draft), "--draft", str(other), "--json"])
    assert both.exit_code == 0, both.output
    pair = json.loads(both.stdout.strip().splitlines()[-1])
    assert [r["draft"] for r in pair] == [str(draft), str(other)]
    assert pair[0]["sim_accept_len"] == pytest.approx(report["sim_accept_len"])  # one target run, same blocks

    skipped = runner.invoke(app, [*base, "--draft", str(draft), "--skip", "20"])
    assert skipped.exit_code == 2 and "no rows left after --skip 20" in skipped.output

    eagle = tmp_path / "eagle"
    init = runner.invoke(app, ["init", "--target", str(target_dir), "--out", str(eagle), "--method", "eagle3"])
    assert init.exit_code == 0, init.output
    chains = runner.invoke(app, [*base, "--draft", str(eagle), "--json"])  # EAGLE-3: unrolled chains
    assert chains.exit_code == 0, chains.output
    eagle_report = json.loads(chains.stdout.strip().splitlines()[-1])
    assert eagle_report["blocks"] > 0 and len(eagle_report["per_position_acceptance"]) == 7
    assert eagle_report["sim_accept_len"] == pytest.approx(1.0 + sum(eagle_report["per_position_acceptance"]))


def test_datagen_resumes_after_a_cut_off_last_line(tiny_targets, data, tmp_path):
    """A kill mid-write leaves half a row; resuming drops it, regenerates that prompt, and
    leaves a file every line of which parses (training would refuse a glued line)."""
    path = tmp_path / "cut.jsonl"
    full = data.read_bytes()
    path.write_bytes(full[: len(full) - 25])  # the last row loses its end and newline
    prompts = [" ".join(WORDS[i : i + 3]) for i in range(20)]
    assert self_distill(tiny_targets["qwen3"], prompts, path, max_new_tokens=48, progress=False) == 1
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(20))
    assert path.read_bytes() == full  # greedy: the regenerated row is the one that was cut
    assert len(load_examples(path)) == 20


def test_recipe_continues_from_a_drafter_saved_without_embeddings(tiny_targets, tmp_path):
    """`drafter: {path: DIR}` starts training from a saved drafter (our run directories store no
    copy of the target's embedding), with the trained weights intact and the frozen ones from
    the target; init options beside `path` are refused, not ignored."""
    from dspark.errors import ConfigError
    from dspark.formats.checkpoint import save_drafter
    from dspark.training.recipe import Recipe, build_model

    target = tiny_targets["qwen3"]
    model = untrained_drafter(target)
    with torch.no_grad():
        model.fc.weight.add_(0.5)  # not what a fresh init gives
    save_drafter(model, tmp_path / "saved", include_embeddings=False)
    recipe = Recipe(target=tmp_path, data=tmp_path, out=tmp_path / "run", drafter={"path": str(tmp_path / "saved")})
    loaded = build_model(recipe, target)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name].float(), tensor.float()), name
    trainable = {n for n, p in loaded.named_parameters() if p.requires_grad}
    assert "fc.weight" in trainable and "embed_tokens.weight" not in trainable
    recipe.drafter = {"path": str(tmp_path / "saved"), "markov_rank": 256}
    with pytest.raises(ConfigError, match="markov_rank"):
        build_model(recipe, target)
    recipe.drafter = {"path": str(tmp_path / "saved"), "method": "eagle3"}
    with pytest.raises(ConfigError, match="eagle3"):
        build_model(recipe, target)


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_bf16_autocast_training_tracks_fp32(tiny_targets, data, tmp_path, kind):
    """`autocast_bf16` (the shipped recipes' setting) gives the fp32 loss curve within bf16
    noise for every drafter kind, and the loss still falls."""
    from dspark.formats.checkpoint import init_drafter
    from dspark.model.eagle3 import Eagle3Config
    from dspark.model.pairing import config_for_target

    target = tiny_targets["qwen3"]
    if kind == "eagle3":
        config = Eagle3Config.like(config_for_target(target), speculative_steps=7)
    else:
        rank = 32 if kind == "dspark" else 0
        config = config_for_target(target, markov_rank=rank, enable_confidence_head=kind == "dspark")
    aux = config.aux_hidden_state_layer_ids

    def run(bf16: bool, out):
        model = init_drafter(target, config)
        source = InProcessSource(target, load_examples(data), aux, seed=0)
        cfg = TrainConfig(steps=30, autocast_bf16=bf16, **CFG)
        Trainer(model, source, cfg, out, progress=False).train()
        return torch.tensor(losses(out))

    fp32, bf16 = run(False, tmp_path / "fp32"), run(True, tmp_path / "bf16")
    assert torch.isfinite(bf16).all()
    torch.testing.assert_close(bf16, fp32, rtol=0.05, atol=0.05)
    assert bf16[-5:].mean() < 0.92 * bf16[:5].mean()


def test_feature_cache_workers_bf16_target_and_prefix_limit(tiny_targets, tiny_target_dirs, data, tmp_path):
    """Two worker processes write the same shards as one process; a bf16 target is recorded
    in the manifest and refused against an fp32 cache; `limit` trains on a prefix."""
    from dspark.errors import DSparkError
    from dspark.target import TargetModel
    from dspark.training.feature_cache import OfflineSource, build_feature_cache

    target = tiny_targets["qwen3"]
    examples = load_examples(data, max_len=256)
    aux = untrained_drafter(target).config.aux_hidden_state_layer_ids
    one = build_feature_cache(target, examples, aux, tmp_path / "one", shard_size=6, progress=False)
    two = build_feature_cache(
        target,
        examples,
        aux,
        tmp_path / "two",
        shard_size=6,
        progress=False,
        workers=2,
        target_dir=tiny_target_dirs["qwen3"],
        data=data,
        max_len=256,
    )
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert m1 == m2 and m1["target_dtype"] == "float32" and len(m1["shards"]) == 4

    half = TargetModel.from_pretrained(tiny_target_dirs["qwen3"], dtype=torch.bfloat16)
    with pytest.raises(DSparkError, match="target_dtype"):
        build_feature_cache(half, examples, aux, one, shard_size=6, progress=False)
    bf = build_feature_cache(half, examples, aux, tmp_path / "bf16", shard_size=6, progress=False)
    assert json.loads((bf / "manifest.json").read_text())["target_dtype"] == "bfloat16"

    source = OfflineSource(one, aux, seed=0, limit=7)
    seen = {int(b.input_ids.sum()) for b in source.batches(0, 21)}
    assert seen == {int(e.input_ids.sum()) for e in examples[:7]}
    with pytest.raises(DSparkError, match="first 99 examples"):
        OfflineSource(one, aux, seed=0, limit=99)


def test_saved_examples_read_back_the_same(data, tmp_path):
    examples = load_examples(data)[:5]
    again = load_examples(save_examples(examples, tmp_path / "subset.jsonl"))
    assert len(again) == 5
    for a, b in zip(examples, again, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)


def test_train_sources_bench_trains_the_same_rows_from_every_source(tiny_target_dirs, data, tmp_path):
    """The throughput bench's sources feed the same rows in the same order: one and two online
    workers and the in-process target end at the same loss (bf16 features computed alike)."""
    from dspark.bench.train_sources import run

    report = run(
        tiny_target_dirs["qwen3"],
        data,
        tmp_path / "sources.json",
        steps=4,
        examples=6,
        seq_len=256,
        max_anchors=16,
        draft_vocab=64,
        mask_token_id=None,
        seed=0,
        sources=("online", "inprocess"),
        workers=(1, 2),
        target_dtype="bfloat16",
        rounds=1,
    )
    got = report["sources"]
    assert list(got) == ["online", "online-x2", "inprocess"]
    assert got["online"]["final_loss"] == got["online-x2"]["final_loss"]
    assert got["online"]["final_loss"] == pytest.approx(got["inprocess"]["final_loss"], rel=1e-3)
    assert json.loads((tmp_path / "sources.json").read_text())["provenance"]["target_dtype"] == "bfloat16"


def test_status_line_rates_the_steps_since_the_previous_line(tmp_path, capsys, monkeypatch):
    # A pause before one line must not slow the next line's rate or its time left.
    trainer = Trainer.__new__(Trainer)
    trainer.out, trainer.step = tmp_path / "run-x", 1000
    clock = iter([1400.0, 1500.0])  # 400 s for steps 0-1000 (a pause in it), then 100 s for 1000-2000
    monkeypatch.setattr("dspark.training.trainer.time.perf_counter", lambda: next(clock))
    since = trainer._status_line({"loss": 1.0}, 3000, (1000.0, 0))
    trainer.step = 2000
    trainer._status_line({}, 3000, since)
    first, second = capsys.readouterr().err.strip().splitlines()
    assert "0.400 s/step, 0h13m left" in first  # 2000 steps at 0.4 s
    assert "step 2000/3000" in second and "0.100 s/step, 0h01m left" in second  # not 0.25 (since the start)
