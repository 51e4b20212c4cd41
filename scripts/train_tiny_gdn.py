"""Train the small Qwen3-Next-style model of the tokens notebook from a seed, and save it.

``pmll_lab.models.tiny_gdn`` does the work (sizes, settings, data, held-out loss, byte-unigram
baseline); this script writes ``model.safetensors`` (bf16 weights) and ``provenance.json``
(config, training settings and per-step loss, held-out loss and baseline, the standard-library
manifest, versions, device, wall time) into ``--out`` (default: the committed checkpoint
directory of the size, ``pmll_lab/models/checkpoints/tiny_gdn_<size>/``).

Usage: ``python scripts/train_tiny_gdn.py --size cpu`` (CPU sibling, a few minutes on two
cores); ``python scripts/train_tiny_gdn.py --size gpu --out $OUT/tiny_gdn_gpu`` on a GPU (FLA's
chunked delta rule where fla-core is installed). ``--steps N`` overrides the step count (a
smoke run, written only to an ``--out`` of its own).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pmll_lab  # noqa: F401  (first: picks the device)

from pmll_lab.models import tiny_gdn as T


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=tuple(T.SIZES), default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="checkpoint directory (default: the committed "
                    "one of --size)")
    ap.add_argument("--steps", type=int, default=None, help="override the training steps")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--log-every", args.log_every)):
        if value is not None and value < 1:
            ap.error(f"{flag}: must be >= 1, got {value}")
    if args.out is None and (args.steps is not None or args.seed != 0):
        flag = "--steps" if args.steps is not None else "--seed"
        ap.error(f"{flag}: a run of other steps or seed than the committed checkpoint's (seed 0) "
                 "does not replace it; give --out DIR")
    if args.device not in (None, "cpu", "cuda"):
        ap.error(f"--device: cpu or cuda, got {args.device!r}")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            ap.error("--device: cuda asked for, but no GPU is visible")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out: {args.out} is a file, not a folder")
    over = {} if args.steps is None else {"steps": args.steps}
    model, prov = T.train(args.size, seed=args.seed, device=args.device,
                          log_every=args.log_every, **over)
    if args.steps is not None:
        prov["command"] += f" --steps {args.steps}"
    out = T.save(model, prov, args.out or T.checkpoint_dir(args.size))
    keep = ("size", "seed", "params", "heldout_loss_nats", "unigram_nats",
            "heldout_bits_per_byte", "unigram_bits_per_byte", "train_seconds", "device",
            "gdn_kernel")
    print(json.dumps({k: prov[k] for k in keep} | {"out": str(out)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
