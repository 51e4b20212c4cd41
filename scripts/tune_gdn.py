"""Launch settings of the GDN family on the GPU, one subcommand each.

``tiles``: GPU sweep of the GDN family's launch tiles, with a bitwise family check per tile: the V-major
tile (the ``vk_tiles``, ``vk_chunk`` and ``vk_ahead`` settings of ``pmll_lab.ops.settings``)
against the K-major kernels and FLA, and with ``--kv-blocks`` the K-major block (``kv_block``,
``carry_prefetch_rows``) (perf-notes-archive v0, v7, v11, v14; reports/perf-notes.md, "Launch
constants: GDN decode and chain").

For each candidate ``BRxW`` (value rows per program x warps; ``vk_tiles`` overridden with that
one tile):

``default`` runs the library's table (decode and the carry may then use different tiles).

1. family check, bitwise: the K=4 chain with snapshots against 4 V-major decodes (outputs,
   final state, snapshots), and a lazy and an eager exact carry protocol (three verifies,
   accepting 4, 4, 2 rows: the lazy third one writes back) against plain V-major decoding of
   the accepted rows (outputs; the states after a final flush), at each ``--family`` shape
   ``kd:K:dtype``;
2. times at HK=16, HV=32, kd=vd=128, bf16 inputs, fp32 state: decode (K=1), the K=4 chain with
   3 snapshots, the exact carry lazy without write-back (pend 4), with write-back (pend 5),
   eager (pend 3); CUDA-graph replay (median of
   200 replays timed one by one) and do_bench (host launch included) medians, in us, and
   the graph time as a fraction of the copy roofline over SPEC §4 bytes.

The K-major kernels (default config) and FLA's fused_recurrent (K=4, no snapshots) are timed
once as baselines. ``--kv-blocks 32x1,16x1,32x1:nopf`` runs each K-major ``BVxW`` block (``:nopf``:
without the row prefetch) through the same family check in the K-major layout, then the same
timings in that layout. Usage on the H200:  python3 scripts/tune_gdn.py tiles [--tiles 8x1,16x1]
[--B 1,64,128,256] [--json PATH]; ``--smoke`` runs the family check at tiny sizes (CPU).

``carry``: GPU tuning sweep for the carried-state verify: the exact form with and without its column
blocks split across programs (``exact_split_columns``), and FLA over the same K rows, at HV=32,
HK=16, kd=vd=128, bf16 inputs, fp32 state.

For each variant: seeded inputs, a stash holding ``p`` pending rows (p=3: no write-back at K=4;
p=5: write-back, as the lazy form does on ~half of the verifies at a mean accepted length of
3.3), a check before timing (each variant against the per-head exact form, which the tests hold
bitwise equal to plain decoding: outputs rel L2 <= 8e-3 in bf16, stashed u rows <= 1e-4), then the
do_bench median and its fraction of the copy roofline over the fewest bytes (state read once,
written on a write-back, p pending + K new stash rows, inputs and outputs).

Usage on the H200:  python3 scripts/tune_gdn.py carry            (prints a table; ~1 minute)
Smoke test on CPU:  PMLL_LAB_DEVICE=cpu python3 scripts/tune_gdn.py carry --smoke
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)
import torch  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import (bitwise_equal, cli_gpu, cli_ints, cli_out,  # noqa: E402
                            copy_bandwidth, errors, run_subcommand, time_cuda_graph,
                            time_launch)
from pmll_lab.carry import (GdnCarry, carry_accept, gdn_carry_flush,  # noqa: E402
                            gdn_carry_verify)
from pmll_lab.gdn import gdn_chain, gdn_decode, row_io_bytes, state_bytes  # noqa: E402
from pmll_lab.inputs import gdn_inputs, generator  # noqa: E402
from pmll_lab.ops import settings  # noqa: E402
from pmll_lab.peers import fla_available, fla_fused_recurrent, fla_runner  # noqa: E402
from pmll_lab.harness import verify as V  # noqa: E402


DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def rows(x, t0=0, t1=None):
    return [x[n][:, t0:t1] for n in ("q", "k", "v", "g", "beta")]


def vk(state):
    return state.transpose(-1, -2).contiguous()


def check_family(HK, HV, kd, K, dtype, B=8, seed=7, layout="vk"):
    """Bitwise family check in ``layout``; returns what differed (empty: agreed)."""
    bad = []
    x = gdn_inputs(seed, B, HK, HV, kd, kd, rows=K, slots=B + 2, dtype=dtype, state_layout="kv")
    slots = x["state_indices"]
    st0 = vk(x["state"]) if layout == "vk" else x["state"].clone()
    chain = st0.clone()
    inter = torch.empty(B, K - 1, HV, kd, kd, device=DEVICE)
    o = gdn_chain(chain, *rows(x), state_indices=slots, intermediate=inter, state_layout=layout)
    dec = st0.clone()
    for t in range(K):
        o_t = gdn_decode(dec, *[r[:, t] for r in rows(x)], state_indices=slots,
                         state_layout=layout)
        if not bitwise_equal(o[:, t], o_t):
            bad.append(f"chain o row {t}")
        if t < K - 1 and not bitwise_equal(inter[:, t], dec[slots.long()]):
            bad.append(f"chain snapshot {t}")
    if not bitwise_equal(chain, dec):
        bad.append("chain state")
    for lazy in (True, False):
        state, plain = st0.clone(), st0.clone()
        carry = GdnCarry.empty(B + 2, HV, kd, kd, device=DEVICE, state_layout=layout)
        for i, acc in enumerate((K, K, 2)):
            xi = gdn_inputs(seed + 10 + i, B, HK, HV, kd, kd, rows=K, slots=B + 2, dtype=dtype,
                            state_layout="kv")
            o, eng = gdn_carry_verify(state, carry, *rows(xi), slot_tab=slots, form="exact",
                                      lazy=lazy, state_layout=layout)
            for t in range(acc):
                o_t = gdn_decode(plain, *[r[:, t] for r in rows(xi)], state_indices=slots,
                                 state_layout=layout)
                if not bitwise_equal(o[:, t], o_t):
                    bad.append(f"{'lazy' if lazy else 'eager'} verify {i} o row {t}")
            carry_accept(carry, slots, eng, torch.full((B,), acc, dtype=torch.int32,
                                                       device=DEVICE))
        gdn_carry_flush([state], [carry], slots, state_layout=layout)
        if not bitwise_equal(state, plain):
            bad.append(f"{'lazy' if lazy else 'eager'} flushed state")
    return bad


def graph_us(fn, replays=200):
    """Median us of ``replays`` CUDA-graph replays of ``fn`` (``bench.time_cuda_graph``: each
    replay timed with its own events after an L2 flush, as the reports time; without the
    flush the GPU idles between replays and the host's submission enters small B's times)."""
    return time_cuda_graph(fn, replays=replays)["median_us"]


def bench_us(fn):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def fill_stash(carry, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    carry.u.copy_(torch.randn(carry.u.shape, generator=gen) * 0.3)
    carry.g.copy_(-torch.nn.functional.softplus(torch.randn(carry.g.shape, generator=gen)))
    k = torch.randn(carry.k.shape, generator=gen)
    carry.k.copy_(k / k.norm(dim=-1, keepdim=True))


def timings(B, layout, HK=16, HV=32, D=128, K=4, seed=3):
    """{kernel: (graph_us, bench_us, bytes)} at one batch width in one layout."""
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, slots=B, dtype=torch.bfloat16, state_layout="kv")
    slots = x["state_indices"]
    st = x["state"] if layout == "kv" else vk(x["state"])
    hb, io = state_bytes(HV, D, D), row_io_bytes(HK, HV, D, D)
    stash_row = 4 * HV * (2 * D + 1)
    out = {}
    x1 = [r[:, 0].contiguous() for r in rows(x)]
    fns = {DECODE_LABEL: (lambda: gdn_decode(st, *x1, state_indices=slots, state_layout=layout),
                      B * (2 * hb + io))}
    inter = torch.empty(B, K - 1, *st.shape[1:], device=DEVICE)
    fns[V.CHAIN.name] = (lambda: gdn_chain(st, *rows(x), state_indices=slots,
                                           intermediate=inter, state_layout=layout),
                         B * ((K + 1) * hb + K * io))
    carry = GdnCarry.empty(B, HV, D, D, device=DEVICE, state_layout=layout)
    fill_stash(carry, seed)
    for name, form, lazy, pend, wb in ((f"{V.CARRY_LAZY.name}:nowb", "exact", True, 4, False),
                                       (f"{V.CARRY_LAZY.name}:wb", "exact", True, 5, True),
                                       (V.CARRY_EAGER.name, "exact", False, 3, True)):
        def run(form=form, lazy=lazy, pend=pend):
            carry.pend.fill_(pend)
            return gdn_carry_verify(st, carry, *rows(x), slot_tab=slots, form=form, lazy=lazy,
                                    state_layout=layout)
        fns[name] = (run, B * ((2 if wb else 1) * hb + (pend + K) * stash_row + K * io))
    if layout == "kv" and fla_fused_recurrent() is not None:
        q, k, v, g, beta = (t.contiguous() for t in rows(x))
        r, _ = fla_runner(q, k, v, g, beta, st[slots.long()].contiguous(), scale=D ** -0.5)
        fns[V.FLA.name] = (r, B * (2 * hb + K * io))
    for name, (fn, nbytes) in fns.items():
        if KERNELS and name not in KERNELS:
            continue
        try:
            out[name] = (graph_us(fn), bench_us(fn), nbytes)
        except Exception as e:  # noqa: BLE001 - one failed kernel must not lose the sweep
            print(f"  {layout} {name} B={B}: {type(e).__name__}: {e}")
    return out


KERNELS: set[str] = set()
"""Kernels to time (``--kernels``); empty: all."""
DECODE_LABEL = "decode"
"""The bare decode launcher's label in the timings."""
DEFAULT_CHUNK = settings.SHIPPED["gdn"].vk_chunk


def parse_tile(spec):
    """``"default"``, ``"default:c128"`` or ``"R[:RC]xW[:cCW]"`` (rows for decode and the chain,
    rows for the carry when different, warps, keys per chunk) -> ``(rows, carry rows, warps,
    chunk)``, ``None`` for the library's table."""
    parts = spec.split(":c")
    chunk = int(parts[1]) if len(parts) > 1 else DEFAULT_CHUNK
    if parts[0] == "default":
        return (None, None, None, chunk)
    rows, w = parts[0].split("x")
    br, _, brc = rows.partition(":")
    return (int(br), int(brc or br), int(w), chunk)


def tile_settings(tile, ahead=None):
    """``(tag, overrides)``: ``vk_tiles`` set to one tile for every batch (``tile`` from
    ``parse_tile``; rows ``None``: the library's table, decode and carry tiles may differ, as
    shipped), ``vk_chunk`` to its chunk width (``>= kd``: the flat ``[BR, 1, kd]`` tile) and,
    with ``ahead = (R, C, S)``, ``vk_ahead`` to that row for every batch; for
    ``settings.override(**overrides)``."""
    br, brc, w, chunk = tile
    over = dict(vk_chunk=chunk)
    if br is None:
        tag = "default"
    else:
        over["vk_tiles"] = ((1 << 62, br, brc, w),)
        tag = f"{br}:{brc}x{w}" if brc != br else f"{br}x{w}"
    tag = tag if chunk == DEFAULT_CHUNK else f"{tag}c{chunk}"
    if ahead is not None:
        over["vk_ahead"] = ((1 << 62, ahead[0], ahead[1], ahead[1], ahead[2]),)
        tag += "/a" + "-".join(map(str, ahead))
    return tag, over


def kv_block_settings(spec):
    """``"BVxW"`` or ``"BVxW:nopf"`` -> ``(tag, overrides)``: the K-major block ``(BV, W)`` for
    every head size, and the row prefetch off with ``:nopf``; for ``settings.override``."""
    block, _, opt = spec.partition(":")
    if opt not in ("", "nopf"):
        raise ValueError(f"{spec!r}: the only option is ':nopf'")
    bv, w = (int(n) for n in block.split("x"))
    return (f"kv{bv}x{w}" + (":nopf" if opt == "nopf" else ""),
            dict(kv_block=(bv, w), carry_prefetch_rows=opt != "nopf"))


def tiles_main(argv=None):
    ap = argparse.ArgumentParser(prog="tune_gdn.py tiles", description="the GDN family's launch tiles")
    ap.add_argument("--tiles", default="default,4x1,8x1,16x1,8x2,16x2",
                    help="tiles R[:RC]xW[:cCW] (rows, carry rows, warps, keys per chunk), or "
                         "'default[:cCW]' for the library's vk_tiles")
    ap.add_argument("--B", default="1,64,128,256")
    ap.add_argument("--family", default="128:4:bf16,64:8:fp32,256:4:bf16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-kv", action="store_true", help="skip the K-major and FLA baselines")
    ap.add_argument("--ahead", default="default",
                    help="loads ahead R-C-S (input rows ahead for decode and the chain, for the "
                         "verify on either state type, stash rows ahead; the vk_ahead setting for "
                         "every batch), "
                         "or 'default' for the library's table; comma-separated")
    ap.add_argument("--kernels", default="",
                    help="comma-separated kernel names to time (default: all)")
    ap.add_argument("--kv-blocks", default="",
                    help="K-major blocks BVxW[:nopf] to sweep (kv_block; ':nopf' turns "
                         "carry_prefetch_rows off), e.g. 32x1,16x1,32x1:nopf")
    a = ap.parse_args(argv)
    named = {n for n in a.kernels.split(",") if n}
    known = {DECODE_LABEL, V.CHAIN.name, f"{V.CARRY_LAZY.name}:nowb",
             f"{V.CARRY_LAZY.name}:wb", V.CARRY_EAGER.name, V.FLA.name}
    if named - known:
        ap.error(f"--kernels: {', '.join(sorted(named - known))} not among "
                 f"{', '.join(sorted(known))}")
    KERNELS.update(named)
    try:
        tiles = [parse_tile(t) for t in a.tiles.split(",")]
    except ValueError:
        ap.error(f"--tiles: expected 'default[:cCW]' or 'R[:RC]xW[:cCW]' items, got {a.tiles!r}")
    try:
        aheads = [None if s == "default" else tuple(int(n) for n in s.split("-"))
                  for s in a.ahead.split(",")]
    except ValueError:
        ap.error(f"--ahead: expected 'default' or R-C-S ints, comma-separated, got {a.ahead!r}")
    if any(ah is not None and (len(ah) != 3 or min(ah) < 0) for ah in aheads):
        ap.error(f"--ahead: each item 'default' or three ints >= 0 as R-C-S, got {a.ahead!r}")
    for spec in filter(None, a.family.split(",")):
        kd, _, rest = spec.partition(":")
        K, _, dt = rest.partition(":")
        if not (kd.isdigit() and K.isdigit() and int(kd) >= 16 and 1 <= int(K) <= 8
                and dt in DT):
            ap.error(f"--family: items kd:K:dtype (kd >= 16, K 1-8, dtype one of "
                     f"{', '.join(DT)}), got {spec!r}")
    Bs = cli_ints(ap, "--B", a.B)
    cli_out(ap, "--json", a.json)
    try:
        blocks = [kv_block_settings(b) for b in a.kv_blocks.split(",") if b]
    except ValueError as exc:
        ap.error(f"--kv-blocks: expected BVxW[:nopf] items, got {a.kv_blocks!r} ({exc})")
    for flag, overs in (("--tiles", [tile_settings(t, ah)[1] for t in tiles for ah in aheads]),
                        ("--kv-blocks", [o for _, o in blocks])):
        for over in overs:                   # each checked as the settings check it, now
            try:
                with settings.override(**over):
                    pass
            except ValueError as exc:
                ap.error(f"{flag}: {exc}")
    if a.smoke:
        for tile in tiles[:2]:
            for ahead in aheads:
                tag, over = tile_settings(tile, ahead)
                with settings.override(**over):
                    print(tag, check_family(1, 2, 16, 3, torch.float32, B=5) or "bitwise")
        for tag, over in blocks[:2]:
            with settings.override(**over):
                print(tag, check_family(1, 2, 16, 3, torch.float32, B=5, layout="kv")
                      or "bitwise")
        return
    cli_gpu(ap, "tiles times the GDN kernels")
    roof = copy_bandwidth()
    print(f"device {device_name()}, copy roofline {roof:.0f} GB/s")
    res = []

    def record(tag, B, t):
        for name, (gu, bu, nb) in t.items():
            frac = nb / (gu * 1e-6) / 1e9 / roof
            res.append(dict(tile=tag, B=B, kernel=name, graph_us=gu, bench_us=bu, bytes=nb,
                            roof_frac=frac))
            print(f"{tag:>12} B={B:<4} {name:<24} graph {gu:9.1f} us  do_bench {bu:9.1f} us"
                  f"  {100 * frac:5.1f} %")

    def family(tag, layout):
        fam = []
        for spec in filter(None, a.family.split(",")):
            kd, K, dt = spec.split(":")
            bad = check_family(16, 32, int(kd), int(K), DT[dt], layout=layout)
            fam.append(f"{spec}: " + ("bitwise" if not bad else "DIFFERS " + ", ".join(bad[:4])))
        print(f"tile {tag} family: " + "; ".join(fam))
        res.append(dict(tile=tag, family=fam))

    for B in ([] if a.no_kv else Bs):
        record("kv", B, timings(B, "kv"))
    for tag, over in blocks:
        with settings.override(**over):
            family(tag, "kv")
            for B in Bs:
                record(tag, B, timings(B, "kv"))
    for tile in tiles:
        for ahead in aheads:
            tag, over = tile_settings(tile, ahead)
            with settings.override(**over):
                family(tag, "vk")
                for B in Bs:
                    record(tag, B, timings(B, "vk"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)



def carry_case(B, K, HK, HV, D, pend, seed=0):
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, slots=B, dtype=torch.bfloat16, state_layout="kv")
    carry = GdnCarry.empty(B, HV, D, D, device=DEVICE, state_layout="kv")
    gen = generator(seed + 1)
    carry.buf.copy_(torch.randn(carry.buf.shape, generator=gen).mul_(0.1))
    carry.g.copy_(-torch.rand(carry.g.shape, generator=gen))
    k = torch.randn(carry.k.shape, generator=gen)
    carry.k.copy_(k / k.norm(dim=-1, keepdim=True))
    carry.pend.fill_(pend)
    return x, carry


def nbytes(B, K, HK, HV, D, pend, wb):
    row = 4 * (HV * D + HV + HV * D)
    return B * (state_bytes(HV, D, D) * (2 if wb else 1) + (pend + K) * row
                + K * row_io_bytes(HK, HV, D, D, torch.bfloat16))


def run_variant(x, carry0, lazy):
    """The exact verify on copies of the state and stash: ``(call, o, carry, engaged)``. Call
    it, and time what it returns, inside ``settings.override(exact_split_columns=...)``
    (``"exact"``: one program per head; ``"exact-split"``: column blocks across programs)."""
    state, carry = x["state"].clone(), _clone(carry0)
    slot = x["state_indices"]

    def f():
        return gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=slot, form="exact", lazy=lazy, state_layout="kv")
    o, engaged = f()
    return f, o, carry, engaged


def _clone(c):
    out = GdnCarry.empty(c.slots, c.num_v_heads, c.k_dim, c.v_dim, cap=c.cap, device=DEVICE,
                         state_layout=c.state_layout)
    out.buf.copy_(c.buf)
    out.pend.copy_(c.pend)
    return out


def carry_main(argv=None):
    ap = argparse.ArgumentParser(prog="tune_gdn.py carry", description="the exact verify's two launches")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, no timing (CPU check)")
    a = ap.parse_args(argv)
    if not a.smoke:
        cli_gpu(ap, "carry times the exact verify's launches")
    HK, HV, D, K = (1, 2, 16, 2) if a.smoke else (16, 32, 128, 4)
    batches = (2,) if a.smoke else (64, 128)
    roof = copy_bandwidth()
    print(f"device {device_name()}; copy roofline {roof and round(roof)} GB/s", flush=True)
    variants = ("exact", "exact-split")
    for B in batches:
        for pend in (3, 5) if not a.smoke else (1,):
            wb = pend + K > 8
            x, carry0 = carry_case(B, K, HK, HV, D, pend)
            with settings.override(exact_split_columns=False):
                _, o_ref, c_ref, _ = run_variant(x, carry0, True)
            nb = nbytes(B, K, HK, HV, D, pend, wb)
            for form in variants:
                with settings.override(exact_split_columns=form == "exact-split"):
                    f, o, c, engaged = run_variant(x, carry0, True)
                    eo = errors(o, o_ref)["rel_l2"]
                    eu = errors(c.buf, c_ref.buf)["rel_l2"]
                    ok = eo <= 8e-3 and eu <= 1e-4 and bool((engaged == (2 if wb else 1)).all())
                    same = bitwise_equal(o, o_ref) and bitwise_equal(c.buf, c_ref.buf)
                    line = (f"B={B:3d} K={K} pend={pend} wb={int(wb)} {form:11s} "
                            f"o_err {eo:.1e} u_err {eu:.1e} "
                            f"bitwise={int(same)} {'ok' if ok else 'CHECK FAILED'}")
                    if ok and not a.smoke:
                        t = time_launch(f, warmup_ms=10, rep_ms=50)["median_us"]
                        gbps = nb / (t * 1e-6) / 1e9
                        line += f"  {t:8.1f} us  {gbps:6.0f} GB/s  {gbps / roof:5.1%}"
                print(line, flush=True)
            if fla_available():
                run, gva = fla_runner(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      x["state"][x["state_indices"].long()].contiguous(),
                                      scale=D ** -0.5)
                t = time_launch(run, warmup_ms=10, rep_ms=50)["median_us"]
                print(f"B={B:3d} K={K} FLA fused_recurrent (GVA {gva}): {t:8.1f} us", flush=True)


COMMANDS = {"tiles": tiles_main, "carry": carry_main}


def main(argv=None):
    run_subcommand("tune_gdn.py", COMMANDS, argv)

if __name__ == "__main__":
    main()
