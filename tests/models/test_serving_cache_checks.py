"""``ServingCache`` refuses misuse before any kernel runs and leaves its state unchanged:
``accept`` with no verify waiting, steps while a verify waits, slots holding no sequence,
out-of-vocabulary token ids, and token / row counts that do not match ``slots``.

Tiny float64 Qwen3-Next model (seeded); the states compared bitwise before and after a refused
call, and the logits of the step after it compared bitwise with a run that never made the call.
"""

import functools

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import INTERPRET

pytest.importorskip("transformers", reason="the models extra needs transformers")

from pmll_lab.models.cache import ServingCache  # noqa: E402
from pmll_lab.models.qwen3_next import build_model, tiny_config  # noqa: E402


@functools.lru_cache(maxsize=None)
def _model():
    return build_model(tiny_config("qwen3_next"), seed=0, dtype=torch.float64)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: tiny matrices on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _ids(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, _model().config.vocab_size, shape, generator=g)


def _snapshot(c: ServingCache) -> list:
    out = [list(c.lengths)]
    for lay in c.gdn:
        out += [lay.state.clone(), lay.conv_state.clone()]
        for carry in (lay.carry, lay.conv_carry):
            if carry is not None:
                out.append(carry.pend.clone())
    for k, v in c.kv.values():
        out += [k.clone(), v.clone()]
    return out


def _same(a: list, b: list) -> bool:
    if a[0] != b[0]:
        return False
    return all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))


def _cache(form: str, slots: int = 1, **kw) -> ServingCache:
    return ServingCache(_model(), slots=slots, max_len=16, form=form, rows=3, **kw)


def test_wy_form_is_refused_naming_the_ring_form():
    """``form="wy"`` is refused by the cache and by ``speculative_generate`` before anything
    runs, with the form named and the tolerance form's module given."""
    from pmll_lab.models.generate import speculative_generate

    msg = r"^form: 'wy' is not a form .*the ring form, pmll_lab\.ops\.carry\.ring\b"
    with pytest.raises(ValueError, match=msg):
        _cache("wy")
    with pytest.raises(ValueError, match=msg):
        speculative_generate(_model(), [[1, 2, 3]], max_new_tokens=2, draft="ngram", K=2,
                             form="wy", state_layout="kv")


@pytest.mark.parametrize("form", ["chain", "exact"])
def test_accept_without_waiting_verify_raises(form):
    prompt, rows, nxt = _ids(1, 3), _ids(2, 1, 3), _ids(3, 1)

    def run(extra: bool):
        c = _cache(form)
        with pytest.raises(ValueError, match=r"^accept: no verify is waiting"):
            c.accept([1])                                   # nothing verified yet
        c.prefill(0, prompt)
        c.verify([0], rows)
        c.accept([2])
        if extra:
            before = _snapshot(c)
            with pytest.raises(ValueError, match=r"^accept: no verify is waiting"):
                c.accept([1])                               # the same verify a second time
            assert _same(before, _snapshot(c))
        return c.decode([0], nxt), c.counts

    ref, ref_counts = run(False)
    got, got_counts = run(True)
    assert torch.equal(got, ref)                  # the refused accept changed nothing
    assert got_counts == ref_counts


@pytest.mark.parametrize("form", ["exact", "chain"])
def test_rejected_accept_leaves_verify_waiting(form):
    p0, p1, rows, nxt = _ids(11, 3), _ids(12, 2), _ids(13, 2, 3), _ids(14, 2)

    def run(reject: bool):
        c = _cache(form, slots=2, lazy_min_seqs=1)
        c.prefill(0, p0)
        c.prefill(1, p1)
        c.verify([0, 1], rows)
        if reject:
            before = _snapshot(c)
            with pytest.raises(ValueError, match=r"^accepted:"):
                c.accept([0, 1])
            msg = r"^{}: the previous verify of slots \[0, 1\] was not accepted; call accept"
            with pytest.raises(ValueError, match=msg.format("verify")):
                c.verify([0, 1], rows)
            with pytest.raises(ValueError, match=msg.format("decode")):
                c.decode([0, 1], nxt)
            with pytest.raises(ValueError, match=msg.format("prefill")):
                c.prefill(0, p0)
            with pytest.raises(ValueError, match=msg.format("release")):
                c.release(1)
            assert _same(before, _snapshot(c))
        c.accept([2, 3])                                    # the waiting verify, accepted
        return c.decode([0, 1], nxt)

    assert torch.equal(run(True), run(False))


def test_slot_without_sequence_raises():
    c = _cache("exact", slots=2)
    c.prefill(0, _ids(21, 3))
    before = _snapshot(c)
    with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[1\] hold no sequence"):
        c.decode([1], _ids(22, 1))                          # never prefilled
    with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[1\] hold no sequence"):
        c.verify([0, 1], _ids(23, 2, 2))
    assert _same(before, _snapshot(c))
    c.release(0)
    before = _snapshot(c)
    with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[0\] hold no sequence"):
        c.decode([0], _ids(24, 1))                          # released
    with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[0\] hold no sequence"):
        c.verify([0], _ids(25, 1, 2))
    with pytest.raises(ValueError, match=r"^slots: expected distinct slots"):
        c.decode([2], _ids(26, 1))
    assert _same(before, _snapshot(c))


def test_out_of_vocabulary_ids_raise():
    V = _model().config.vocab_size
    c = _cache("chain", slots=2)
    with pytest.raises(ValueError, match=r"^ids: token ids .* outside the model's vocabulary"):
        c.prefill(0, torch.tensor([1, V + 743]))
    with pytest.raises(ValueError, match=r"^ids: token ids"):
        c.prefill(0, torch.tensor([-1, 5]))
    assert c.lengths == [0, 0]
    with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[0\] hold no sequence"):
        c.decode([0], _ids(31, 1))                          # the refused prefill left no sequence
    c.prefill(0, _ids(32, 3))
    c.prefill(1, _ids(33, 2))
    before = _snapshot(c)
    with pytest.raises(ValueError, match=r"^tokens: token ids .* vocabulary"):
        c.decode([0, 1], torch.tensor([3, V]))
    with pytest.raises(ValueError, match=r"^rows: token ids .* vocabulary"):
        c.verify([0, 1], torch.tensor([[3, 4], [5, V + 1]]))
    with pytest.raises(ValueError, match=r"^tokens: dtype"):
        c.decode([0, 1], torch.tensor([3.0, 4.0]))
    assert _same(before, _snapshot(c))


def test_token_count_must_match_slots():
    c = _cache("exact", slots=2)
    c.prefill(0, _ids(41, 3))
    c.prefill(1, _ids(42, 2))
    before = _snapshot(c)
    shape = r"expected shape \[len\(slots\)(, K)?\] = "
    with pytest.raises(ValueError, match=r"^tokens: " + shape + r"\(1,\), got \(2,\)"):
        c.decode([0], _ids(43, 2))
    with pytest.raises(ValueError, match=r"^tokens: " + shape + r"\(2,\), got \(2, 1\)"):
        c.decode([0, 1], _ids(44, 2, 1))
    with pytest.raises(ValueError, match=r"^rows: " + shape + r"\(2, K\), got \(1, 3\)"):
        c.verify([0, 1], _ids(45, 1, 3))
    with pytest.raises(ValueError, match=r"^rows: expected shape"):
        c.verify([0], _ids(46, 3))
    assert _same(before, _snapshot(c))


@pytest.mark.parametrize("form", ["exact", "chain"])
def test_prefill_refused_for_max_len_leaves_the_live_slot_as_it_was(form):
    """A prompt longer than ``max_len`` for a slot that holds a running sequence (with carried
    rows pending, in the exact form): refused naming ``max_len``, the cache unchanged, stash
    included, and the sequence's next step equal to a run that never asked."""
    p0, rows, nxt = _ids(51, 3), _ids(52, 1, 3), _ids(53, 1)

    def run(refused: bool):
        c = _cache(form, lazy_min_seqs=1)
        c.prefill(0, p0)
        c.verify([0], rows)
        c.accept([2])
        if refused:
            before = _snapshot(c) + [lay.carry.buf.clone() for lay in c.gdn
                                     if lay.carry is not None]
            with pytest.raises(ValueError, match=r"^max_len: a step needs 17 positions, the "
                                                 r"cache holds 16"):
                c.prefill(0, _ids(54, 17))
            after = _snapshot(c) + [lay.carry.buf.clone() for lay in c.gdn
                                    if lay.carry is not None]
            assert _same(before, after)
        return c.decode([0], nxt)

    assert torch.equal(run(True), run(False))


@pytest.mark.skipif(not INTERPRET, reason="a verify stopped part-way: the Triton interpreter "
                    "runs a kernel's programs one by one (on a GPU the process dies)")
def test_a_verify_stopped_part_way_drops_only_the_sequences_it_may_have_broken(monkeypatch):
    """Ctrl-C inside the first GDN layer's verify of an eager step, after its first program (a
    block of slot 0's state written back): slot 0 (pending rows, a write-back half done) holds
    no sequence afterwards until its next prefill, then runs as new; slot 1 (nothing pending:
    nothing of its state written) decodes on, bitwise as in a run never interrupted."""
    from triton.runtime import interpreter

    from pmll_lab.serving import spec_decode_step

    p0, p1, rows0, rows, nxt = _ids(61, 3), _ids(62, 2), _ids(63, 1, 3), _ids(64, 2, 3), \
        _ids(65, 1)
    real, builder = spec_decode_step.gdn_carry_verify, interpreter.interpreter_builder

    def stopped(*args, **kw):
        ran = []

        def stop(*idx):                          # Ctrl-C once the first program has run
            if ran:
                raise KeyboardInterrupt
            ran.append(idx)
            return run_program(*idx)

        run_program, builder.set_grid_idx = builder.set_grid_idx, stop
        try:
            return real(*args, **kw)
        finally:
            del builder.set_grid_idx

    def run(stop: bool):
        c = _cache("exact", slots=2, lazy_min_seqs=None)
        c.prefill(0, p0)
        c.verify([0], rows0)
        c.accept([2])                                   # slot 0: 2 rows pending
        c.prefill(1, p1)
        if stop:
            monkeypatch.setattr(spec_decode_step, "gdn_carry_verify", stopped)
            with pytest.raises(KeyboardInterrupt):
                c.verify([0, 1], rows)
            monkeypatch.undo()
            with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[0\] hold no sequence"):
                c.decode([0], nxt)
        out = c.decode([1], nxt)
        c.prefill(0, p0)                                # the dropped sequence starts again
        return out, c.decode([0], nxt)

    (got1, got0), (ref1, ref0) = run(True), run(False)
    assert torch.equal(got1, ref1) and torch.equal(got0, ref0)
