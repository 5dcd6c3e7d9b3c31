"""Training layout: anchors, the block attention mask (vs a slow loop), and train/inference parity."""

import torch
from helpers import untrained_drafter

from dspark.training.blocks import block_attention_mask, block_targets, sample_anchors
from dspark.training.forward import block_forward
from dspark.training.losses import LossWeights, dspark_loss


def slow_mask(anchors, doc, block):
    n, t = len(anchors), len(doc)
    mask = torch.zeros(n * block, t + n * block, dtype=torch.bool)
    for j, p in enumerate(anchors.tolist()):
        for s in range(block):
            q = j * block + s
            for c in range(t):
                mask[q, c] = c < p and doc[c] == doc[p]
            for s2 in range(block):
                mask[q, t + j * block + s2] = True
    return mask


def test_mask_matches_slow_reference():
    doc = torch.tensor([0] * 9 + [1] * 7)
    anchors = torch.tensor([2, 5, 9, 11])
    assert torch.equal(block_attention_mask(anchors, doc, 4), slow_mask(anchors, doc, 4))


def test_anchors_have_room_and_stay_in_their_document():
    loss = torch.tensor([0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    doc = torch.tensor([0] * 8 + [1] * 8)
    anchors = sample_anchors(loss, doc, 100, 3)
    for p in anchors.tolist():
        assert loss[p + 1] and p + 3 <= 15 and doc[p + 3] == doc[p]
    assert anchors.tolist() == sorted(anchors.tolist())
    assert len(sample_anchors(loss, doc, 2, 3, torch.Generator().manual_seed(0))) == 2


def test_valid_prefix_is_cumulative():
    ids = torch.arange(10)
    loss = torch.tensor([0, 1, 1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    doc = torch.zeros(10, dtype=torch.long)
    bt = block_targets(torch.tensor([0, 6]), ids, loss, doc, 4)
    assert bt.valid[0].tolist() == [True, True, False, False]  # token 3 is not a loss token
    assert bt.valid[1].tolist() == [True, True, True, False]  # position 10 is past the end
    assert bt.label_ids[1, :3].tolist() == [7, 8, 9]
    assert bt.prev_ids[1, :3].tolist() == [6, 7, 8]
    assert bt.target_rows[1, :3].tolist() == [6, 7, 8]


def test_training_forward_matches_inference_for_every_anchor(tiny_targets):
    """A block in the one-forward training layout equals the same block drafted at inference."""
    target = tiny_targets["qwen3"]
    for sample_from_anchor in (True, False):
        model = untrained_drafter(target, sample_from_anchor=sample_from_anchor)
        t, m = 20, 3 * target.hidden_size
        torch.manual_seed(0)
        aux = torch.randn(t, m)
        ids = torch.randint(5, 300, (t,))
        loss = torch.ones(t, dtype=torch.bool)
        doc = torch.zeros(t, dtype=torch.long)
        anchors = torch.tensor([3, 7, 10])
        with torch.no_grad():
            out = block_forward(model, aux, ids, loss, doc, anchors)
        first = 0 if sample_from_anchor else 1
        for j, p in enumerate(anchors.tolist()):
            ctx = model.project_context(aux[None, :p])
            kv = model.context_kv(ctx, torch.arange(p))
            with torch.no_grad():
                h = model.backbone(model.block_input_ids(ids[p : p + 1]), torch.arange(p, p + 8), kv)[0]
                d = model.config.drafts_per_block
                slots = h[first : first + d]
                ref = model.base_logits(slots)
                prev = ids[p : p + d]
                ref = ref + model.markov_head.block_bias(prev[None], slots[None])[0].float()
            torch.testing.assert_close(out.logits[j], ref, rtol=1e-4, atol=1e-4)


def test_loss_is_zero_tv_when_drafter_equals_target():
    logits = torch.randn(2, 3, 11)
    valid = torch.ones(2, 3, dtype=torch.bool)
    labels = logits.argmax(-1)
    loss, metrics = dspark_loss(logits, logits.clone(), labels, valid, None, LossWeights(ce=0.0, tv=1.0))
    assert float(loss) < 1e-6
    assert float(metrics["sim_accept_len"]) == 4.0
    w = LossWeights(ce=1.0, tv=0.0, gamma=1.0)
    valid[:, 2] = False
    loss, _ = dspark_loss(logits, logits, labels, valid, None, w)
    ce = -torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    expected = (ce[:, 0] + ce[:, 1] * torch.exp(torch.tensor(-1.0))).sum() / (2 * (1 + torch.exp(torch.tensor(-1.0))))
    torch.testing.assert_close(loss, expected)
