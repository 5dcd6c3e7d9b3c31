"""The corpus: shards and manifest, the prompt pool, growth with resume, and the slot decoder
(continuous batching) against Hugging Face generate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dspark.cli import app
from dspark.corpus import Corpus, CorpusError, Row, is_heldout, prompt_key
from dspark.corpus.grow import grow, read_pool
from dspark.corpus.prompts import benchmark_keys, build_pool
from dspark.datasets import load_prompts
from dspark.errors import DSparkError
from dspark.target.prompts import encode_prompt
from dspark.target.slots import SlotDecoder, SlotDecoderUnsupportedError, continuous_generate
from dspark.training.data import load_examples
from dspark.training.datagen import GenerateEngine, SlotEngine, make_engine

runner = CliRunner()
META = {"command": "test", "commit": None, "created_utc": "2026-12-05T00:00:00Z"}


def _row(i: int, n: int = 5) -> Row:
    ids = [i + 1] * 3 + list(range(i, i + n))
    return Row(ids, [0] * 3 + [1] * n, "src", i, prompt_key(f"prompt {i}"), "test-engine")


def test_shards_round_trip_and_refuse_damage(tmp_path):
    corpus = Corpus.create(tmp_path / "c", target="Org/T", tokenizer_sha256="abc")
    first = corpus.append([_row(i) for i in range(3)], **META)
    second = corpus.append([_row(i, n=2 + i) for i in range(3, 5)], **META)
    assert (first["file"], second["file"]) == ("shard-00000.npz", "shard-00001.npz")
    again = Corpus(tmp_path / "c")  # re-read from disk
    assert again.rows == 5 and again.tokens == 3 * 8 + 8 + 9
    rows = list(again.iter_rows())
    assert [r.input_ids for r in rows] == [_row(i).input_ids for i in range(3)] + [
        _row(i, n=2 + i).input_ids for i in range(3, 5)
    ]
    assert [r.loss_mask for r in rows][3] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert {r.engine for r in rows} == {"test-engine"} and rows[4].source_index == 4
    assert second["response_tokens"] == 5 + 6 and first["sources"] == {"src": 3}
    assert len(list(again.iter_rows(limit=4))) == 4
    with pytest.raises(CorpusError, match="repeat a stored"):
        again.append([_row(1)], **META)
    again.verify()
    shard = tmp_path / "c" / "shard-00001.npz"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CorpusError, match="checksum"):
        Corpus(tmp_path / "c").verify()
    with pytest.raises(CorpusError, match="another tokenizer"):
        Corpus.open_or_create(tmp_path / "c", target="Org/Other", tokenizer_sha256="xyz")
    with pytest.raises(CorpusError, match="not a corpus"):
        Corpus(tmp_path / "nothing")
    # Shards hold no pickles: numpy reads them with allow_pickle=False.
    with np.load(tmp_path / "c" / "shard-00000.npz", allow_pickle=False) as data:
        assert data["input_ids"].dtype == np.uint32


def test_pool_drops_benchmarks_and_repeats_and_interleaves():
    bench = load_prompts("gsm8k", 2) + load_prompts("humaneval", 1)
    sources = {"a": ["x1", "x2", "x3", bench[0]], "b": ["y1", "  x1 ", bench[2]], "c": [bench[1]]}
    pool, dropped = build_pool(sources, seed=0)
    assert dropped == {"benchmark": 3, "repeat": 1, "empty": 0}
    assert sorted(r["prompt"] for r in pool) == ["x1", "x2", "x3", "y1"]
    assert {r["source"] for r in pool[:2]} == {"a", "b"}  # round-robin: both sources come first
    for r in pool:
        assert sources[r["source"]][r["source_index"]] == r["prompt"]
    # The benchmark keys cover every spec_bench turn, not only the first.
    from dspark.datasets import read_rows

    second_turn = read_rows("spec_bench")[0]["turns"][1]
    assert prompt_key(second_turn) in benchmark_keys()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_slot_decoder_greedy_equals_generate(tiny_targets, arch):
    """Continuous batching, mixed prompt lengths, stops and refills: every row equals the
    target's own greedy generate of that prompt alone."""
    target = tiny_targets[arch]
    tok = target.tokenizer
    texts = ["def add(a, b):", "hello", "x = [1, 2, 3]\nfor", "print(", "a b a b", "import os\n", "1 + 1 ="]
    prompts = [tok(t)["input_ids"] for t in texts]
    stops = {int(tok.eos_token_id)} | {prompts[0][-1]}  # a stop that some rows hit early
    decoder = SlotDecoder(target.model, slots=3, max_len=64)
    decoder.check()
    got = dict(continuous_generate(decoder, prompts, max_new_tokens=20, stop_ids=stops))
    assert sorted(got) == list(range(len(prompts)))
    pad = tok.pad_token_id
    for i, ids in enumerate(prompts):
        ref = target.model.generate(
            input_ids=torch.tensor([ids]),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(stops),
        )[0, len(ids) :].tolist()
        while ref and ref[-1] == pad and pad not in stops:
            ref.pop()
        assert got[i] == ref, (arch, i)


def test_slot_decoder_reuses_a_shared_prefix_exactly(tiny_targets):
    """Prompts sharing a prefix (a chat template's system turn): its cache is computed once
    and copied; each answer still equals generate's."""
    from dspark.target.slots import shared_prefix

    target = tiny_targets["qwen3"]
    tok = target.tokenizer
    head = "system: you are a careful helper who writes python code.\nuser: "
    prompts = [tok(head + t)["input_ids"] for t in ("add two numbers", "print hello", "sort a list", "x")]
    prefix = shared_prefix(prompts)
    assert len(prefix) >= 8 and all(p[: len(prefix)] == prefix for p in prompts)
    decoder = SlotDecoder(target.model, slots=2, max_len=128)
    got = dict(continuous_generate(decoder, prompts, max_new_tokens=16, stop_ids=set()))
    assert decoder._prefix == prefix
    for i, ids in enumerate(prompts):
        ref = target.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=16, do_sample=False)
        assert got[i] == ref[0, len(ids) :].tolist(), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_prefill_equals_prefills_one_by_one(tiny_targets, dtype):
    """`prefill_many` (the prompts' rows in one product) leaves every slot's cache and first
    logits as `prefill` does, with a shared prefix copied or not: bit for bit in bf16 (a
    row's bits do not depend on a product's row count there); in float32 a many-row product
    may sum in another order, so to rounding."""
    import copy

    from dspark.target.slots import shared_prefix

    model = copy.deepcopy(tiny_targets["qwen3"].model).to(dtype)
    tok = tiny_targets["qwen3"].tokenizer
    head = "system: you are a careful helper.\nuser: "
    prompts = [tok(head + t)["input_ids"] for t in ("add two numbers", "x", "sort a list of words by length")]
    prompts.append(tok("no shared head here")["input_ids"])
    one, packed = (SlotDecoder(model, slots=6, max_len=96) for _ in range(2))
    for decoder in (one, packed):
        decoder.set_prefix(shared_prefix(prompts[:3]))
    slots = [4, 0, 2, 5]  # any slots, any order
    expected = torch.stack([one.prefill(s, ids) for s, ids in zip(slots, prompts, strict=True)])
    got = packed.prefill_many(slots, prompts)

    def same(a, b):
        return torch.equal(a, b) if dtype == torch.bfloat16 else torch.allclose(a, b, rtol=1e-4, atol=1e-5)

    assert same(got, expected) and torch.equal(got.argmax(-1), expected.argmax(-1))
    assert torch.equal(one.lengths, packed.lengths) and packed.alloc == one.alloc
    for i in range(len(one.layers)):
        for s, ids in zip(slots, prompts, strict=True):
            assert same(one.k[i][s, :, : len(ids)], packed.k[i][s, :, : len(ids)])
            assert same(one.v[i][s, :, : len(ids)], packed.v[i][s, :, : len(ids)])
    with pytest.raises(ValueError, match="twice"):
        packed.prefill_many([1, 1], prompts[:2])


def test_slot_sampling_is_per_prompt_and_reproducible(tiny_targets):
    target = tiny_targets["qwen3"]
    prompts = [target.tokenizer(t)["input_ids"] for t in ("a", "b c", "def f(")]

    def run(slots):
        dec = SlotDecoder(target.model, slots=slots, max_len=40)
        return dict(continuous_generate(dec, prompts, max_new_tokens=12, stop_ids=set(), temperature=1.0, seed=5))

    # Each prompt samples with its own generator: the batch layout does not change a row.
    assert run(1) == run(3)


def test_slot_decoder_refuses_what_it_cannot_reproduce(tiny_targets):
    with pytest.raises(SlotDecoderUnsupportedError):
        SlotDecoder(tiny_targets["deepseek_v3"].model, slots=2, max_len=16).check()
    engine = make_engine("auto", tiny_targets["deepseek_v3"], max_new_tokens=8, log=lambda m: None)
    assert isinstance(engine, GenerateEngine) and engine.kind == "generate"
    assert isinstance(make_engine("auto", tiny_targets["llama"], slots=2, max_new_tokens=8), SlotEngine)


def test_grow_packs_shards_resumes_and_trains(tiny_targets, tiny_target_dirs, tmp_path):
    target = tiny_targets["llama"]
    pool_path = tmp_path / "pool.jsonl"
    texts = [f"prompt number {i}" for i in range(9)] + ["a line\u2028separator"]  # not a JSONL line break
    pool_path.write_text(
        "".join(
            json.dumps({"prompt": t, "source": "s", "source_index": i}, ensure_ascii=False) + "\n"
            for i, t in enumerate(texts)
        )
    )
    pool = read_pool(pool_path)
    corpus = Corpus.create(tmp_path / "c", target="tiny", tokenizer_sha256="t")
    engine = make_engine("slots", target, slots=3, max_new_tokens=12, max_prompt_len=32)
    work = tmp_path / "work.jsonl"
    counts = grow(corpus, pool, engine, work=work, limit=7, shard_rows=3, meta=lambda: META, progress=False)
    assert counts["answered"] == 7 and counts["packed"] == 7
    assert [s["rows"] for s in corpus.shards] == [3, 3, 1] and work.read_text() == ""
    # A killed run leaves answers in the work file: the next run packs them, answers the rest once.
    stray = {
        "key": prompt_key(texts[7]),
        "source": "s",
        "source_index": 7,
        "input_ids": [1, 2, 3],
        "loss_mask": [0, 1, 1],
        "engine": "e",
    }
    work.write_text(json.dumps(stray) + "\n" + '{"key": "half a ro')
    counts = grow(corpus, pool, engine, work=work, limit=None, shard_rows=100, meta=lambda: META, progress=False)
    assert counts["answered"] == 2 and corpus.rows == 10
    assert sorted(r.source_index for r in corpus.iter_rows()) == list(range(10))
    assert (
        grow(corpus, pool, engine, work=work, limit=None, shard_rows=3, meta=lambda: META, progress=False)["answered"]
        == 0
    )
    # Each stored row is the prompt's encoding followed by the engine's greedy answer.
    by_index = {r.source_index: r for r in corpus.iter_rows()}
    ids = encode_prompt(target.tokenizer, texts[2])
    assert by_index[2].input_ids[: len(ids)] == ids and by_index[2].loss_mask[: len(ids)] == [0] * len(ids)
    assert by_index[2].engine == "dspark-slots/float32"
    assert len(load_examples(tmp_path / "c")) == 10  # training reads the corpus directly
    out = tmp_path / "rows.jsonl"
    result = runner.invoke(
        app, ["corpus", "export", str(tmp_path / "c"), "--out", str(out), "--rows", "5", "--seed", "1"]
    )
    assert result.exit_code == 0, result.output
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["input_ids"] for e in exported] == [r.input_ids for r in corpus.select("all", 5, seed=1)]
    assert [r.input_ids for r in corpus.select("all", 5, seed=1)] != [r.input_ids for r in corpus.select("all", 5)]
    # train and heldout split every row between them, by the prompt alone.
    train, held = corpus.select("train"), corpus.select("heldout")
    assert len(train) + len(held) == 10 and not {r.prompt_key for r in train} & {r.prompt_key for r in held}
    assert all(is_heldout(r.prompt_key) for r in held)
    bad = runner.invoke(app, ["corpus", "export", str(tmp_path / "c"), "--out", str(tmp_path / "x"), "--split", "dev"])
    assert bad.exit_code == 2 and "split 'dev'" in bad.output
    status = runner.invoke(app, ["corpus", "status", str(tmp_path / "c"), "--verify", "--json"])
    assert status.exit_code == 0 and json.loads(status.output.splitlines()[0])["rows"] == 10


def test_multi_turn_and_magpie_sources(tiny_target_dirs, tiny_targets, tmp_path):
    from transformers import AutoTokenizer

    from dspark.corpus.prompts import followup_prompts, magpie_prefix, magpie_prompts
    from dspark.datasets import read_rows

    tok = AutoTokenizer.from_pretrained(tiny_target_dirs["qwen3"])
    corpus = Corpus.create(tmp_path / "c", target="tiny", tokenizer_sha256="t")
    answer = tok("the answer is 4")["input_ids"]
    rows = [
        Row([5, 6, *answer], [0, 0] + [1] * len(answer), "sharegpt", 1, prompt_key("q1"), "e"),
        Row([5, 7, 8], [0, 0, 1], "sharegpt", 0, prompt_key("q0"), "e"),  # its conversation has one turn
        Row([5, 7, 9], [0, 0, 1], "gsm8k_train", 1, prompt_key("g1"), "e"),
    ]
    corpus.append(rows, **META)
    conversations = [["only turn"], ["what is 2+2?", "and times 3?"]]
    prompts, indices = followup_prompts(corpus, conversations, tok)
    assert indices == [1]
    assert prompts == [
        [
            {"role": "user", "content": "what is 2+2?"},
            {"role": "assistant", "content": "the answer is 4"},
            {"role": "user", "content": "and times 3?"},
        ]
    ]
    # A follow-up whose second turn is a benchmark prompt (MT-Bench's second turns) is dropped;
    # a dict source keeps its own indices.
    mt_turn2 = read_rows("spec_bench")[0]["turns"][1]
    bad = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": mt_turn2},
    ]
    pool, dropped = build_pool({"turn2": {7: prompts[0], 9: bad}})
    assert dropped["benchmark"] == 1 and pool == [{"prompt": prompts[0], "source": "turn2", "source_index": 7}]

    # Magpie: the template's prefix up to the user's message; the target samples turns itself.
    from dspark.interop.tiny_targets import with_chat_template

    chat_tok = AutoTokenizer.from_pretrained(with_chat_template(tiny_target_dirs["qwen3"], tmp_path / "chat"))
    assert magpie_prefix(chat_tok) == [chat_tok.eos_token_id]
    target = tiny_targets["qwen3"]
    target.tokenizer, saved = chat_tok, target.tokenizer
    try:
        engine = make_engine("slots", target, slots=4, max_new_tokens=24, temperature=1.0, seed=3)
        made = magpie_prompts(engine, 8, min_chars=1)
        # Openings steer the turns: each row begins with its opening, the target writes the rest.
        starts = ["def sort", "Write a class"]
        steered = magpie_prompts(engine, 6, starts=starts, min_chars=1)
    finally:
        target.tokenizer = saved
    assert 1 <= len(made) <= 8 and len(set(made)) == len(made)
    assert steered and all(t.startswith(tuple(starts)) for t in steered)
    assert {t.startswith("def sort") for t in steered} == {True, False}  # rows take the openings in turn
    with pytest.raises(DSparkError, match="chat template"):
        magpie_prefix(tok)


def test_datagen_cli_engines_agree_in_fp32(tiny_target_dirs, tmp_path):
    """`dspark datagen` with continuous batching writes the rows `generate` writes (fp32 greedy)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("def f(x):", "hello", "a b c", "import")))
    outs = {}
    for engine in ("slots", "generate"):
        out = tmp_path / f"{engine}.jsonl"
        args = ["datagen", "--prompts", str(prompts), "--out", str(out), "--target", str(tiny_target_dirs["llama"])]
        result = runner.invoke(
            app,
            [
                *args,
                "--engine",
                engine,
                "--max-new-tokens",
                "12",
                "--slots",
                "3",
                "--batch-size",
                "2",
                "--dtype",
                "float32",
            ],
        )
        assert result.exit_code == 0, result.output
        outs[engine] = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    assert [r["input_ids"] for r in outs["slots"]] == [r["input_ids"] for r in outs["generate"]]
    assert {r["engine"] for r in outs["slots"]} == {"dspark-slots/float32"}
    assert {r["engine"] for r in outs["generate"]} == {"dspark-generate/float32"}


def test_the_shipped_corpus_verifies_and_holds_no_benchmark_prompt():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "corpus"
    corpora = [p.parent for p in root.glob("*/manifest.json")]
    assert corpora, "the repo ships a corpus"
    bench = benchmark_keys()
    for directory in corpora:
        corpus = Corpus(directory)
        corpus.verify()
        keys = corpus.keys()
        assert len(keys) == corpus.rows  # no prompt twice
        assert not keys & bench
        for shard in corpus.shards:
            assert shard["rows"] > 0 and shard["commit"] and shard["engines"]


def test_grow_with_worker_processes_stores_the_same_rows(tiny_targets, tiny_target_dirs, tmp_path):
    from dspark.corpus.grow import Workers

    texts = [f"question {i}: {'x ' * i}" for i in range(9)]
    pool = [{"prompt": t, "source": "s", "source_index": i} for i, t in enumerate(texts)]
    kwargs = {"slots": 2, "max_new_tokens": 10, "max_prompt_len": 48}
    alone = Corpus.create(tmp_path / "alone", target="tiny", tokenizer_sha256="t")
    engine = make_engine("slots", tiny_targets["llama"], **kwargs)
    grow(alone, pool, engine, work=tmp_path / "w1.jsonl", limit=None, shard_rows=4, meta=lambda: META, progress=False)
    shared = Corpus.create(tmp_path / "shared", target="tiny", tokenizer_sha256="t")
    spec = Workers(str(tiny_target_dirs["llama"]), "float32", count=2, threads=1, kind="slots", engine_kwargs=kwargs)
    counts = grow(
        shared,
        pool,
        spec,
        work=tmp_path / "w2.jsonl",
        limit=None,
        shard_rows=4,
        meta=lambda: META,
        tokenizer=tiny_targets["llama"].tokenizer,
        max_prompt_len=48,
        progress=False,
    )
    assert counts["answered"] == 9 and shared.rows == 9
    assert {r.prompt_key: r.input_ids for r in shared.iter_rows()} == {
        r.prompt_key: r.input_ids for r in alone.iter_rows()
    }
    assert {r.engine for r in shared.iter_rows()} == {"dspark-slots/float32"}


def test_server_engine_names_a_server_without_token_ids():
    """A server that answers text only is refused by name (no silent re-tokenization)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dspark.training.datagen import ServerEngine

    class TextOnly(BaseHTTPRequestHandler):
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": "text-only"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            self._send({"choices": [{"text": "hi", "finish_reason": "stop"}]})

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TextOnly)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        engine = ServerEngine(f"http://127.0.0.1:{httpd.server_port}/v1", max_new_tokens=4, concurrency=2)
        assert engine.name == "server/text-only"
        with pytest.raises(DSparkError, match="no token_ids"):
            list(engine.run([[1, 2], [3]]))
    finally:
        httpd.shutdown()
    with pytest.raises(DSparkError, match="no usable answer"):
        ServerEngine("http://127.0.0.1:9/v1", max_new_tokens=4)  # nothing listens there


def test_corpus_bench_compares_engines_on_the_same_prompts(tiny_target_dirs, tmp_path):
    out = tmp_path / "bench.json"
    engines = "generate/float32/2,slots/float32/3,slots/float32/2x2"
    args = ["corpus", "bench", "--engines", engines, "--rows", "5", "--max-new-tokens", "8"]
    result = runner.invoke(app, [*args, "--target", str(tiny_target_dirs["llama"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Each" not in result.output and "identical:" in result.output  # the table's legend
    report = json.loads(out.read_text())
    rows = {r["spec"]: r for r in report["rows"]}
    assert set(rows) == {"generate/float32/2", "slots/float32/3", "slots/float32/2x2"}
    assert rows["generate/float32/2"]["reference"] and report["provenance"]["commit"]
    for spec in ("slots/float32/3", "slots/float32/2x2"):  # fp32: the same greedy answers
        assert rows[spec]["identical_to_reference"] == 5 and rows[spec]["token_agreement"] == 1.0
    assert rows["slots/float32/2x2"]["workers"] == 2
    bad = runner.invoke(app, ["corpus", "bench", "--engines", "slots/float16/2"])
    assert bad.exit_code == 2 and "KIND/DTYPE/N" in bad.output


def test_an_auto_engine_runs_and_is_labelled_in_the_dtype_this_cpu_computes_natively(monkeypatch):
    import dspark.devices
    from dspark.bench.datagen import parse_engines

    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(dspark.devices, "native_bfloat16", lambda device, native=native: native)
        (spec,) = parse_engines("slots/auto/64x2")
        assert (spec.dtype, spec.label) == (dtype, f"slots/{dtype}/64x2")


def test_a_crash_after_a_shard_keeps_the_later_answers_in_the_work_file(tiny_targets, tmp_path):
    """Answers given after a shard was packed are on disk: a crash loses none of them."""
    target = tiny_targets["llama"]
    pool = [{"prompt": f"item {i} " * (1 + i % 3), "source": "s", "source_index": i} for i in range(8)]
    corpus = Corpus.create(tmp_path / "c", target="tiny", tokenizer_sha256="t")
    engine = make_engine("slots", target, slots=2, max_new_tokens=6, max_prompt_len=40)

    class Crashing:
        """The engine, dying after its fifth answer."""

        name, target, given = engine.name, engine.target, 0

        def run(self, prompts):
            for answer in engine.run(prompts):
                if self.given == 5:
                    raise RuntimeError("machine lost")
                self.given += 1
                yield answer

    work = tmp_path / "work.jsonl"
    with pytest.raises(RuntimeError, match="machine lost"):
        grow(corpus, pool, Crashing(), work=work, limit=None, shard_rows=3, meta=lambda: META, progress=False)
    assert corpus.rows == 3  # one shard packed before the crash
    assert len(work.read_text().splitlines()) == 2  # the two answers after it
    grow(corpus, pool, engine, work=work, limit=None, shard_rows=3, meta=lambda: META, progress=False)
    assert corpus.rows == 8 and sorted(r.source_index for r in corpus.iter_rows()) == list(range(8))


def test_ctrl_c_packs_the_answers_so_far_and_says_it_stopped(tiny_targets, tmp_path):
    engine = make_engine("slots", tiny_targets["llama"], slots=2, max_new_tokens=5, max_prompt_len=40)

    class Interrupted:
        name, target = engine.name, engine.target

        def run(self, prompts):
            yield next(iter(engine.run(prompts)))
            raise KeyboardInterrupt

    corpus = Corpus.create(tmp_path / "c", target="tiny", tokenizer_sha256="t")
    pool = [{"prompt": f"p{i}", "source": "s", "source_index": i} for i in range(4)]
    counts = grow(
        corpus,
        pool,
        Interrupted(),
        work=tmp_path / "w.jsonl",
        limit=None,
        shard_rows=10,
        meta=lambda: META,
        progress=False,
        log=lambda m: None,
    )
    assert counts["stopped"] is True and counts["packed"] == 1 and corpus.rows == 1
    done = grow(
        corpus, pool, engine, work=tmp_path / "w.jsonl", limit=None, shard_rows=10, meta=lambda: META, progress=False
    )
    assert done["stopped"] is False and corpus.rows == 4


def test_merge_adds_only_new_prompts_and_refuses_another_tokenizer(tmp_path):
    ours = Corpus.create(tmp_path / "ours", target="tiny", tokenizer_sha256="t")
    ours.append([_row(i) for i in range(3)], **META)
    part = Corpus.create(tmp_path / "part", target="tiny", tokenizer_sha256="t")
    part.append([_row(i) for i in range(2, 7)], **META)  # row 2 is stored already
    counts = ours.merge(part, shard_rows=2, **META)
    assert counts == {"offered": 5, "added": 4, "already_stored": 1, "shards": 2}
    assert sorted(r.source_index for r in ours.iter_rows()) == list(range(7)) and part.rows == 5
    ours.verify()
    other = Corpus.create(tmp_path / "other", target="big", tokenizer_sha256="u")
    other.append([_row(9)], **META)
    with pytest.raises(CorpusError, match="another tokenizer"):
        ours.merge(other, shard_rows=10, **META)
    with pytest.raises(CorpusError, match="into itself"):
        ours.merge(Corpus(tmp_path / "ours"), shard_rows=10, **META)
    (part.dir / part.shards[0]["file"]).write_bytes(b"damaged")
    with pytest.raises(CorpusError, match="checksum"):
        ours.merge(part, shard_rows=10, **META)


def test_grow_refuses_a_device_it_cannot_use_and_an_exclude_of_another_tokenizer(tiny_target_dirs, tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"prompt": "hi", "source": "s", "source_index": 0}) + "\n")
    args = ["corpus", "grow", "--corpus", str(tmp_path / "c"), "--prompts", str(pool), "--work", str(tmp_path / "w")]
    args += ["--target", str(tiny_target_dirs["llama"]), "--max-new-tokens", "2"]
    if not torch.cuda.is_available():
        bad = runner.invoke(app, [*args, "--device", "cuda"])
        assert bad.exit_code == 2 and "no CUDA device" in bad.output
    other = Corpus.create(tmp_path / "other", target="big", tokenizer_sha256="u")
    bad = runner.invoke(app, [*args, "--exclude", str(other.dir)])
    assert bad.exit_code == 2 and "another tokenizer" in bad.output


def test_slot_cache_grows_and_shrinks_with_the_longest_sequence(tiny_targets):
    """The cache holds a little more than the longest sequence: a long prompt grows it, short
    ones after it shrink it, and decode logits equal the model's own forward throughout."""
    target = tiny_targets["llama"]
    decoder = SlotDecoder(target.model, slots=2, max_len=1024)
    first = decoder.alloc
    g = torch.Generator().manual_seed(0)
    long = torch.randint(5, 300, (560,), generator=g).tolist()
    short = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (30, 41)]

    def decode_and_compare(seqs: list[list[int]]) -> None:
        tokens = torch.tensor([7, 9][: len(seqs)])
        got = decoder.decode(tokens, len(seqs))
        for row, (ids, tok) in enumerate(zip(seqs, tokens.tolist(), strict=True)):
            ref = target.model(input_ids=torch.tensor([[*ids, tok]])).logits[0, -1]
            torch.testing.assert_close(got[row], ref, rtol=1e-4, atol=1e-4)
            ids.append(tok)

    decoder.prefill(0, long)
    decoder.prefill(1, short[0])
    assert decoder.alloc > 512 > first
    decode_and_compare([long, short[0]])
    decoder.prefill(0, short[1])  # the long sequence is gone: the cache shrinks at the next step
    decode_and_compare([short[1], short[0]])
    assert decoder.alloc < 256
    decode_and_compare([short[1], short[0]])


def test_limit_counts_the_prompts_that_fit(tiny_targets, tmp_path):
    """`--limit N` answers N prompts even when the first ones are too long to answer."""
    engine = make_engine("slots", tiny_targets["llama"], slots=2, max_new_tokens=3, max_prompt_len=12)
    pool = [{"prompt": "word " * 40, "source": "s", "source_index": 0}]
    pool += [{"prompt": f"p{i}", "source": "s", "source_index": i} for i in range(1, 5)]
    corpus = Corpus.create(tmp_path / "c", target="tiny", tokenizer_sha256="t")
    notes = []
    counts = grow(
        corpus, pool, engine, work=tmp_path / "w.jsonl", limit=2, shard_rows=10, meta=lambda: META,
        progress=False, log=notes.append,
    )  # fmt: skip
    assert counts["answered"] == 2 and sorted(r.source_index for r in corpus.iter_rows()) == [1, 2]
    assert notes and "1 prompts longer than 12 tokens" in notes[0]
    assert grow(corpus, pool, engine, work=tmp_path / "w.jsonl", limit=0, shard_rows=10, meta=lambda: META,
                progress=False)["answered"] == 0  # fmt: skip
