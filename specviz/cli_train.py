"""Command line, learned drafters: ``python -m specviz train {dflash,retrace,gate-probe,finetune}``
and ``eval`` -- training DFlash, ReTrace's fusion, the forward gate's state probe and EDR
fine-tuning, and the exact offline evaluation on cached rollouts (docs/methods/dflash.md,
docs/methods/retrace.md, docs/methods/edr.md). Training data: :mod:`specviz.cli_data`; entry point
and error rule (one ``error:`` line): :mod:`specviz.cli`.
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import SpecvizError


def cmd_train_dflash(args) -> int:
    from .models import load_target
    from .train.dflash_setup import TrainConfig
    from .train.dflash_train import train_dflash
    from .train.rollout_store import read_meta

    cfg = TrainConfig(block_size=args.block_size, num_layers=args.layers, steps=args.steps,
                      batch_size=args.batch_size, anchors_per_seq=args.anchors_per_seq,
                      lr=args.lr, warmup=args.warmup, gamma=args.gamma,
                      eval_every=args.eval_every, eval_rollouts=args.eval_rollouts,
                      save_every=args.save_every, seed=args.seed,
                      save_dtype=args.save_dtype, negatives=args.negatives,
                      init=args.init, soft_weight=args.soft_weight).validate()
    meta = read_meta(args.rollouts)  # missing / not a rollouts folder fails before the model loads
    target = load_target(args.model or meta.get("model") or "default", device=args.device,
                         dtype="float32")
    res = train_dflash(target, args.rollouts, args.out, cfg, resume=args.resume, show_bar=True,
                       prefill=args.prefill)
    ev = res["eval"]
    print(f"{res['steps_run']} steps in {res['seconds']:.0f}s ({res['steps_per_s']:.2f} steps/s); "
          f"loss {res['loss_first'] if res['loss_first'] is None else round(res['loss_first'], 3)}"
          f" -> {res['loss_last'] if res['loss_last'] is None else round(res['loss_last'], 3)}"
          + (f"; simulated tau {ev['tau']:.2f} on {ev['rollouts']} eval rollouts" if ev else ""))
    if not res["eval_rollouts"]:
        print("note: no eval rollouts (none fell in the --holdout split), so no tau estimate")
    print(f"drafter written to {res['out']} (use: --method dflash --param checkpoint={res['out']})")
    return 0


def cmd_train_retrace(args) -> int:
    from .drafters.dflash.checkpoint import bundled_checkpoint, load_dflash_checkpoint
    from .models import load_target
    from .train.retrace_train import ReTraceTrainConfig, train_retrace
    from .train.rollout_store import read_meta

    cfg = ReTraceTrainConfig(steps=args.steps, batch_size=args.batch_size,
                             anchors_per_seq=args.anchors_per_seq, lr=args.lr, gamma=args.gamma,
                             eval_every=args.eval_every, eval_sequences=args.eval_sequences,
                             seed=args.seed, backbone_lr=args.backbone_lr).validate()
    for d in list(args.data) + ([args.eval] if args.eval else []):
        read_meta(d)  # a missing / wrong folder fails before the model loads
    target = load_target(args.model, device=args.device, dtype="float32")
    backbone = args.backbone or bundled_checkpoint(target)
    if backbone is None:
        raise SpecvizError("--backbone is needed: no bundled DFlash drafter for this target")
    model = load_dflash_checkpoint(backbone)
    label = "bundled" if not args.backbone else str(args.backbone)
    res = train_retrace(target, model, label, args.data, args.eval, args.out, cfg,
                        resume=args.resume, show_bar=True)
    ev = res["eval"]
    print(f"{res['steps_run']} steps in {res['seconds']:.0f}s; "
          + (f"round r+1 accepted {ev['accepted_fused']:.3f} (ReTrace) vs "
             f"{ev['accepted_backbone']:.3f} (backbone) on {ev['examples']} held-out examples"
             if ev else "no eval"))
    if res.get("best"):
        print(f"best held-out step {res['best']['step']} (round r+1 accepted "
              f"{res['best']['accepted_fused']:.3f}) kept in {res['out']}/best"
              + (" -- the untrained fusion: no trained step beat the backbone, so ReTrace "
                 "from it drafts exactly what its backbone drafts" if res['best']['step'] == 0
                 else ""))
    use = f"{res['out']}/best" if res.get("best") else res["out"]
    print(f"ReTrace written to {res['out']} (use: --method retrace --param checkpoint={use})")
    return 0


def cmd_train_gate_probe(args) -> int:
    from .drafters.dflash.checkpoint import (bundled_checkpoint, load_dflash_checkpoint,
                                             resolve_checkpoint)
    from .drafters.dflash.state_probe import checkpoint_sha256, save_state_probe
    from .models import load_target
    from .train.gate_probe import check_holdout, fit_gate_probe
    from .train.rollout_store import RolloutSet

    check_holdout(args.holdout)   # before the model loads
    sets = [RolloutSet(r) for r in args.rollouts]  # a missing folder fails before the model
    target = load_target(args.model, device=args.device, dtype="float32")
    folder = resolve_checkpoint(args.checkpoint) if args.checkpoint else bundled_checkpoint(target)
    if folder is None:
        raise SpecvizError("--checkpoint is needed: no bundled DFlash drafter for this target")
    model = load_dflash_checkpoint(folder)
    probe = fit_gate_probe(model, target, sets, holdout=args.holdout, seed=args.seed,
                           drafter_sha256=checkpoint_sha256(folder))
    out = save_state_probe(probe, args.out or folder)
    ho = probe.report["held_out"]
    print(f"state probe fitted on {probe.report['fit_states']} states (ridge alpha "
          f"{probe.report['alpha']:g}); held out {ho['states']} states: Pearson r "
          f"{ho['pearson_r']}, at y_hat < {ho['threshold']:.3f} (this machine) it skips "
          f"{ho['skipped']:.0%} (true accepted {ho['accepted_when_skipped']} there vs "
          f"{ho['accepted_when_kept']} kept)")
    print(f"written to {out} (the dflash drafter of {folder} uses it with --param "
          "state_probe=on)")
    return 0


def cmd_eval(args) -> int:
    """``specviz eval``: drafters compared offline on stored rollouts (optionally against real
    runs); eval.json, eval.csv and a table of tau per category."""
    from tqdm.auto import tqdm

    from .analysis.offline_eval import offline_compare, parse_drafters
    from .provenance import provenance

    prov = provenance()    # at the start: the machine's load before the run
    specs = parse_drafters(args.drafters)
    rs, target = _eval_rollouts_and_target(args)
    n = len(rs) if args.limit is None else min(args.limit, len(rs))
    bar = tqdm(total=n, desc="offline EDR", unit="rollout")
    res = offline_compare(target, rs, specs, limit=n, progress=lambda d, t: bar.update(1))
    bar.close()
    real_s = _add_real_runs(res, target, rs, specs, args.real, n) if args.real else None
    res["provenance"] = prov
    out = Path(args.out)
    _write_eval(res, out)
    _print_eval(res, [s.label for s in specs], n, real_s)
    print(f"written to {out}/eval.json and {out}/eval.csv")
    return 0


def _eval_rollouts_and_target(args):
    """(the rollouts of ``--split``, the target that made them -- ``--model`` overrides -- in
    float32); SpecvizError for an empty split."""
    from .models import load_target
    from .train.rollout_store import RolloutSet, read_meta

    meta = read_meta(args.rollouts)
    rs = RolloutSet(args.rollouts, split=None if args.split == "all" else args.split)
    if not len(rs):
        raise SpecvizError(f"{args.rollouts} has no rollouts in split '{args.split}' "
                           "(use --split all)")
    name = args.model or meta.get("model") or "default"
    if str(name).endswith("(embedded)"):  # rollouts made through the library name it so
        name = "default"
    return rs, load_target(name, device=args.device, dtype="float32")


def _add_real_runs(res: dict, target, rs, specs, real: int, n: int) -> float:
    """Add ``real`` real decoding runs per drafter to ``res`` (compared with the offline
    rounds; their time extrapolated to ``n`` rollouts); returns the real runs' seconds."""
    from .analysis.offline_eval import real_rounds

    res["real"] = real_rounds(target, rs, specs, real)
    for lab, r in res["real"].items():
        off = [row[f"edr:{lab}"] for row in res["rows"][:r["rollouts"]]]
        if rs.temperature > 0:   # each real run is a new random rollout: compare means
            r["equals_offline"] = None
            r["mean_rounds_real"] = sum(r["rounds"]) / max(1, len(r["rounds"]))
            r["mean_rounds_offline"] = sum(off) / max(1, len(off))
        else:
            r["equals_offline"] = sum(abs(a - b) < 1e-6 for a, b in zip(r["rounds"], off))
        r["seconds_extrapolated"] = r["seconds"] * n / max(1, r["rollouts"])
    real_s = sum(r["seconds_extrapolated"] for r in res["real"].values())
    res["speedup_offline_vs_real"] = real_s / max(1e-9, sum(res["seconds_offline"].values()))
    return real_s


def _write_eval(res: dict, out: Path) -> None:
    """eval.json (all but the per-rollout rows) and eval.csv (those rows) under ``out``."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps({k: v for k, v in res.items() if k != "rows"},
                                              indent=2) + "\n")
    with open(out / "eval.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(res["rows"][0]))
        w.writeheader()
        w.writerows(res["rows"])


def _print_eval(res: dict, labels: list[str], n: int, real_s: float | None) -> None:
    """tau per category and drafter, the paired change in expected rounds, and the time taken
    offline (and by the real runs, extrapolated to ``n`` rollouts, when there were some)."""
    wid = max(len(lab) for lab in labels) + 6
    print(f"{'category':<16}{'rollouts':>9}" + "".join(f"{lab + ' tau':>{wid}}" for lab in labels))
    for cat, ent in res["summary"].items():
        print(f"{cat:<16}{ent['rollouts']:>9}" + "".join(
            f"{ent['drafters'][lab]['tau']:>{wid}.3f}" for lab in labels))
    for pair, b in res["summary"]["all"]["paired"].items():
        lo, hi = b["rounds_change_ci"]
        print(f"{pair}: expected rounds {b['rounds_change']:+.1%} (95% CI {lo:+.1%} .. {hi:+.1%})")
    print(f"offline: {sum(res['seconds_offline'].values()):.1f}s"
          + (f"; real runs (extrapolated to {n}): {real_s:.1f}s, "
             f"{res['speedup_offline_vs_real']:.1f}x slower" if real_s is not None else ""))


def cmd_train_finetune(args) -> int:
    from .drafters.dflash.checkpoint import bundled_checkpoint, load_dflash_checkpoint
    from .models import load_target
    from .train.edr_train import EDRTrainConfig, finetune
    from .train.rollout_store import read_meta

    cfg = EDRTrainConfig(objective=args.objective, steps=args.steps, batch_size=args.batch_size,
                         num_starts=args.num_starts, lr=args.lr, eval_every=args.eval_every,
                         eval_rollouts=args.eval_rollouts, seed=args.seed).validate()
    read_meta(args.rollouts)
    target = load_target(args.model, device=args.device, dtype="float32")
    init = args.init or bundled_checkpoint(target)
    if init is None:
        raise SpecvizError("--init is needed: no bundled DFlash drafter for this target")
    model = load_dflash_checkpoint(init)
    if args.markov_rank:   # DSpark: the same backbone + a zero-initialised Markov head
        from .drafters.dflash.dspark import add_markov_head

        add_markov_head(model, args.markov_rank, seed=args.seed)
    res = finetune(target, model, args.rollouts, args.eval, args.out, cfg, show_bar=True)
    ev = res["evals"]
    if ev:
        print(f"held-out expected rounds {ev[0]['expected_rounds']:.1f} -> "
              f"{ev[-1]['expected_rounds']:.1f} (tau {ev[0]['tau']:.3f} -> {ev[-1]['tau']:.3f})")
    print(f"drafter written to {res['out']}")
    return 0


def add_train_dflash(tsub) -> None:
    p = tsub.add_parser("dflash", help="train a DFlash drafter on rollouts")
    p.add_argument("--rollouts", required=True,
                   help="rollouts folder: its train split is trained on, its eval split gives "
                   "the simulated held-out tau")
    p.add_argument("--prefill", action="append", default=[],
                   help="more training data, all its rows: a prefill-labelled folder (`train "
                   "prefill`) or another rollouts folder (`train rollouts`); repeatable")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="target (default: the rollouts' model)")
    p.add_argument("--device", default=None)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--layers", type=int, default=2, help="drafter decoder layers")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=8, help="rollouts per step")
    p.add_argument("--anchors-per-seq", type=int, default=16)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=float, default=0.04, help="fraction of steps")
    p.add_argument("--gamma", type=float, default=4.0, help="slot weight decay (7 for B=16)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-rollouts", type=int, default=32)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--save-dtype", default="float32")
    p.add_argument("--init", default="random",
                   help="random, target (the target's top layers) or a DFlash checkpoint folder "
                        "to continue training (same block size and layers)")
    p.add_argument("--negatives", type=int, default=4096,
                   help="sampled softmax: every reply token + N random other words per step "
                        "(-1 = full vocabulary, slower)")
    p.add_argument("--soft-weight", type=float, default=0.0,
                   help="0..1: weight of the target's top-k soft labels in the loss (needs `train "
                   "soft-labels` on every training folder; 0 = hard labels only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.set_defaults(func=cmd_train_dflash)


def add_train_retrace(tsub) -> None:
    p = tsub.add_parser("retrace", help="train a ReTrace fusion on a DFlash backbone (frozen, "
                        "or fine-tuned jointly with --backbone-lr)")
    p.add_argument("--data", action="append", required=True,
                   help="rollouts (train split) or prefill folder; repeatable")
    p.add_argument("--eval", default=None, help="rollouts folder whose eval split is held out")
    p.add_argument("--backbone", default=None, help="DFlash checkpoint (default: the bundled)")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    p.add_argument("--anchors-per-seq", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=4.0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-sequences", type=int, default=24)
    p.add_argument("--backbone-lr", type=float, default=0.0,
                   help="> 0: fine-tune the backbone jointly at this learning rate (saved in "
                        "the checkpoint's backbone/ folder); 0 = frozen backbone (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.set_defaults(func=cmd_train_retrace)


def add_train_gate_probe(tsub) -> None:
    p = tsub.add_parser("gate-probe", help="fit the forward gate's state probe of a DFlash "
                        "drafter (predicts its accepted length from the target's state)")
    p.add_argument("--rollouts", action="append", required=True,
                   help="greedy rollouts of prompts the drafter was NOT trained on; repeatable")
    p.add_argument("--checkpoint", default=None, help="DFlash checkpoint (default: the bundled)")
    p.add_argument("--out", default=None,
                   help="folder for state_probe.safetensors (default: the checkpoint's)")
    p.add_argument("--holdout", type=float, default=0.2,
                   help="share of rollouts held out to choose the ridge penalty and report")
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train_gate_probe)


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="offline paired comparison of drafters on cached rollouts "
                       "(exact expected decoding rounds, no speculative decoding)")
    p.add_argument("--drafters", required=True,
                   help="comma-separated METHOD or METHOD:CHECKPOINT (pld, dflash, "
                   "dflash:runs/x); the first is the reference of the paired differences")
    p.add_argument("--rollouts", required=True, help="a rollouts folder (train rollouts)")
    p.add_argument("--split", default="eval", choices=["eval", "train", "all"])
    p.add_argument("--limit", type=int, default=None, help="first N rollouts")
    p.add_argument("--real", type=int, default=0,
                   help="also run real greedy speculative decoding on the first N rollouts "
                   "(time and exactness check)")
    p.add_argument("--model", default=None, help="target (default: the rollouts' model)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="eval-out")
    p.set_defaults(func=cmd_eval)


def add_train_finetune(tsub) -> None:
    p = tsub.add_parser("finetune", help="fine-tune a DFlash drafter with EDR (exact TD "
                        "gradient), decay-CE or the survival surrogate")
    p.add_argument("--objective", default="edr", choices=["edr", "decay_ce", "survival"])
    p.add_argument("--init", default=None, help="DFlash checkpoint to start from (default: "
                   "the bundled drafter)")
    p.add_argument("--rollouts", required=True, help="greedy rollouts (train split)")
    p.add_argument("--eval", default=None, help="rollouts whose eval split is held out")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-starts", type=int, default=48,
                   help="round starts per rollout (edr: drawn by occupancy)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-rollouts", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markov-rank", type=int, default=0,
                   help="> 0: add a DSpark Markov head of this rank (starts as the DFlash "
                        "drafter; use the result with --method dspark)")
    p.set_defaults(func=cmd_train_finetune)
