"""The benchmark's sides (what each runs) and fairseq trainers built the way fairseq_cli.train builds them.

    ls              ls_transformer_X, ls_label_smoothed_cross_entropy, ls_adam (the plugin as documented)
    fairseq         transformer_X, label_smoothed_cross_entropy, adam (fairseq as users run it)
    fairseq_fused   transformer_X, label_smoothed_cross_entropy, torch's fused AdamW (bench_fused_adamw)
Every other argument is identical.
"""
import os

ARCHS = {"base": "transformer_wmt_en_de", "big": "transformer_vaswani_wmt_en_de_big"}
SIDES = {
    "ls": ("ls_", "ls_label_smoothed_cross_entropy", "ls_adam"),
    "fairseq": ("", "label_smoothed_cross_entropy", "adam"),
    "fairseq_fused": ("", "label_smoothed_cross_entropy", "bench_fused_adamw"),
}


def train_args(data_bin: str, repo: str, side: str, arch: str, device: str, precision: str, max_tokens: int,
               layers=None, extra=()):
    """fairseq-train arguments for one side (see the module docstring); `arch` is fairseq's name (e.g.
    ARCHS["big"]), the ls side gets its ls_ twin."""
    prefix, criterion, optimizer = SIDES[side]
    args = [data_bin, "--user-dir", os.path.join(repo, "fairseq_lightseq"), "--arch", prefix + arch,
            "--share-all-embeddings", "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)",
            "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
            "--criterion", criterion, "--label-smoothing", "0.1", "--max-tokens", str(max_tokens),
            "--seed", "1", "--num-workers", "0", "--log-format", "none"]
    if layers:
        args += ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    if device == "cpu":
        args.append("--cpu")
    if precision in ("fp16", "bf16"):
        args.append("--" + precision)
    return args + list(extra)


def build_trainer(args_list):
    """(cfg, task, trainer) from fairseq-train arguments, as fairseq_cli.train builds them (train split
    loaded). fairseq 0.12's command line maps --bf16 to --tpu; tpu is reset so bf16 runs on this device,
    as `fairseq-train --user-dir fairseq_lightseq` does (fairseq_lightseq/cli_config.py), which this
    script bypasses by building the Trainer itself."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    args.tpu = False
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, Trainer(cfg, task, model, criterion)


def build_model_and_criterion(args_list):
    """(task, model, criterion) without a Trainer (fp32, on the CPU): for counting saved bytes."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=args_list)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)
