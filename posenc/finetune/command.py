"""``posenc finetune MODEL --method yarn --target-length L --out DIR``: extend a checkpoint's context by a short
fine-tune with PoSE position ids and LoRA adapters (docs/finetune.md). The flags are FinetuneSettings' fields."""

from __future__ import annotations

from posenc._internal.errors import ConfigError
from posenc._internal.flags import add_shared, integer, names, number
from posenc.finetune.settings import DEFAULT_CHUNK_LENGTH, DEFAULT_TARGET_MODULES, SAVE_DTYPES, FinetuneSettings

# messages name settings by their keyword ("target_length: ..."): shown as the parser's flags, no other names
FLAG_ALIASES: dict[str, str] = {}
HELP = "Extend a model's context by fine-tuning: PoSE position ids, LoRA adapters, a merged transformers folder."


def add_arguments(parser) -> None:
    parser.add_argument("model", help="a local transformers causal LM folder or a .gguf file")
    add_shared(parser, "method", default="yarn", help="the frequency method written into the config (default yarn)")
    add_shared(parser, "target_length", required=True)
    add_shared(parser, "out", required=True, help="folder for model/, adapters/, finetune.json and the checkpoint")
    add_shared(parser, "data", default=None, help="training text: a file or folder, or prose (the SmolLM2 study's "
               "English prose, from $SMOLLM2_PROSE; default: the CPython stdlib); its training split is trained on, "
               "its validation split gives the held-out loss")
    pose = parser.add_argument_group("PoSE")
    pose.add_argument("--chunk-length", type=integer, default=DEFAULT_CHUNK_LENGTH, metavar="N",
                      help=f"training window in tokens, capped at the trained length (default {DEFAULT_CHUNK_LENGTH})")
    pose.add_argument("--chunks", type=integer, default=2, metavar="N",
                      help="pieces of a window, each with its own position skip, drawn by the paper's uniform rule "
                      "(default 2, the paper's)")
    lora = parser.add_argument_group("LoRA")
    lora.add_argument("--rank", type=integer, default=8, metavar="R", help="adapter rank (default 8)")
    lora.add_argument("--alpha", type=number, default=16.0, help="adapter scale alpha: B A is scaled by "
                      "alpha / rank (default 16)")
    lora.add_argument("--target-modules", type=names, default=list(DEFAULT_TARGET_MODULES), metavar="NAME,...",
                      help=f"layers given adapters (default {','.join(DEFAULT_TARGET_MODULES)})")
    lora.add_argument("--train-embeddings-norms", action="store_true",
                      help="also train the embeddings and every norm (LongLoRA)")
    lora.add_argument("--full", action="store_true", help="train every weight instead of adapters")
    opt = parser.add_argument_group("training")
    opt.add_argument("--steps", type=integer, default=100, metavar="N", help="optimizer steps (default 100)")
    opt.add_argument("--batch-size", type=integer, default=1, metavar="N", help="windows per step (default 1)")
    opt.add_argument("--lr", type=number, default=2e-4, help="peak learning rate of AdamW (default 2e-4)")
    opt.add_argument("--warmup", type=integer, default=10, metavar="N",
                     help="linear warmup steps before the cosine decay (default 10)")
    opt.add_argument("--weight-decay", type=number, default=0.0, help="AdamW's weight decay on matrices (default 0)")
    opt.add_argument("--eval-every", type=integer, default=50, metavar="K",
                     help="held-out loss at --target-length every K steps and at the end (default 50)")
    opt.add_argument("--eval-windows", type=integer, default=1, metavar="N",
                     help="held-out windows of --target-length tokens scored each time (default 1)")
    opt.add_argument("--checkpoint-every", type=integer, default=25, metavar="N",
                     help="checkpoint every N steps and at the end (0: at the end only; default 25)")
    opt.add_argument("--bf16", action="store_true", help="bf16 autocast of the forward pass and loss")
    opt.add_argument("--gradient-checkpointing", action="store_true",
                     help="recompute activations in the backward pass: less memory, about a third more time")
    opt.add_argument("--save-dtype", choices=SAVE_DTYPES, default="auto",
                     help="the merged model's weights on disk (default auto: the source model's dtype)")
    add_shared(parser, "seed", default=0)
    add_shared(parser, "resume", help="continue the fine-tune in --out from its checkpoint, step for step")
    add_shared(parser, "overwrite", help="start over in an --out that holds an earlier fine-tune")
    add_shared(parser, "threads", default=None)
    add_shared(parser, "no_progress")


def settings_from(args) -> FinetuneSettings:
    return FinetuneSettings(
        model=args.model, target_length=args.target_length, out=args.out, method=args.method, data=args.data,
        chunk_length=args.chunk_length, chunks=args.chunks, rank=args.rank, alpha=args.alpha,
        target_modules=tuple(args.target_modules), train_embeddings_norms=args.train_embeddings_norms,
        full=args.full, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
        weight_decay=args.weight_decay, eval_every=args.eval_every, eval_windows=args.eval_windows,
        checkpoint_every=args.checkpoint_every, bf16=args.bf16, gradient_checkpointing=args.gradient_checkpointing,
        save_dtype=args.save_dtype, seed=args.seed, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress)


def run(args) -> int:
    import torch

    from posenc.finetune.run import finetune
    from posenc.hf.eval.settings import check_threads

    threads = check_threads(args.threads)
    if args.resume and args.overwrite:
        raise ConfigError("resume: --resume continues the fine-tune in --out and --overwrite starts it over; "
                          "pass one of them")
    if threads:
        torch.set_num_threads(threads)
    doc = finetune(settings_from(args))
    last = doc["final_validation_loss"]
    rate = doc["tokens_per_s"]
    print(f"finetune: {doc['steps']} steps, {doc['tokens']} tokens in {doc['train_s']:.1f} s"
          + (f" ({rate:.0f} tokens/s)" if rate else "")
          + (f"; held-out loss at {args.target_length}: {last:.4f}" if last is not None else ""))
    print(f"wrote {args.out}/model{'' if args.full else ' (adapters merged)'}, "
          + ("" if args.full else f"{args.out}/adapters, ") + f"{args.out}/finetune.json")
    return 0


def finetune_main(argv: list[str] | None = None) -> int:
    from posenc.hf.command import run_command

    return run_command("finetune", add_arguments, run, argv, flag_aliases=FLAG_ALIASES)

